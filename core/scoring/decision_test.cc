// Properties of the method (docs/method.md, "What the tests prove") over whole layers, on seeded
// random and adversarial inputs.
#include "core/scoring/decision.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/scoring/entropy.h"
#include "core/scoring/metrics.h"
#include "core/scoring/pages.h"
#include "core/scoring/weights.h"
#include "core/testing/policies.h"
#include "core/testing/random_rows.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kSeed = 20261129;

struct Case {
  int query_heads;
  int kv_groups;
  int64_t tokens;
  int page_size;
  int64_t quota;
};

// Random geometries including the edges: MHA (r = 1), MQA (G = 1), T < B, T not a multiple of
// B, K > n.
Case RandomCase(std::mt19937_64& rng) {
  static constexpr int kGroups[] = {1, 2, 4, 8};
  static constexpr int kRatios[] = {1, 2, 3, 4, 6, 8};
  static constexpr int kPageSizes[] = {1, 4, 8, 16, 32};
  Case c;
  c.kv_groups = kGroups[rng() % 4];
  c.query_heads = c.kv_groups * kRatios[rng() % 6];
  c.page_size = kPageSizes[rng() % 5];
  c.tokens = 1 + static_cast<int64_t>(rng() % 700);
  const int64_t pages = PageCount(c.tokens, c.page_size);
  c.quota = 1 + static_cast<int64_t>(rng() % (pages + 2));
  return c;
}

absl::StatusOr<LayerDecision> Decide(absl::string_view policy, const std::vector<float>& data,
                                     const Case& c, const PolicyOptions& options = {}) {
  PolicyOptions with_page = options;
  with_page.page_size = c.page_size;
  LayerRequest request;
  request.statistic = *StatisticView::Create(data.data(), DType::kFloat32, c.query_heads, c.tokens);
  request.query_heads = c.query_heads;
  request.kv_groups = c.kv_groups;
  request.tokens = c.tokens;
  request.quota_pages = c.quota;
  return DecideLayer(**FindPolicy(policy), with_page, request);
}

TEST(DecisionPropertyTest, PooledPoliciesKeepExactlyTheQuota) {
  std::mt19937_64 rng(kSeed);
  for (int trial = 0; trial < 300; ++trial) {
    const Case c = RandomCase(rng);
    const std::vector<float> data = testing::MixedRows(c.query_heads, c.tokens, rng);
    const int64_t expected = std::min(c.quota, PageCount(c.tokens, c.page_size));
    for (const absl::string_view name : testing::ExactBudgetPolicyNames()) {
      ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision decision, Decide(name, data, c));
      for (const GroupDecision& group : decision.groups) {
        ASSERT_EQ(static_cast<int64_t>(group.kept_pages.size()), expected)
            << name << " seed " << kSeed << " trial " << trial;
        ASSERT_TRUE(std::is_sorted(group.kept_pages.begin(), group.kept_pages.end()));
        ASSERT_EQ(std::adjacent_find(group.kept_pages.begin(), group.kept_pages.end()),
                  group.kept_pages.end());
        // Measured, not assumed: the pooled group is one selection, so its UOR is 1.
        EXPECT_DOUBLE_EQ(
            UnionOverheadRatio(std::vector<std::vector<int32_t>>{group.kept_pages}, expected), 1.0);
      }
    }
  }
}

