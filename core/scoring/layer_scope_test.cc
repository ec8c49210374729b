// Layer scope (docs/architecture.md §3.9): the combined score's properties (exact cardinality,
// deterministic ties, the page of the largest combined score kept), one set for every group, the
// group scope's union as the shadow, and the fused path's bits, on seeded random and adversarial
// inputs.
#include "core/scoring/layer_scope.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/scoring/decision.h"
#include "core/scoring/fused_scorer.h"
#include "core/scoring/pages.h"
#include "core/testing/random_rows.h"
#include "core/testing/status_matchers.h"
#include "core/util/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kSeed = 20261130;
constexpr LayerCombine kCombines[] = {LayerCombine::kMassMax, LayerCombine::kEntropyWeighted,
                                      LayerCombine::kMassMean};

std::vector<std::span<const float>> Spans(const std::vector<std::vector<float>>& rows) {
  return {rows.begin(), rows.end()};
}

// [G][n] page scores: random, coarse (ties), all zero, one spike.
std::vector<std::vector<float>> RandomScores(std::mt19937_64& rng, int groups, int64_t pages) {
  std::vector<std::vector<float>> scores(static_cast<size_t>(groups));
  for (auto& row : scores) {
    const int kind = static_cast<int>(rng() % 4);
    for (int64_t b = 0; b < pages; ++b) {
      const double u = testing::Uniform01(rng);
      row.push_back(kind == 0   ? static_cast<float>(u)
                    : kind == 1 ? static_cast<float>(rng() % 3)
                    : kind == 2 ? 0.0f
                                : (b == pages / 2 ? 5.0f : 1e-3f * static_cast<float>(u)));
    }
  }
  return scores;
}

LayerDecision GroupScopeDecision(const std::vector<std::vector<int32_t>>& kept, int64_t pages,
                                 int64_t quota) {
  LayerDecision decision;
  decision.page_count = pages;
  decision.quota_pages = quota;
  for (const auto& set : kept) {
    GroupDecision group;
    group.kept_pages = set;
    decision.groups.push_back(std::move(group));
  }
  return decision;
}

