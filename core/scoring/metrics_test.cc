#include "core/scoring/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "core/scoring/pages.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

TEST(MetricsTest, UnionOverheadOfIdenticalAndDisjointSets) {
  const std::vector<std::vector<int32_t>> same = {{1, 2, 3}, {1, 2, 3}};
  const std::vector<std::vector<int32_t>> apart = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}};
  EXPECT_DOUBLE_EQ(UnionOverheadRatio(same, 3), 1.0);
  EXPECT_DOUBLE_EQ(UnionOverheadRatio(apart, 3), 3.0);
  EXPECT_DOUBLE_EQ(PairwiseJaccard(same).disagreement(), 0.0);
  EXPECT_DOUBLE_EQ(PairwiseJaccard(apart).disagreement(), 1.0);
}

TEST(MetricsTest, TwoHeadIdentityAtTheMethodsReferencePoints) {
  // phi(D) = 2 / (2 - D): D = 0.5 -> 4/3, D = 2/3 -> 1.5, D = 1 -> 2.
  const std::vector<std::vector<int32_t>> half = {{0, 1, 2}, {1, 2, 3}};  // J = 2/4
  const std::vector<std::vector<int32_t>> third = {{0, 1}, {1, 2}};       // J = 1/3
  for (const auto* sets : {&half, &third}) {
    const double d = PairwiseJaccard(*sets).disagreement();
    EXPECT_NEAR(UnionOverheadRatio(*sets, static_cast<int64_t>((*sets)[0].size())), 2.0 / (2.0 - d),
                1e-12);
  }
  EXPECT_NEAR(2.0 / (2.0 - PairwiseJaccard(half).disagreement()), 4.0 / 3.0, 1e-12);
  EXPECT_NEAR(2.0 / (2.0 - PairwiseJaccard(third).disagreement()), 1.5, 1e-12);
}

TEST(MetricsTest, CertificateThresholdsForTwofoldInflation) {
  // Bonferroni certifies UOR >= 2 iff J <= (r-2)/(r(r-1)); sandwich iff J <= (r-2)/(3r-2).
  for (const int r : {4, 6, 8}) {
    const double bonferroni = (r - 2.0) / (r * (r - 1.0));
    EXPECT_NEAR(BonferroniLowerBound(r, bonferroni), 2.0, 1e-12);
    const double sandwich = (r - 2.0) / (3.0 * r - 2.0);
    EXPECT_NEAR(SandwichBounds(r, sandwich, sandwich).lower, 2.0, 1e-12);
  }
  EXPECT_DOUBLE_EQ(SandwichBounds(8, 0.0, 0.0).lower, 8.0);
  EXPECT_DOUBLE_EQ(SandwichBounds(8, 1.0, 1.0).lower, 1.0);
  EXPECT_DOUBLE_EQ(SandwichBounds(8, 1.0, 1.0).upper, 7.0);
}

