#include "core/scoring/fused_scorer.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "core/scoring/decision.h"
#include "core/scoring/entropy.h"
#include "core/scoring/pages.h"
#include "core/testing/decisions.h"
#include "core/testing/status_matchers.h"
#include "core/util/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

using ::entrokv::testing::ExpectSameDecision;
using ::entrokv::testing::RandomValues;
using ::entrokv::testing::Statistic;
using ::entrokv::testing::TestSeed;

TEST(FusedScorerTest, KnowsWhichPoliciesItFuses) {
  for (const char* name : {"page_entrokv", "raw_entropy", "mean", "h2o", "max"}) {
    EXPECT_TRUE(IsFusedPolicy(**FindPolicy(name))) << name;
  }
  for (const char* name : {"head_independent", "snapkv", "streaming"}) {
    EXPECT_FALSE(IsFusedPolicy(**FindPolicy(name))) << name;
  }
}

// A policy the registry does not know, described by its pooling alone: the fused path takes it
// by its description (not its name) and decides as its reference SelectGroup does.
class RenamedMeanPolicy final : public Policy {
 public:
  absl::string_view name() const override { return "renamed_mean"; }
  Pooling pooling() const override { return {.kind = PoolingKind::kMean}; }
  GroupSelection SelectGroup(const GroupInput& input, const PolicyOptions& options) const override {
    return (*FindPolicy("mean"))->SelectGroup(input, options);
  }
};

TEST(FusedScorerTest, ChoosesThePathByThePolicysPoolingNotItsName) {
  const RenamedMeanPolicy policy;
  EXPECT_TRUE(IsFusedPolicy(policy));
  std::mt19937_64 rng(TestSeed());
  const Statistic statistic(DType::kFloat32, 4, 300, RandomValues(rng, 4, 300, 4));
  LayerRequest request;
  request.statistic = statistic.View();
  request.query_heads = 4;
  request.kv_groups = 2;
  request.tokens = 300;
  request.quota_pages = 5;
  const PolicyOptions options;
  ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision expected, DecideLayer(policy, options, request));
  FusedScorer scorer(options);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision actual, scorer.DecideLayer(policy, request));
  ExpectSameDecision(expected, actual);
}

TEST(FusedScorerTest, MatchesReferenceOnRandomAndAdversarialInputs) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (ENTROKV_TEST_SEED replays it)");
  std::mt19937_64 rng(seed);
  const std::vector<double> alphas = {2.0, 1.0, kAlphaInfinity, 0.5, 3.0};
  // The fused policies only: for the others FusedScorer::DecideLayer is DecideLayer itself, so
  // comparing them would compare the reference with itself.
  std::vector<absl::string_view> names;
  for (const absl::string_view name : PolicyNames()) {
    if (IsFusedPolicy(**FindPolicy(name))) names.push_back(name);
  }
  ASSERT_EQ(names.size(), 5u);
  for (int trial = 0; trial < 400; ++trial) {
    const std::unique_ptr<testing::RandomCase> c =
        testing::MakeRandomCase(rng, trial, names, alphas, /*layers=*/1);
    const PolicyOptions& options = c->options;
    const Policy& policy = *c->policy;
    const LayerRequest& request = c->requests[0];
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << c->Describe());
    const absl::StatusOr<LayerDecision> expected = DecideLayer(policy, options, request);
    ASSERT_TRUE(expected.ok()) << expected.status();
    FusedScorer scorer(options);
    const absl::StatusOr<LayerDecision> actual = scorer.DecideLayer(policy, request);
    ASSERT_TRUE(actual.ok()) << actual.status();
    ExpectSameDecision(*expected, *actual);
    // Scratch left from this call must not change the next one.
    const absl::StatusOr<LayerDecision> again = scorer.DecideLayer(policy, request);
    ASSERT_TRUE(again.ok());
    ExpectSameDecision(*expected, *again);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(FusedScorerTest, PageScoresAreThePooledPageMaximaOnlyWhenAsked) {
  PolicyOptions options;
  options.page_size = 4;
  const Policy& policy = **FindPolicy("mean");
  // Two heads, one group: the pooled row is the head mean; page b's score is its maximum.
  const std::vector<float> values = {0.1f, 0.2f, 0.3f, 0.4f, 0.9f, 0.0f, 0.0f, 0.0f, 0.5f,
                                     0.3f, 0.2f, 0.1f, 0.4f, 0.3f, 0.2f, 0.1f, 0.1f, 0.0f};
  const Statistic statistic(DType::kFloat32, 2, 9, values);
  LayerRequest request = LayerRequestFor(statistic.View(), 2, 1, 9, 1);
  ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision plain, DecideLayer(policy, options, request));
  EXPECT_TRUE(plain.groups[0].page_scores.empty());
  request.page_scores = true;
  for (const bool fused : {false, true}) {
    FusedScorer scorer(options);
    ENTROKV_ASSERT_OK_AND_ASSIGN(
        LayerDecision decision,
        fused ? scorer.DecideLayer(policy, request) : DecideLayer(policy, options, request));
    // Means per token: .2 .2 .2 .4 | .6 .1 .05 .05 | .25
    EXPECT_THAT(decision.groups[0].page_scores,
                ::testing::Pointwise(::testing::FloatEq(), std::vector<float>{0.4f, 0.6f, 0.25f}))
        << (fused ? "fused" : "reference");
  }
}

