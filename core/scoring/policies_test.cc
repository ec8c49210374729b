#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "core/scoring/pages.h"
#include "core/scoring/policy.h"
#include "core/scoring/weights.h"
#include "core/testing/random_rows.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::span<const float>> Rows(const std::vector<float>& data, int heads,
                                         int64_t tokens) {
  std::vector<std::span<const float>> rows;
  for (int h = 0; h < heads; ++h) rows.emplace_back(data.data() + h * tokens, tokens);
  return rows;
}

GroupSelection Select(absl::string_view name, const std::vector<float>& data, int heads,
                      int64_t tokens, int64_t k, const PolicyOptions& options = {}) {
  const std::vector<std::span<const float>> rows = Rows(data, heads, tokens);
  GroupInput input;
  input.rows = rows;
  input.tokens = tokens;
  input.quota_pages = k;
  return (*FindPolicy(name))->SelectGroup(input, options);
}

TEST(PolicyRegistryTest, KnowsEveryPolicyOfTheDesign) {
  EXPECT_THAT(PolicyNames(), ElementsAre("page_entrokv", "raw_entropy", "mean", "max",
                                         "head_independent", "snapkv", "h2o", "streaming"));
  EXPECT_THAT(FindPolicy("lru"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("page_entrokv")));
}

TEST(PolicyRegistryTest, NamesTheStatisticEachPolicyScores) {
  const std::map<absl::string_view, std::optional<StatisticKind>> expected = {
      {"page_entrokv", StatisticKind::kLastRow},
      {"raw_entropy", StatisticKind::kLastRow},
      {"mean", StatisticKind::kLastRow},
      {"max", StatisticKind::kLastRow},
      {"head_independent", StatisticKind::kLastRow},
      {"snapkv", StatisticKind::kWindowMean},
      {"h2o", StatisticKind::kAccumulated},
      {"streaming", std::nullopt}};
  for (const absl::string_view name : PolicyNames()) {
    const Policy& policy = **FindPolicy(name);
    ASSERT_TRUE(expected.contains(name)) << name;
    EXPECT_EQ(policy.statistic(), expected.at(name)) << name;
    // A policy names a statistic exactly when it reads one.
    EXPECT_EQ(policy.statistic().has_value(), policy.needs_statistic()) << name;
  }
}

TEST(PolicyOptionsTest, RejectsEachBadOptionByName) {
  PolicyOptions options;
  options.page_size = 0;
  EXPECT_THAT(ValidatePolicyOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_size")));
  options = {};
  options.tau = 0;
  EXPECT_THAT(ValidatePolicyOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tau")));
  options = {};
  options.alpha = -1;
  EXPECT_THAT(ValidatePolicyOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("alpha")));
  options = {};
  options.alpha = NAN;
  EXPECT_THAT(ValidatePolicyOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("alpha")));
  options = {};
  options.sink_tokens = -1;
  EXPECT_THAT(ValidatePolicyOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sink_tokens")));
  options = {};
  options.snapkv_kernel = 4;
  EXPECT_THAT(ValidatePolicyOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("snapkv_kernel")));
  for (const int kernel : {0, 4, -3, kMaxNeighbourhoodKernel + 2}) {
    options = {};
    options.neighbourhood_kernel = kernel;
    EXPECT_THAT(ValidatePolicyOptions(options),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("neighbourhood_kernel")))
        << kernel;
  }
  options = {};
  options.neighbourhood_kernel = kMaxNeighbourhoodKernel;
  EXPECT_TRUE(ValidatePolicyOptions(options).ok());
}

TEST(WeightsTest, TemperatureLimits) {
  const std::vector<double> entropies = {1.0, 2.0, 3.0, 1.5};
  for (const double w : EntropyWeights(entropies, 1e6)) EXPECT_NEAR(w, 0.25, 1e-5);
  const std::vector<double> sharp = EntropyWeights(entropies, 1e-3);
  EXPECT_NEAR(sharp[0], 1.0, 1e-12);
  EXPECT_NEAR(sharp[3], 0.0, 1e-12);
  // Two minimisers share the weight as tau -> 0.
  const std::vector<double> tied = EntropyWeights(std::vector<double>{1.0, 1.0, 5.0}, 1e-3);
  EXPECT_NEAR(tied[0], 0.5, 1e-12);
  EXPECT_NEAR(tied[1], 0.5, 1e-12);
  // Monotone: lower entropy, more weight; max weight falls as tau grows.
  double previous_max = 1.0;
  for (const double tau : {0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0}) {
    const std::vector<double> w = EntropyWeights(entropies, tau);
    EXPECT_GT(w[0], w[3]);
    EXPECT_GT(w[3], w[1]);
    EXPECT_GT(w[1], w[2]);
    EXPECT_LE(w[0], previous_max);
    previous_max = w[0];
  }
}