// A decision after earlier evictions selects among the live pages only and keeps
// exactly min(K, live pages) per group, with the protections still applied to live pages.
TEST(DecisionPropertyTest, DecodeTimeDecisionsKeepOnlyLivePagesAndExactlyTheQuota) {
  std::mt19937_64 rng(kSeed + 7);
  for (int trial = 0; trial < 300; ++trial) {
    const Case c = RandomCase(rng);
    const std::vector<float> data = testing::MixedRows(c.query_heads, c.tokens, rng);
    const int64_t n = PageCount(c.tokens, c.page_size);
    std::vector<uint8_t> live(static_cast<size_t>(n * c.kv_groups));
    for (uint8_t& page : live) page = rng() % 3 != 0 ? 1 : 0;
    PolicyOptions options;
    options.page_size = c.page_size;
    options.protections.tail_page = true;
    options.protections.recent_pages = static_cast<int>(rng() % 3);
    for (const absl::string_view name : testing::ExactBudgetPolicyNames()) {
      LayerRequest request;
      request.statistic =
          *StatisticView::Create(data.data(), DType::kFloat32, c.query_heads, c.tokens);
      request.query_heads = c.query_heads;
      request.kv_groups = c.kv_groups;
      request.tokens = c.tokens;
      request.quota_pages = c.quota;
      request.live_pages = live;
      ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision decision,
                                   DecideLayer(**FindPolicy(name), options, request));
      for (int g = 0; g < c.kv_groups; ++g) {
        const std::span<const uint8_t> group_live(live.data() + g * n, static_cast<size_t>(n));
        const int64_t live_count = std::count(group_live.begin(), group_live.end(), 1);
        const std::vector<int32_t>& kept = decision.groups[static_cast<size_t>(g)].kept_pages;
        ASSERT_EQ(static_cast<int64_t>(kept.size()), std::min(c.quota, live_count))
            << name << " trial " << trial << " group " << g;
        for (const int32_t page : kept) ASSERT_EQ(group_live[page], 1) << name << " page " << page;
        if (group_live[n - 1] != 0) {  // the live tail page is protected
          EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), n - 1)) << name;
        }
      }
    }
  }
  LayerRequest request;
  const std::vector<float> data(2 * 64, 0.5f);
  const std::vector<uint8_t> wrong(3, 1);
  request.statistic = *StatisticView::Create(data.data(), DType::kFloat32, 2, 64);
  request.query_heads = 2;
  request.kv_groups = 1;
  request.tokens = 64;
  request.quota_pages = 1;
  request.live_pages = wrong;  // 4 pages of 16
  EXPECT_THAT(DecideLayer(**FindPolicy("mean"), {}, request),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("live_pages")));
}

TEST(DecisionPropertyTest, ShadowUnionOverheadStaysInsideItsBounds) {
  std::mt19937_64 rng(kSeed + 1);
  for (int trial = 0; trial < 300; ++trial) {
    const Case c = RandomCase(rng);
    const std::vector<float> data = testing::MixedRows(c.query_heads, c.tokens, rng);
    ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision decision, Decide("page_entrokv", data, c));
    ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision independent, Decide("head_independent", data, c));
    const int r = c.query_heads / c.kv_groups;
    const int64_t n = PageCount(c.tokens, c.page_size);
    const int64_t k = std::min(c.quota, n);
    for (size_t g = 0; g < decision.groups.size(); ++g) {
      const double uor = *decision.groups[g].shadow_uor;
      const double mean_j = 1.0 - *decision.groups[g].disagreement;
      EXPECT_GE(uor, 1.0 - 1e-12) << "trial " << trial;
      EXPECT_LE(uor, std::min<double>(r, static_cast<double>(n) / k) + 1e-12) << "trial " << trial;
      EXPECT_GE(uor, BonferroniLowerBound(r, mean_j) - 1e-9) << "trial " << trial;
      if (r == 2) {
        EXPECT_NEAR(uor, 2.0 / (2.0 - *decision.groups[g].disagreement), 1e-9) << "trial " << trial;
      }
      if (r >= 2) {
        EXPECT_GE(uor, SandwichBounds(r, mean_j, mean_j).lower - 1e-9) << "trial " << trial;
      }
      // The head_independent policy keeps exactly the shadow's union.
      EXPECT_NEAR(static_cast<double>(independent.groups[g].kept_pages.size()) / k, uor, 1e-12);
    }
  }
}