TEST(FusedScorerTest, ReusedScorerMatchesAcrossShrinkingAndGrowingLayers) {
  PolicyOptions options;
  options.protections.tail_page = true;
  FusedScorer scorer(options);
  const Policy& policy = **FindPolicy("page_entrokv");
  std::mt19937_64 rng(7);
  for (const int64_t tokens : {4096, 3, 100000, 17, 4095}) {
    const Statistic statistic(DType::kBFloat16, 4, tokens, RandomValues(rng, 4, tokens, 4));
    LayerRequest request;
    request.statistic = statistic.View();
    request.query_heads = 4;
    request.kv_groups = 2;
    request.tokens = tokens;
    request.quota_pages = std::max<int64_t>(1, PageCount(tokens, 16) / 5);
    ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision expected,
                                 DecideLayer(policy, options, request));
    ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision actual, scorer.DecideLayer(policy, request));
    ExpectSameDecision(expected, actual);
  }
}

TEST(FusedScorerTest, TiesGoToTheLowerPageIndex) {
  PolicyOptions options;
  options.page_size = 2;
  const std::vector<float> values(2 * 10, 0.5f);  // every page scores the same
  const Statistic statistic(DType::kFloat32, 2, 10, values);
  LayerRequest request;
  request.statistic = statistic.View();
  request.query_heads = 2;
  request.kv_groups = 1;
  request.tokens = 10;
  request.quota_pages = 3;
  request.measure = false;
  FusedScorer scorer(options);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision decision,
                               scorer.DecideLayer(**FindPolicy("mean"), request));
  EXPECT_EQ(decision.groups[0].kept_pages, (std::vector<int32_t>{0, 1, 2}));
}

// The columns hold the same six values in a different head order, so the pages tie
// and the lower index is kept, by the fused path as by the reference.
TEST(FusedScorerTest, MeanPoolingTiesDoNotDependOnTheHeadOrder) {
  const std::vector<float> values = {0.1f, 0.7f, 0.3f, 0.9f, 0.05f, 0.45f};
  std::vector<float> permuted;  // [6, 2]: column 1 holds column 0 reversed
  for (size_t h = 0; h < values.size(); ++h) {
    permuted.push_back(values[h]);
    permuted.push_back(values[values.size() - 1 - h]);
  }
  const Statistic statistic(DType::kFloat32, 6, 2, permuted);
  LayerRequest request;
  request.statistic = statistic.View();
  request.query_heads = 6;
  request.kv_groups = 1;
  request.tokens = 2;
  request.quota_pages = 1;
  PolicyOptions options;
  options.page_size = 1;
  for (const char* name : {"mean", "h2o"}) {
    for (const bool measure : {false, true}) {
      SCOPED_TRACE(::testing::Message() << name << " measure " << measure);
      request.measure = measure;
      const Policy& policy = **FindPolicy(name);
      FusedScorer scorer(options);
      ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision actual, scorer.DecideLayer(policy, request));
      EXPECT_EQ(actual.groups[0].kept_pages, (std::vector<int32_t>{0}));
      ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision expected,
                                   DecideLayer(policy, options, request));
      ExpectSameDecision(expected, actual);
    }
  }
}