TEST(PolicyTest, BlockMaxKeepsTheNeedlePageThatBlockMeanWouldLose) {
  // One page holds a single 0.95 token, another sixteen 0.06 tokens (docs/method.md, C13).
  std::vector<float> row(48, 0.0f);
  row[16 + 5] = 0.95f;
  for (int t = 32; t < 48; ++t) row[t] = 0.06f;
  EXPECT_THAT(Select("mean", row, 1, 48, 1).kept_pages, ElementsAre(1));
}

TEST(PolicyTest, StreamingKeepsSinkPagesThenTheNewest) {
  PolicyOptions options;
  options.page_size = 4;
  options.sink_tokens = 4;
  EXPECT_THAT(Select("streaming", std::vector<float>(40, 1.0f), 1, 40, 3, options).kept_pages,
              ElementsAre(0, 8, 9));
}

TEST(PolicyTest, SnapKvMaxPoolSpreadsAPeakToItsNeighbours) {
  // A peak at token 8 with width-7 pooling reaches tokens 5..11, so page 2 (tokens 8..11) and
  // page 1 (4..7) score the same and beat the zero pages.
  std::vector<float> row(16, 0.0f);
  row[8] = 1.0f;
  PolicyOptions options;
  options.page_size = 4;
  EXPECT_THAT(Select("snapkv", row, 1, 16, 2, options).kept_pages, ElementsAre(1, 2));
  options.snapkv_kernel = 1;
  EXPECT_THAT(Select("snapkv", row, 1, 16, 2, options).kept_pages, ElementsAre(0, 2));
}

TEST(PolicyTest, NeighbourhoodPoolingSpreadsAPeakInEveryPooledPolicy) {
  // As snapkv's: a peak at token 8, width 7, reaches tokens 5..11, so pages 1 and 2 tie.
  std::vector<float> row(16, 0.0f);
  row[8] = 1.0f;
  PolicyOptions options;
  options.page_size = 4;
  for (const absl::string_view name : {"page_entrokv", "raw_entropy", "mean", "max", "h2o"}) {
    EXPECT_THAT(Select(name, row, 1, 16, 2, options).kept_pages, ElementsAre(0, 2)) << name;
    options.neighbourhood_kernel = 7;
    EXPECT_THAT(Select(name, row, 1, 16, 2, options).kept_pages, ElementsAre(1, 2)) << name;
    options.neighbourhood = NeighbourhoodKind::kMean;
    EXPECT_THAT(Select(name, row, 1, 16, 2, options).kept_pages, ElementsAre(1, 2)) << name;
    options.neighbourhood_kernel = 1;
    options.neighbourhood = NeighbourhoodKind::kMax;
  }
}

TEST(WeightsTest, NeighbourhoodPoolClipsItsWindowAtTheEnds) {
  const std::vector<float> row = {1.0f, 4.0f, 2.0f, 0.0f, 3.0f};
  std::vector<float> out(5);
  NeighbourhoodPool(row, 0, 5, 0, 3, NeighbourhoodKind::kMax, out);
  EXPECT_THAT(out, ElementsAre(4.0f, 4.0f, 4.0f, 3.0f, 3.0f));
  NeighbourhoodPool(row, 0, 5, 0, 3, NeighbourhoodKind::kMean, out);
  EXPECT_THAT(
      out, ElementsAre(2.5f, static_cast<float>(7.0 / 3), 2.0f, static_cast<float>(5.0 / 3), 1.5f));
  // A slice of the row gives the same values for the tokens whose windows it holds.
  std::vector<float> part(2);
  NeighbourhoodPool(std::span<const float>(row).subspan(1, 4), 1, 5, 2, 3, NeighbourhoodKind::kMean,
                    part);
  EXPECT_THAT(part, ElementsAre(2.0f, static_cast<float>(5.0 / 3)));
}