// UnionOverheadRatio and PairwiseJaccard count with bitmaps when the sets are dense and fall
// back to merging otherwise (sparse indices, negative indices); both must give the counts of a
// plain std::set computation, bit for bit.
TEST(MetricsTest, UnionAndJaccardMatchPlainSetCounts) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 300; ++trial) {
    const int count = static_cast<int>(pick(1, 9));
    const int64_t range = std::vector<int64_t>{1, 64, 65, 1000, 1 << 24}[pick(0, 4)];
    const int64_t low = pick(0, 5) == 0 ? -pick(1, 100) : 0;
    std::vector<std::vector<int32_t>> sets(static_cast<size_t>(count));
    for (auto& set : sets) {
      std::set<int32_t> members;
      const int64_t size = pick(0, std::min<int64_t>(range, 300));
      for (int64_t i = 0; i < size; ++i) members.insert(static_cast<int32_t>(pick(low, range - 1)));
      set.assign(members.begin(), members.end());
    }
    std::set<int32_t> all;
    for (const auto& set : sets) all.insert(set.begin(), set.end());
    const int64_t k = pick(1, 50);
    EXPECT_EQ(UnionOverheadRatio(sets, k),
              static_cast<double>(all.size()) / static_cast<double>(k));
    if (count < 2) continue;
    double sum = 0.0;
    double max_similarity = 0.0;
    int pairs = 0;
    for (int i = 0; i < count; ++i) {
      for (int j = i + 1; j < count; ++j) {
        const std::set<int32_t> a(sets[i].begin(), sets[i].end());
        double both = 0.0;
        for (const int32_t index : sets[j]) both += a.count(index) > 0 ? 1.0 : 0.0;
        const double either = static_cast<double>(sets[i].size() + sets[j].size()) - both;
        const double similarity = either > 0.0 ? both / either : 1.0;
        sum += similarity;
        max_similarity = std::max(max_similarity, similarity);
        ++pairs;
      }
    }
    const JaccardSummary summary = PairwiseJaccard(sets);
    EXPECT_EQ(summary.mean_similarity, sum / pairs) << "trial " << trial;
    EXPECT_EQ(summary.max_similarity, max_similarity) << "trial " << trial;
  }
}

TEST(MetricsTest, RetainedMassCountsThePartialLastPage) {
  const std::vector<float> values = {1, 1, 1, 1, 2, 2, 2, 2, 4};  // pages of 4: 4, 8, 4
  EXPECT_DOUBLE_EQ(RetainedMass(values, 4, std::vector<int32_t>{2}), 0.25);
  EXPECT_DOUBLE_EQ(RetainedMass(values, 4, std::vector<int32_t>{0, 1, 2}), 1.0);
  EXPECT_DOUBLE_EQ(RetainedMass(std::vector<float>(5, 0.0f), 4, std::vector<int32_t>{}), 1.0);
}

// PageSums works on eight pages at a time; every page must still be the plain double sum of its
// tokens in token order.
TEST(MetricsTest, PageSumsAreThePlainPerPageSums) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int page_size = std::uniform_int_distribution<int>(1, 40)(rng);
    const auto tokens = std::uniform_int_distribution<int64_t>(1, 2000)(rng);
    std::vector<float> values(static_cast<size_t>(tokens));
    for (float& value : values) value = unit(rng) * std::pow(10.0f, unit(rng) * 12.0f - 6.0f);
    std::vector<double> sums(static_cast<size_t>(PageCount(tokens, page_size)), -1.0);
    PageSums(values, page_size, sums);
    for (size_t page = 0; page < sums.size(); ++page) {
      double want = 0.0;
      for (int64_t t = static_cast<int64_t>(page) * page_size;
           t < std::min<int64_t>(static_cast<int64_t>(page + 1) * page_size, tokens); ++t) {
        want += values[static_cast<size_t>(t)];
      }
      ASSERT_EQ(sums[page], want) << "trial " << trial << " B " << page_size << " T " << tokens
                                  << " page " << page;
    }
  }
}

TEST(MetricsTest, NeedleBoundClosedForm) {
  // r = 8, tau = 0.5, eta = ln 2, 1 - eps = 0.95, four sinks (docs/method.md, claim C10).
  EXPECT_NEAR(NeedleBoundDelta(131072, 8, 0.5, std::log(2.0), 0.95, 4), 1.548e-9, 0.0005e-9);
  EXPECT_NEAR(NeedleBoundDelta(4096, 8, 0.5, std::log(2.0), 0.95, 4), 1.59e-6, 0.005e-6);
  // Delta decreases with T.
  double previous = 1.0;
  for (int64_t t = 4096; t <= 131072; t *= 2) {
    const double delta = NeedleBoundDelta(t, 8, 0.5, std::log(2.0), 0.95, 4);
    EXPECT_LT(delta, previous);
    previous = delta;
  }
  EXPECT_NEAR(MeanPooledNeedle(131072, 8, 0.95), 0.11875, 1e-5);
}

}  // namespace
}  // namespace entrokv