TEST(DecisionPropertyTest, PageOfTheLargestPooledScoreIsAlwaysKept) {
  std::mt19937_64 rng(kSeed + 2);
  for (int trial = 0; trial < 300; ++trial) {
    const Case c = RandomCase(rng);
    const std::vector<float> data = testing::MixedRows(c.query_heads, c.tokens, rng);
    ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision decision, Decide("page_entrokv", data, c));
    const int r = c.query_heads / c.kv_groups;
    for (int g = 0; g < c.kv_groups; ++g) {
      std::vector<std::span<const float>> rows;
      for (int i = 0; i < r; ++i) rows.emplace_back(data.data() + (g * r + i) * c.tokens, c.tokens);
      std::vector<float> pooled(static_cast<size_t>(c.tokens));
      PoolRows(rows, decision.groups[g].weights, pooled);
      const auto argmax = std::max_element(pooled.begin(), pooled.end()) - pooled.begin();
      const int32_t page = static_cast<int32_t>(argmax / c.page_size);
      EXPECT_TRUE(std::binary_search(decision.groups[g].kept_pages.begin(),
                                     decision.groups[g].kept_pages.end(), page))
          << "trial " << trial;
    }
  }
}

TEST(DecisionPropertyTest, HalfPrecisionDecidesLikeItsFloat32Widening) {
  std::mt19937_64 rng(kSeed + 3);
  for (int trial = 0; trial < 100; ++trial) {
    const Case c = RandomCase(rng);
    const std::vector<float> data = testing::MixedRows(c.query_heads, c.tokens, rng);
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<uint16_t> half(data.size());
      std::vector<float> widened(data.size());
      for (size_t i = 0; i < data.size(); ++i) {
        half[i] = dtype == DType::kFloat16 ? FloatToFloat16(data[i]) : FloatToBFloat16(data[i]);
        widened[i] = dtype == DType::kFloat16 ? Float16ToFloat(half[i]) : BFloat16ToFloat(half[i]);
      }
      LayerRequest request;
      request.statistic = *StatisticView::Create(half.data(), dtype, c.query_heads, c.tokens);
      request.query_heads = c.query_heads;
      request.kv_groups = c.kv_groups;
      request.tokens = c.tokens;
      request.quota_pages = c.quota;
      PolicyOptions options;
      options.page_size = c.page_size;
      ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision from_half,
                                   DecideLayer(**FindPolicy("page_entrokv"), options, request));
      ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision from_wide, Decide("page_entrokv", widened, c));
      for (size_t g = 0; g < from_half.groups.size(); ++g) {
        EXPECT_EQ(from_half.groups[g].kept_pages, from_wide.groups[g].kept_pages)
            << "trial " << trial;
        EXPECT_EQ(from_half.groups[g].weights, from_wide.groups[g].weights);
      }
    }
  }
}

// One retrieval head with mass 1 - eps on a needle token (rest uniform), r - 1 uniform heads.
std::vector<float> NeedleGroup(int r, int64_t tokens, int64_t needle, double needle_mass) {
  std::vector<float> data(static_cast<size_t>(r * tokens), static_cast<float>(1.0 / tokens));
  float* retrieval = data.data();
  std::fill(retrieval, retrieval + tokens, static_cast<float>((1.0 - needle_mass) / (tokens - 1)));
  retrieval[needle] = static_cast<float>(needle_mass);
  return data;
}

