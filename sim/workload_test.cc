#include "sim/workload.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "core/scoring/entropy.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/random.h"

namespace entrokv::sim {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kTokens = 4096;

ModelPreset Qwen() { return *FindPreset("qwen2.5-1.5b"); }

WorkloadOptions Options(uint64_t seed) {
  WorkloadOptions options;
  options.tokens = kTokens;
  options.seed = seed;
  return options;
}

std::vector<float> Layer(const WorkloadGenerator& generator, int layer,
                         StatisticKind kind = StatisticKind::kLastRow) {
  std::vector<float> out(static_cast<size_t>(generator.preset().query_heads * kTokens));
  generator.GenerateLayer(layer, kind, out);
  return out;
}

std::span<const float> Row(const std::vector<float>& layer, int head) {
  return std::span<const float>(layer).subspan(static_cast<size_t>(head * kTokens),
                                               static_cast<size_t>(kTokens));
}

double Sum(std::span<const float> row, int64_t begin, int64_t end) {
  double total = 0.0;
  for (int64_t t = begin; t < end; ++t) total += row[static_cast<size_t>(t)];
  return total;
}

// Every (layer, head) of the preset with the given archetype.
std::vector<std::pair<int, int>> HeadsOf(const WorkloadGenerator& generator, HeadArchetype kind) {
  std::vector<std::pair<int, int>> heads;
  for (int l = 0; l < generator.preset().layers; ++l) {
    for (int h = 0; h < generator.preset().query_heads; ++h) {
      if (generator.archetype(l, h) == kind) heads.emplace_back(l, h);
    }
  }
  return heads;
}

TEST(RngTest, UniformAndNormalHaveTheirMoments) {
  Rng rng(42);
  double sum = 0.0, sum_sq = 0.0, uniform_sum = 0.0;
  constexpr int kDraws = 200000;
  for (int i = 0; i < kDraws; ++i) {
    const double u = rng.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    uniform_sum += u;
    const double z = rng.Normal();
    sum += z;
    sum_sq += z * z;
  }
  EXPECT_NEAR(uniform_sum / kDraws, 0.5, 0.01);
  EXPECT_NEAR(sum / kDraws, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / kDraws, 1.0, 0.02);
}

TEST(RngTest, SameSeedSameStreamAndMixSeedSeparatesTuples) {
  Rng a(7), b(7);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.Uniform(), b.Uniform());
  EXPECT_NE(MixSeed({1, 2}), MixSeed({2, 1}));
  EXPECT_NE(MixSeed({1, 2}), MixSeed({1, 3}));
}

TEST(WorkloadTest, SameSeedGivesTheSameBitsInAnyCallOrder) {
  const WorkloadGenerator first(Qwen(), Options(5));
  const WorkloadGenerator second(Qwen(), Options(5));
  const std::vector<float> late_first = Layer(first, 20);  // generated before layer 3
  EXPECT_EQ(Layer(first, 3), Layer(second, 3));
  EXPECT_EQ(late_first, Layer(second, 20));
  EXPECT_EQ(Layer(first, 7, StatisticKind::kAccumulated),
            Layer(second, 7, StatisticKind::kAccumulated));
}

TEST(WorkloadTest, DifferentSeedsDiffer) {
  const WorkloadGenerator one(Qwen(), Options(1));
  const WorkloadGenerator two(Qwen(), Options(2));
  EXPECT_NE(Layer(one, 3), Layer(two, 3));
}

TEST(WorkloadTest, RowsAreProbabilitiesAndAccumulatedSumsToT) {
  const WorkloadGenerator generator(Qwen(), Options(3));
  for (const StatisticKind kind :
       {StatisticKind::kLastRow, StatisticKind::kWindowMean, StatisticKind::kAccumulated}) {
    const double target = kind == StatisticKind::kAccumulated ? kTokens : 1.0;
    for (const int layer : {0, 13, 27}) {
      const std::vector<float> data = Layer(generator, layer, kind);
      for (int h = 0; h < 12; ++h) {
        const auto row = Row(data, h);
        ASSERT_TRUE(std::all_of(row.begin(), row.end(),
                                [](float v) { return std::isfinite(v) && v >= 0.0f; }));
        EXPECT_NEAR(Sum(row, 0, kTokens), target, 1e-4 * target)
            << "kind " << static_cast<int>(kind) << " layer " << layer << " head " << h;
      }
    }
  }
}

TEST(WorkloadTest, EveryArchetypeOccursAndTheMixChangesWithDepth) {
  const WorkloadGenerator generator(*FindPreset("llama3.1-8b"), Options(1));
  for (int a = 0; a < kArchetypeCount; ++a) {
    EXPECT_FALSE(HeadsOf(generator, static_cast<HeadArchetype>(a)).empty())
        << ArchetypeName(static_cast<HeadArchetype>(a));
  }
  int sink_low = 0, sink_high = 0, local_low = 0, local_high = 0;
  for (int l = 0; l < 32; ++l) {
    for (int h = 0; h < 32; ++h) {
      const HeadArchetype a = generator.archetype(l, h);
      (l < 16 ? sink_low : sink_high) += a == HeadArchetype::kSink;
      (l < 16 ? local_low : local_high) += a == HeadArchetype::kLocal;
    }
  }
  EXPECT_GT(sink_high, sink_low);
  EXPECT_GT(local_low, local_high);
}