TEST(FusedScorerTest, RejectsBadValuesWithTheReferenceError) {
  const PolicyOptions options;
  const Policy& policy = **FindPolicy("page_entrokv");
  for (const float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(), -1e-30f}) {
    for (const int64_t at : {int64_t{1}, int64_t{2 * 40 + 39}}) {  // a sink token, a later head
      std::vector<float> values(4 * 40, 0.25f);
      values[static_cast<size_t>(at)] = bad;
      values[static_cast<size_t>(3 * 40 + 5)] = -2.0f;  // a later bad value is not the one named
      const Statistic statistic(DType::kFloat32, 4, 40, values);
      LayerRequest request;
      request.statistic = statistic.View();
      request.query_heads = 4;
      request.kv_groups = 2;
      request.tokens = 40;
      request.quota_pages = 1;
      const absl::StatusOr<LayerDecision> expected = DecideLayer(policy, options, request);
      FusedScorer scorer(options);
      const absl::StatusOr<LayerDecision> actual = scorer.DecideLayer(policy, request);
      EXPECT_THAT(actual, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("statistic")));
      EXPECT_EQ(expected.status(), actual.status());
    }
  }
}

TEST(FusedScorerTest, AcceptsNegativeZeroLikeTheReference) {
  std::vector<float> values(2 * 8, -0.0f);
  values[5] = 1.0f;
  const Statistic statistic(DType::kFloat32, 2, 8, values);
  LayerRequest request;
  request.statistic = statistic.View();
  request.query_heads = 2;
  request.kv_groups = 1;
  request.tokens = 8;
  request.quota_pages = 2;
  PolicyOptions options;
  options.page_size = 2;
  for (const char* name : {"page_entrokv", "max"}) {
    const Policy& policy = **FindPolicy(name);
    ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision expected,
                                 DecideLayer(policy, options, request));
    FusedScorer scorer(options);
    ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision actual, scorer.DecideLayer(policy, request));
    ExpectSameDecision(expected, actual);
  }
}

TEST(FusedScorerTest, ShapeAndOptionErrorsMatchTheReference) {
  const std::vector<float> values(4 * 40, 0.25f);
  const Statistic statistic(DType::kFloat32, 4, 40, values);
  std::vector<float> bad_values = values;
  bad_values[3] = -1.0f;
  const Statistic bad_statistic(DType::kFloat32, 4, 40, bad_values);
  const std::vector<double> three_weights = {0.5, 0.25, 0.25};
  const Policy& policy = **FindPolicy("page_entrokv");
  auto base = [&] {
    LayerRequest request;
    request.statistic = statistic.View();
    request.query_heads = 4;
    request.kv_groups = 2;
    request.tokens = 40;
    request.quota_pages = 1;
    return request;
  };
  struct Case {
    const char* what;
    absl::StatusCode code;
    LayerRequest request;
    PolicyOptions options;
  };
  std::vector<Case> cases;
  cases.push_back({"kv_groups", absl::StatusCode::kInvalidArgument, base(), {}});
  cases.back().request.kv_groups = 3;
  cases.push_back({"tokens", absl::StatusCode::kFailedPrecondition, base(), {}});
  cases.back().request.tokens = 41;
  cases.push_back({"quota_pages", absl::StatusCode::kInvalidArgument, base(), {}});
  cases.back().request.quota_pages = 0;
  cases.push_back({"statistic", absl::StatusCode::kInvalidArgument, base(), {}});
  cases.back().request.statistic.reset();
  cases.push_back({"cached_weights", absl::StatusCode::kFailedPrecondition, base(), {}});
  cases.back().request.cached_weights = three_weights;
  cases.push_back({"cached_weights", absl::StatusCode::kFailedPrecondition, base(), {}});
  cases.back().request.cached_weights = three_weights;  // shapes are checked before values
  cases.back().request.statistic = bad_statistic.View();
  cases.push_back({"head 0, token 3", absl::StatusCode::kInvalidArgument, base(), {}});
  cases.back().request.statistic = bad_statistic.View();
  cases.push_back({"tau", absl::StatusCode::kInvalidArgument, base(), {}});
  cases.back().options.tau = 0.0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const absl::StatusOr<LayerDecision> expected = DecideLayer(policy, c.options, c.request);
    FusedScorer scorer(c.options);
    const absl::StatusOr<LayerDecision> actual = scorer.DecideLayer(policy, c.request);
    EXPECT_THAT(actual, StatusIs(c.code, HasSubstr(c.what)));
    EXPECT_EQ(expected.status(), actual.status());
  }
}