TEST(DecisionNeedleTest, MeanPoolingDilutesTheNeedleAndEntropyPoolingKeepsIt) {
  const int r = 8;
  const double tau = 0.5;
  for (const int64_t tokens : {4096, 32768, 131072}) {
    const int64_t needle = tokens / 3;
    const std::vector<float> data = NeedleGroup(r, tokens, needle, 0.95);
    Case c{r, 1, tokens, 16, 4};
    PolicyOptions options;
    options.tau = tau;
    ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision pooled, Decide("page_entrokv", data, c, options));
    const std::vector<double>& w = pooled.groups[0].weights;
    double at_needle = 0.0;
    for (int h = 0; h < r; ++h) at_needle += w[h] * data[h * tokens + needle];
    // The retrieval head's sink-isolated H2 is eta_ret (about -2 ln 0.95); the bound with its
    // own eta must hold.
    const double eta = SinkIsolatedEntropy(std::span<const float>(data.data(), tokens), 4, 2.0);
    const double delta = NeedleBoundDelta(tokens, r, tau, eta, 0.95, 4);
    // Float32 rounding of the inputs, not a constant: 1e-6 exceeded delta itself.
    EXPECT_GE(at_needle, 0.95 - delta - Float32PoolingTolerance(0.95)) << "T " << tokens;
    double mean_at_needle = 0.0;
    for (int h = 0; h < r; ++h) mean_at_needle += data[h * tokens + needle] / r;
    EXPECT_NEAR(mean_at_needle, MeanPooledNeedle(tokens, r, 0.95), 1e-6) << "T " << tokens;
    if (tokens == 131072) {
      EXPECT_NEAR(mean_at_needle, 0.11875, 1e-5);  // the method's number for r = 8
    }
    // Both keep the needle page here (nothing competes), but pooling keeps ~8x the score.
    EXPECT_TRUE(std::binary_search(pooled.groups[0].kept_pages.begin(),
                                   pooled.groups[0].kept_pages.end(),
                                   static_cast<int32_t>(needle / 16)));
    EXPECT_GT(at_needle / mean_at_needle, 7.9);
  }
}

TEST(DecisionNeedleTest, AllSinkHeadGetsNoWeightNextToARetrievalHead) {
  // A degenerate head (all mass on the first token, as BOS sink heads do) is maximally diffuse
  // after isolation.
  const int64_t tokens = 1024;
  std::vector<float> data(2 * tokens, 0.0f);
  data[0] = 1.0f;
  data[tokens + 500] = 1.0f;
  Case c{2, 1, tokens, 16, 1};
  ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision decision, Decide("page_entrokv", data, c));
  EXPECT_LT(decision.groups[0].weights[0], 1e-5);
  EXPECT_EQ(decision.groups[0].kept_pages, std::vector<int32_t>{500 / 16});
  // Raw entropy is fooled: the sink head looks as focused as the retrieval head.
  ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision raw, Decide("raw_entropy", data, c));
  EXPECT_NEAR(raw.groups[0].weights[0], 0.5, 1e-9);
}

TEST(DecisionValidationTest, RejectsBadInputNamingTheField) {
  std::vector<float> data(12 * 10, 0.1f);
  const Policy& policy = **FindPolicy("page_entrokv");
  LayerRequest request;
  request.statistic = *StatisticView::Create(data.data(), DType::kFloat32, 12, 10);
  request.query_heads = 12;
  request.kv_groups = 5;
  request.tokens = 10;
  request.quota_pages = 1;
  EXPECT_THAT(DecideLayer(policy, {}, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiple of kv_groups")));
  request.kv_groups = 2;
  request.query_heads = 6;
  EXPECT_THAT(DecideLayer(policy, {}, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[H_Q, T]")));
  request.query_heads = 12;
  request.tokens = 11;
  EXPECT_THAT(DecideLayer(policy, {}, request),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("11")));
  request.tokens = 10;
  request.quota_pages = 0;
  EXPECT_THAT(DecideLayer(policy, {}, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("quota_pages")));
  request.quota_pages = 1;
  PolicyOptions options;
  options.tau = -1;
  EXPECT_THAT(DecideLayer(policy, options, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tau")));
  data[37] = -0.5f;
  EXPECT_THAT(DecideLayer(policy, {}, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head 3, token 7")));
  data[37] = 0.1f;
  const std::vector<double> weights(5, 0.2);
  request.cached_weights = weights;
  EXPECT_THAT(DecideLayer(policy, {}, request),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cached_weights")));
  request.cached_weights = {};
  request.statistic.reset();
  EXPECT_THAT(DecideLayer(policy, {}, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs one")));
  EXPECT_TRUE(DecideLayer(**FindPolicy("streaming"), {}, request).ok());
}

}  // namespace
}  // namespace entrokv