TEST(LayerScopeTest, NamesRoundTripAndUnknownNamesAreRejected) {
  for (const SelectionScope scope : {SelectionScope::kGroup, SelectionScope::kLayer}) {
    ENTROKV_ASSERT_OK_AND_ASSIGN(SelectionScope parsed,
                                 ParseSelectionScope("scope", SelectionScopeName(scope)));
    EXPECT_EQ(parsed, scope);
  }
  for (const LayerCombine combine : kCombines) {
    ENTROKV_ASSERT_OK_AND_ASSIGN(LayerCombine parsed,
                                 ParseLayerCombine("combine", LayerCombineName(combine)));
    EXPECT_EQ(parsed, combine);
  }
  EXPECT_THAT(ParseSelectionScope("request.scope", "head"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("request.scope")));
  EXPECT_THAT(ParseLayerCombine("combine", "sum"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mass_max")));
}

// The selection's properties for the combined score, every combine: exactly min(K, n) pages, one
// set shared by every group, the page of the largest combined score kept, the shadow = the groups'
// union.
TEST(LayerScopeTest, CombinedSelectionIsExactAndKeepsTheLargestCombinedScore) {
  std::mt19937_64 rng(kSeed);
  for (int trial = 0; trial < 500; ++trial) {
    const int groups = 1 + static_cast<int>(rng() % 8);
    const int64_t pages = 1 + static_cast<int64_t>(rng() % 300);
    const int64_t quota = 1 + static_cast<int64_t>(rng() % (pages + 2));
    const LayerCombine combine = kCombines[trial % 3];
    SCOPED_TRACE(::testing::Message() << "seed " << kSeed << " trial " << trial << " G " << groups
                                      << " n " << pages << " K " << quota);
    const std::vector<std::vector<float>> scores = RandomScores(rng, groups, pages);
    std::vector<std::vector<int32_t>> per_group;
    for (const auto& row : scores) per_group.push_back(SelectTopPages(row, quota));
    LayerDecision decision = GroupScopeDecision(per_group, pages, quota);
    ApplyLayerScope(Spans(scores), combine, PolicyOptions{}, pages * 16, {}, &decision);

    const int64_t expected = std::min(quota, pages);
    EXPECT_EQ(decision.scope, SelectionScope::kLayer);
    EXPECT_EQ(decision.union_pages, expected);
    EXPECT_EQ(decision.group_scope_union_pages,
              static_cast<int64_t>(UnionOfPages(per_group).size()));
    const std::vector<int32_t>& kept = decision.groups.front().kept_pages;
    ASSERT_EQ(static_cast<int64_t>(kept.size()), expected);
    ASSERT_TRUE(std::is_sorted(kept.begin(), kept.end()));
    for (const GroupDecision& group : decision.groups) EXPECT_EQ(group.kept_pages, kept);

    std::vector<float> combined;
    std::vector<double> weights;
    CombineGroupScores(Spans(scores), combine, PolicyOptions{}, &combined, &weights);
    EXPECT_EQ(kept, SelectTopPagesBySort(combined, quota));  // ties to the lower page
    const auto largest = std::max_element(combined.begin(), combined.end()) - combined.begin();
    EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), static_cast<int32_t>(largest)));
    if (combine == LayerCombine::kMassMax) {
      EXPECT_TRUE(weights.empty());
    } else {
      ASSERT_EQ(weights.size(), static_cast<size_t>(groups));
      double sum = 0.0;
      for (const double w : weights) sum += w;
      EXPECT_NEAR(sum, 1.0, 1e-12);
    }
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(LayerScopeTest, TiesGoToTheLowerPage) {
  const std::vector<std::vector<float>> scores = {{1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2}};
  for (const LayerCombine combine : kCombines) {
    LayerDecision decision = GroupScopeDecision({{0, 1, 2}, {0, 1, 2}}, 6, 3);
    ApplyLayerScope(Spans(scores), combine, PolicyOptions{}, 6 * 16, {}, &decision);
    EXPECT_THAT(decision.groups[1].kept_pages, ::testing::ElementsAre(0, 1, 2))
        << LayerCombineName(combine);
  }
}

// Mass normalisation: a group whose statistic is 1000x larger does not outvote the other; max
// keeps each group's best page where the sum would give both to the larger one's runner-ups.
TEST(LayerScopeTest, MassMaxKeepsEveryGroupsBestPage) {
  const std::vector<std::vector<float>> scores = {{1000, 900, 800, 0, 0, 0}, {0, 0, 0, 0, 0, 1}};
  LayerDecision decision = GroupScopeDecision({{0, 1}, {5, 0}}, 6, 2);
  ApplyLayerScope(Spans(scores), LayerCombine::kMassMax, PolicyOptions{}, 6 * 16, {}, &decision);
  EXPECT_THAT(decision.groups[0].kept_pages, ::testing::ElementsAre(0, 5));
  EXPECT_EQ(decision.group_scope_union_pages, 3);
}

// The entropy-weighted sum gives the concentrated group the larger weight.
TEST(LayerScopeTest, EntropyWeightsFavourTheConcentratedGroup) {
  std::vector<float> diffuse(64, 1.0f);
  std::vector<float> spiky(64, 0.01f);
  spiky[40] = 10.0f;
  const std::vector<std::vector<float>> scores = {diffuse, spiky};
  std::vector<float> combined;
  std::vector<double> weights;
  CombineGroupScores(Spans(scores), LayerCombine::kEntropyWeighted, PolicyOptions{}, &combined,
                     &weights);
  ASSERT_EQ(weights.size(), 2u);
  EXPECT_GT(weights[1], 0.9);
  EXPECT_EQ(std::max_element(combined.begin(), combined.end()) - combined.begin(), 40);
}

// sink_tokens up to 2^31 - 1 is valid (it once overflowed the sink page count): every page then
// holds a sink, as with sink_tokens equal to the tokens there are, and counting its pages must
// not overflow.
TEST(LayerScopeTest, TheLargestSinkCountIsolatesEveryPageWithoutOverflow) {
  std::mt19937_64 rng(kSeed);
  const std::vector<std::vector<float>> scores = RandomScores(rng, 4, 64);
  PolicyOptions largest;
  largest.sink_tokens = std::numeric_limits<int32_t>::max();
  PolicyOptions every_token;
  every_token.sink_tokens = 64 * every_token.page_size;
  std::vector<float> combined_largest, combined_every;
  std::vector<double> weights_largest, weights_every;
  CombineGroupScores(Spans(scores), LayerCombine::kEntropyWeighted, largest, &combined_largest,
                     &weights_largest);
  CombineGroupScores(Spans(scores), LayerCombine::kEntropyWeighted, every_token, &combined_every,
                     &weights_every);
  EXPECT_EQ(weights_largest, weights_every);
  EXPECT_EQ(combined_largest, combined_every);
}

// A policy without page scores keeps the union of its groups' pages in layer scope.
TEST(LayerScopeTest, WithoutPageScoresTheLayerKeepsTheUnion) {
  LayerDecision decision = GroupScopeDecision({{0, 3}, {1, 3}, {3, 7}}, 8, 2);
  ApplyLayerScope({}, kDefaultLayerCombine, PolicyOptions{}, 8 * 16, {}, &decision);
  for (const GroupDecision& group : decision.groups) {
    EXPECT_THAT(group.kept_pages, ::testing::ElementsAre(0, 1, 3, 7));
  }
  EXPECT_EQ(decision.union_pages, 4);
  EXPECT_EQ(decision.group_scope_union_pages, 4);
}

// After earlier evictions only the pages every group still holds are candidates: the highest
// scores sit on evicted pages, yet the layer keeps exactly K live pages (decode-time decisions
// must not shrink the budget by re-selecting what is gone).
TEST(LayerScopeTest, EvictedPagesAreNeverKept) {
  const std::vector<std::vector<float>> scores = {{1, 9, 8, 2, 3, 7, 4, 5},
                                                  {1, 9, 8, 2, 3, 7, 4, 5}};
  const std::vector<uint8_t> live = {1, 0, 1, 1, 1, 0, 1, 1};  // pages 1 and 5 are gone
  for (const LayerCombine combine : kCombines) {
    LayerDecision decision = GroupScopeDecision({{0, 2, 3}, {0, 2, 3}}, 8, 3);
    ApplyLayerScope(Spans(scores), combine, PolicyOptions{}, 8 * 16, live, &decision);
    EXPECT_THAT(decision.groups[0].kept_pages, ::testing::ElementsAre(2, 6, 7))
        << LayerCombineName(combine);
    EXPECT_EQ(decision.union_pages, 3);
  }
  // Without page scores (the union of the groups' sets), an evicted page is dropped too.
  LayerDecision decision = GroupScopeDecision({{0, 1}, {1, 2}}, 8, 2);
  ApplyLayerScope({}, kDefaultLayerCombine, PolicyOptions{}, 8 * 16, live, &decision);
  EXPECT_THAT(decision.groups[1].kept_pages, ::testing::ElementsAre(0, 2));
}

struct Case {
  int query_heads;
  int kv_groups;
  int64_t tokens;
  int page_size;
  int64_t quota;
};

Case RandomCase(std::mt19937_64& rng) {
  static constexpr int kGroups[] = {1, 2, 4, 8};
  static constexpr int kRatios[] = {1, 2, 3, 4, 8};
  static constexpr int kPageSizes[] = {1, 4, 16, 32};
  Case c;
  c.kv_groups = kGroups[rng() % 4];
  c.query_heads = c.kv_groups * kRatios[rng() % 5];
  c.page_size = kPageSizes[rng() % 4];
  c.tokens = 1 + static_cast<int64_t>(rng() % 900);
  c.quota = 1 + static_cast<int64_t>(rng() % (PageCount(c.tokens, c.page_size) + 2));
  return c;
}

LayerRequest Request(const StatisticView& view, const Case& c, SelectionScope scope,
                     LayerCombine combine) {
  LayerRequest request;
  request.statistic = view;
  request.query_heads = c.query_heads;
  request.kv_groups = c.kv_groups;
  request.tokens = c.tokens;
  request.quota_pages = c.quota;
  request.scope = scope;
  request.combine = combine;
  return request;
}

// Whole layers through DecideLayer, every policy: pooled policies keep exactly min(K, n) pages
// in one set for the layer; head_independent and streaming keep their group-scope union; the
// shadow is the group-scope decision's union, and group scope reports that union itself.
TEST(LayerScopeTest, EveryPolicyDecidesInBothScopes) {
  std::mt19937_64 rng(kSeed + 1);
  for (int trial = 0; trial < 150; ++trial) {
    const Case c = RandomCase(rng);
    const std::vector<float> data = testing::MixedRows(c.query_heads, c.tokens, rng);
    const StatisticView view =
        *StatisticView::Create(data.data(), DType::kFloat32, c.query_heads, c.tokens);
    PolicyOptions options;
    options.page_size = c.page_size;
    options.protections.tail_page = trial % 2 == 0;
    const int64_t expected = std::min(c.quota, PageCount(c.tokens, c.page_size));
    for (const absl::string_view name : PolicyNames()) {
      const Policy& policy = **FindPolicy(name);
      const LayerCombine combine = kCombines[trial % 3];
      SCOPED_TRACE(::testing::Message() << "seed " << kSeed + 1 << " trial " << trial << " " << name
                                        << " " << LayerCombineName(combine));
      ENTROKV_ASSERT_OK_AND_ASSIGN(
          LayerDecision group_scope,
          DecideLayer(policy, options, Request(view, c, SelectionScope::kGroup, combine)));
      ENTROKV_ASSERT_OK_AND_ASSIGN(
          LayerDecision layer_scope,
          DecideLayer(policy, options, Request(view, c, SelectionScope::kLayer, combine)));
      std::vector<std::vector<int32_t>> per_group;
      for (const GroupDecision& group : group_scope.groups) per_group.push_back(group.kept_pages);
      const std::vector<int32_t> union_pages = UnionOfPages(per_group);
      EXPECT_EQ(group_scope.scope, SelectionScope::kGroup);
      EXPECT_EQ(group_scope.union_pages, static_cast<int64_t>(union_pages.size()));
      EXPECT_EQ(group_scope.group_scope_union_pages, group_scope.union_pages);
      EXPECT_EQ(layer_scope.group_scope_union_pages, group_scope.union_pages);
      const std::vector<int32_t>& kept = layer_scope.groups.front().kept_pages;
      for (const GroupDecision& group : layer_scope.groups) ASSERT_EQ(group.kept_pages, kept);
      if (policy.exact_budget()) {
        EXPECT_EQ(static_cast<int64_t>(kept.size()), expected);
        EXPECT_EQ(layer_scope.union_pages, expected);
      } else {
        EXPECT_EQ(kept, union_pages);  // head_independent: the union over the layer's heads
      }
      if (name == "streaming") {
        EXPECT_EQ(kept, group_scope.groups.front().kept_pages);
      }
      for (size_t g = 0; g < layer_scope.groups.size(); ++g) {
        // The head weights and the head-level shadow do not depend on the scope.
        EXPECT_EQ(layer_scope.groups[g].weights, group_scope.groups[g].weights);
        EXPECT_EQ(layer_scope.groups[g].shadow_uor, group_scope.groups[g].shadow_uor);
        ASSERT_TRUE(layer_scope.groups[g].retained_mass.has_value());
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// The fused path gives the reference's layer-scope decisions bit for bit, in every dtype, with
// and without measurement and cached weights, for every combine.
TEST(LayerScopeTest, FusedScorerMatchesTheReferenceInLayerScope) {
  std::mt19937_64 rng(kSeed + 2);
  for (int trial = 0; trial < 200; ++trial) {
    const Case c = RandomCase(rng);
    const std::vector<float> values = testing::MixedRows(c.query_heads, c.tokens, rng);
    const DType dtype = trial % 3 == 0   ? DType::kFloat32
                        : trial % 3 == 1 ? DType::kFloat16
                                         : DType::kBFloat16;
    std::vector<uint16_t> half;
    for (const float value : values) {
      half.push_back(dtype == DType::kBFloat16 ? FloatToBFloat16(value) : FloatToFloat16(value));
    }
    const void* data = dtype == DType::kFloat32 ? static_cast<const void*>(values.data())
                                                : static_cast<const void*>(half.data());
    const StatisticView view = *StatisticView::Create(data, dtype, c.query_heads, c.tokens);
    PolicyOptions options;
    options.page_size = c.page_size;
    options.protections.tail_page = rng() % 2 == 0;
    options.protections.recent_pages = static_cast<int>(rng() % 3);
    std::vector<double> cached;
    if (rng() % 4 == 0) {
      for (int h = 0; h < c.query_heads; ++h) cached.push_back(static_cast<double>(rng() % 4));
    }
    for (const char* name : {"page_entrokv", "raw_entropy", "mean", "h2o", "max"}) {
      const Policy& policy = **FindPolicy(name);
      LayerRequest request = Request(view, c, SelectionScope::kLayer, kCombines[trial % 3]);
      request.measure = rng() % 2 == 0;
      request.cached_weights = cached;
      SCOPED_TRACE(::testing::Message() << "seed " << kSeed + 2 << " trial " << trial << " " << name
                                        << " " << DTypeName(dtype));
      ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision expected, DecideLayer(policy, options, request));
      FusedScorer scorer(options);
      for (int repeat = 0; repeat < 2; ++repeat) {  // scratch from the first call is reused
        ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision actual, scorer.DecideLayer(policy, request));
        EXPECT_EQ(actual.scope, expected.scope);
        EXPECT_EQ(actual.union_pages, expected.union_pages);
        EXPECT_EQ(actual.group_scope_union_pages, expected.group_scope_union_pages);
        EXPECT_EQ(actual.combine_weights, expected.combine_weights);
        ASSERT_EQ(actual.groups.size(), expected.groups.size());
        for (size_t g = 0; g < expected.groups.size(); ++g) {
          EXPECT_EQ(actual.groups[g].kept_pages, expected.groups[g].kept_pages) << g;
          EXPECT_EQ(actual.groups[g].weights, expected.groups[g].weights) << g;
          EXPECT_EQ(actual.groups[g].shadow_uor, expected.groups[g].shadow_uor) << g;
          EXPECT_EQ(actual.groups[g].retained_mass, expected.groups[g].retained_mass) << g;
        }
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace entrokv