TEST(FusedScorerTest, DecideModelIsTheSameForEveryThreadCount) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (ENTROKV_TEST_SEED replays it)");
  std::mt19937_64 rng(seed);
  PolicyOptions options;
  options.protections.tail_page = true;
  const Policy& policy = **FindPolicy("page_entrokv");
  std::vector<Statistic> statistics;
  for (int l = 0; l < 7; ++l) {
    statistics.emplace_back(DType::kFloat32, 6, 3000, RandomValues(rng, 6, 3000, 4));
  }
  std::vector<LayerRequest> requests(7);
  for (int l = 0; l < 7; ++l) {
    requests[l].statistic = statistics[l].View();
    requests[l].query_heads = 6;
    requests[l].kv_groups = 2;
    requests[l].tokens = 3000;
    requests[l].quota_pages = 10 + l;
    requests[l].measure = false;
  }
  for (const int threads : {0, 1, 2, 3, 16}) {
    SCOPED_TRACE(threads);
    ENTROKV_ASSERT_OK_AND_ASSIGN(const std::vector<LayerDecision> decisions,
                                 DecideModel(policy, options, requests, threads));
    ASSERT_EQ(decisions.size(), requests.size());
    for (size_t l = 0; l < requests.size(); ++l) {
      ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision expected,
                                   DecideLayer(policy, options, requests[l]));
      ExpectSameDecision(expected, decisions[l]);
    }
  }
}

TEST(FusedScorerTest, DecideModelReturnsTheFirstLayerError) {
  std::vector<float> values(2 * 32, 0.5f);
  const Statistic good(DType::kFloat32, 2, 32, values);
  values[7] = -1.0f;
  const Statistic bad(DType::kFloat32, 2, 32, values);
  std::vector<LayerRequest> requests(4);
  for (size_t l = 0; l < requests.size(); ++l) {
    requests[l].statistic = (l == 2 ? bad : good).View();
    requests[l].query_heads = 2;
    requests[l].kv_groups = 1;
    requests[l].tokens = 32;
    requests[l].quota_pages = l == 3 ? 0 : 1;  // layer 3 is bad too, but later
  }
  EXPECT_THAT(DecideModel(**FindPolicy("mean"), PolicyOptions(), requests, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 7")));
}

}  // namespace
}  // namespace entrokv

namespace entrokv {
namespace {

// A layer of many groups used to be scored to the end after its caller gave up. The
// predicate is polled before every group; from its first true the decision stops, CANCELLED,
// on both paths (the fused one and the reference the other policies take).
TEST(FusedScorerTest, CancellationIsPolledBetweenGroups) {
  constexpr int kGroups = 64;
  constexpr int64_t kTokens = 256;
  std::vector<float> values(static_cast<size_t>(kGroups) * kTokens);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((i * 7919) % 1000);
  const Statistic statistic(DType::kFloat32, kGroups, kTokens, values);
  for (const absl::string_view name : {"page_entrokv", "snapkv"}) {
    SCOPED_TRACE(name);
    const Policy& policy = **FindPolicy(name);
    PolicyOptions options;
    options.page_size = 16;
    LayerRequest request;
    request.statistic = statistic.View();
    request.query_heads = kGroups;
    request.kv_groups = kGroups;
    request.tokens = kTokens;
    request.quota_pages = 4;
    int polls = 0;
    request.cancelled = [&polls] { return ++polls > 3; };
    FusedScorer scorer(options);
    EXPECT_THAT(scorer.DecideLayer(policy, request),
                StatusIs(absl::StatusCode::kCancelled, HasSubstr("after 3 of 64 KV groups")));
    EXPECT_EQ(polls, 4);  // three groups scored, the fourth never started
    polls = 0;
    request.cancelled = [&polls] {
      ++polls;
      return false;
    };
    EXPECT_TRUE(scorer.DecideLayer(policy, request).ok());
    EXPECT_EQ(polls, kGroups);
  }
}

}  // namespace
}  // namespace entrokv