TEST(WorkloadTest, SinkHeadsPutMostMassOnTheSinksAndSpreadTheRest) {
  const WorkloadGenerator generator(Qwen(), Options(4));
  const auto heads = HeadsOf(generator, HeadArchetype::kSink);
  ASSERT_FALSE(heads.empty());
  for (const auto& [layer, head] : heads) {
    const std::vector<float> data = Layer(generator, layer);
    const auto row = Row(data, head);
    EXPECT_GE(Sum(row, 0, 4), 0.6 - 1e-5);
    EXPECT_LE(Sum(row, 0, 4), 0.95 + 1e-5);
    // Spread residual: the isolated entropy is within 0.1 nats of the uniform ln(T - 4).
    EXPECT_GT(SinkIsolatedEntropy(row, 4, 2.0), std::log(kTokens - 4.0) - 0.1);
    // while the raw entropy is O(1).
    EXPECT_LT(SinkIsolatedEntropy(row, 0, 2.0), 2.0);
  }
}

TEST(WorkloadTest, RetrievalHeadsLookAtTheirNeedle) {
  const WorkloadGenerator generator(Qwen(), Options(4));
  const auto heads = HeadsOf(generator, HeadArchetype::kRetrieval);
  ASSERT_FALSE(heads.empty());
  for (const auto& [layer, head] : heads) {
    const HeadPlan plan = generator.Plan(layer, head);
    ASSERT_GE(plan.needle, 0);
    const NeedleSpan& needle = generator.needles()[static_cast<size_t>(plan.needle)];
    const std::vector<float> data = Layer(generator, layer);
    const auto row = Row(data, head);
    EXPECT_GE(Sum(row, needle.begin, needle.end), 0.6 - 1e-4);
    // In the accumulated statistic only the question queries see the needle.
    const std::vector<float> accumulated = Layer(generator, layer, StatisticKind::kAccumulated);
    EXPECT_LT(Sum(Row(accumulated, head), needle.begin, needle.end) / kTokens, 0.05);
  }
}

TEST(WorkloadTest, LocalHeadsFavourTheEndAndHeavyHittersConcentrate) {
  const WorkloadGenerator generator(Qwen(), Options(4));
  for (const auto& [layer, head] : HeadsOf(generator, HeadArchetype::kLocal)) {
    const HeadPlan plan = generator.Plan(layer, head);
    const std::vector<float> data = Layer(generator, layer);
    const auto row = Row(data, head);
    const auto window = static_cast<int64_t>(3.0 * plan.decay_tokens);
    EXPECT_GT(Sum(row, kTokens - window, kTokens), 0.9 * plan.focus_mass);
  }
  for (const auto& [layer, head] : HeadsOf(generator, HeadArchetype::kHeavyHitter)) {
    const HeadPlan plan = generator.Plan(layer, head);
    const std::vector<float> data = Layer(generator, layer);
    std::vector<float> row(Row(data, head).begin() + 4, Row(data, head).end());
    std::sort(row.begin(), row.end(), std::greater<>());
    const double top = std::accumulate(row.begin(), row.begin() + 16, 0.0);
    EXPECT_GT(top, 0.9 * plan.focus_mass);
  }
}

TEST(WorkloadTest, DiffuseHeadsAreNearUniform) {
  const WorkloadGenerator generator(Qwen(), Options(4));
  const auto heads = HeadsOf(generator, HeadArchetype::kDiffuse);
  ASSERT_FALSE(heads.empty());
  for (const auto& [layer, head] : heads) {
    const std::vector<float> data = Layer(generator, layer);
    EXPECT_GT(SinkIsolatedEntropy(Row(data, head), 4, 2.0), std::log(kTokens - 4.0) - 1.0);
  }
}

TEST(WorkloadTest, NeedlesSitAtTheirDepths) {
  WorkloadOptions options = Options(1);
  options.needle_depths = {0.0, 0.5, 1.0};
  options.needle_tokens = 8;
  const WorkloadGenerator generator(Qwen(), options);
  ASSERT_EQ(generator.needles().size(), 3u);
  EXPECT_EQ(generator.needles()[0].begin, 4);
  const int64_t last = kTokens - options.question_tokens - 8;
  EXPECT_EQ(generator.needles()[2].begin, last);
  EXPECT_EQ(generator.needles()[1].begin, 4 + (last - 4) / 2);
  for (const NeedleSpan& needle : generator.needles()) EXPECT_EQ(needle.end - needle.begin, 8);
}

TEST(WorkloadTest, ValidateNamesTheField) {
  WorkloadOptions options = Options(1);
  EXPECT_THAT(ValidateWorkloadOptions(options), IsOk());
  options.needle_depths = {1.5};
  EXPECT_THAT(ValidateWorkloadOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needle_depths")));
  options = Options(1);
  options.tokens = 10;
  EXPECT_THAT(ValidateWorkloadOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens")));
}

}  // namespace
}  // namespace entrokv::sim