TEST(PolicyTest, MeanWithNeighbourhoodMaxIsSnapKv) {
  // snapkv is the mean of each row max-pooled over snapkv_kernel: the same pages and scores.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> value(0.0f, 1.0f);
  std::vector<float> rows(4 * 300);
  for (float& x : rows) x = value(rng) * value(rng);
  PolicyOptions snapkv;
  snapkv.page_size = 8;
  PolicyOptions mean = snapkv;
  mean.neighbourhood_kernel = snapkv.snapkv_kernel;
  const GroupSelection a = Select("snapkv", rows, 4, 300, 9, snapkv);
  const GroupSelection b = Select("mean", rows, 4, 300, 9, mean);
  EXPECT_EQ(a.kept_pages, b.kept_pages);
  EXPECT_EQ(a.page_scores, b.page_scores);
}

TEST(PolicyTest, MaxPoolingTakesTheLargestHeadPerToken) {
  std::vector<float> rows(2 * 8, 0.0f);
  rows[0 * 8 + 1] = 0.2f;
  rows[1 * 8 + 6] = 0.9f;
  PolicyOptions options;
  options.page_size = 2;
  EXPECT_THAT(Select("max", rows, 2, 8, 2, options).kept_pages, ElementsAre(0, 3));
}

// Two pages whose columns hold the same six values in a different head order are a tie, which
// goes to the lower page index (docs/architecture.md §3.7), not to whichever rounding of
// float(1/6) * x summed head by head came out one ulp higher.
std::vector<float> PermutedColumns() {
  const std::vector<float> values = {0.1f, 0.7f, 0.3f, 0.9f, 0.05f, 0.45f};
  std::vector<float> statistic;  // [6, 2]: column 0 = values, column 1 = values reversed
  for (size_t h = 0; h < values.size(); ++h) {
    statistic.push_back(values[h]);
    statistic.push_back(values[values.size() - 1 - h]);
  }
  return statistic;
}

TEST(PolicyTest, MeanPoolingTiesDoNotDependOnTheHeadOrder) {
  PolicyOptions options;
  options.page_size = 1;
  options.snapkv_kernel = 1;
  for (const absl::string_view name : {"mean", "h2o", "snapkv"}) {
    EXPECT_THAT(Select(name, PermutedColumns(), 6, 2, 1, options).kept_pages, ElementsAre(0))
        << name;
  }
}

TEST(WeightsTest, MeanRowsIsTheSameForEveryHeadOrder) {
  const std::vector<float> statistic = PermutedColumns();
  const std::vector<std::span<const float>> rows = Rows(statistic, 6, 2);
  std::vector<float> mean(2);
  MeanRows(rows, mean);
  EXPECT_EQ(mean[0], mean[1]);
  EXPECT_EQ(mean[0], static_cast<float>((0.1 + 0.7 + 0.3 + 0.9 + 0.05 + 0.45) / 6.0));
}

TEST(PolicyTest, HeadIndependentKeepsTheUnion) {
  std::vector<float> rows(2 * 8, 0.0f);
  rows[0 * 8 + 0] = 1.0f;
  rows[1 * 8 + 7] = 1.0f;
  PolicyOptions options;
  options.page_size = 2;
  EXPECT_THAT(Select("head_independent", rows, 2, 8, 1, options).kept_pages, ElementsAre(0, 3));
}

TEST(PolicyTest, CachedWeightsReplaceTheEntropies) {
  std::mt19937_64 rng(3);
  const std::vector<float> rows = testing::MixedRows(4, 64, rng);
  const std::vector<double> weights = {0.0, 1.0, 0.0, 0.0};
  const std::vector<std::span<const float>> spans = Rows(rows, 4, 64);
  GroupInput input;
  input.rows = spans;
  input.tokens = 64;
  input.quota_pages = 1;
  input.cached_weights = weights;
  const GroupSelection selection = (*FindPolicy("page_entrokv"))->SelectGroup(input, {});
  EXPECT_EQ(selection.weights, weights);
  EXPECT_TRUE(selection.entropies.empty());
  const std::vector<float> head1(rows.begin() + 64, rows.begin() + 128);
  EXPECT_EQ(selection.kept_pages, Select("mean", head1, 1, 64, 1).kept_pages);
}

}  // namespace
}  // namespace entrokv
