#include "core/scoring/entropy.h"

#include <cmath>
#include <random>
#include <vector>

#include "core/testing/random_rows.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

TEST(EntropyTest, UniformResidualSinkHeadGetsExactlyLogOfTheRest) {
  // A sink head: 97% on the first four tokens, the rest spread evenly. Isolation must see a
  // uniform distribution over T - s tokens, whatever the sink mass.
  const int64_t tokens = 1000;
  std::vector<float> row(tokens, 0.03f / (tokens - 4));
  for (int t = 0; t < 4; ++t) row[t] = 0.97f / 4;
  const double n = tokens - 4.0;
  for (const double alpha : {0.5, 1.0, 2.0, 3.0, kAlphaInfinity}) {
    // Exact but for the guard inside the log: ln(sum p^a + eps) moves by at most
    // eps / sum p^a = eps * n^(a-1), divided by |1 - a| (by eps * n for min-entropy).
    double tolerance = 1e-12;
    if (std::isinf(alpha)) {
      tolerance += kEntropyLogGuard * n;
    } else if (alpha != 1.0) {
      tolerance += kEntropyLogGuard * std::pow(n, alpha - 1.0) / std::abs(1.0 - alpha);
    }
    EXPECT_NEAR(SinkIsolatedEntropy(row, 4, alpha), std::log(n), tolerance) << "alpha " << alpha;
  }
}

TEST(EntropyTest, RawEntropyOfTheSameSinkHeadIsSmall) {
  const int64_t tokens = 1000;
  std::vector<float> row(tokens, 0.03f / (tokens - 1));
  row[0] = 0.97f;
  // Raw H2 = -ln((1-d)^2 + d^2/N) with the sink mass on one token and d spread over the other
  // N = T - 1 (docs/method.md, claim C6).
  const double n = tokens - 1.0;
  const double d = 0.03;
  EXPECT_NEAR(SinkIsolatedEntropy(row, 0, 2.0), -std::log((1 - d) * (1 - d) + d * d / n), 1e-6);
}

TEST(EntropyTest, DegenerateAllSinkHeadGetsMaximalEntropy) {
  std::vector<float> row(100, 0.0f);
  for (int t = 0; t < 4; ++t) row[t] = 0.25f;
  for (const double alpha : {0.5, 1.0, 2.0, kAlphaInfinity}) {
    EXPECT_DOUBLE_EQ(SinkIsolatedEntropy(row, 4, alpha), std::log(96.0));
  }
  // All-zero rows and rows shorter than the sink window are degenerate too.
  EXPECT_DOUBLE_EQ(SinkIsolatedEntropy(std::vector<float>(10, 0.0f), 4, 2.0), std::log(6.0));
  EXPECT_DOUBLE_EQ(SinkIsolatedEntropy(std::vector<float>(3, 1.0f), 4, 2.0),
                   0.0);  // ln(max(T-s,1))
}

TEST(EntropyTest, ClosedFormsOfEachOrder) {
  // p = (0.5, 0.25, 0.25) after four zero sinks.
  const std::vector<float> row = {9, 9, 9, 9, 2, 1, 1};
  EXPECT_NEAR(SinkIsolatedEntropy(row, 4, 2.0), -std::log(0.375), 1e-11);  // guard: eps/0.375
  EXPECT_NEAR(SinkIsolatedEntropy(row, 4, 1.0), 1.5 * std::log(2.0), 1e-12);
  EXPECT_NEAR(SinkIsolatedEntropy(row, 4, kAlphaInfinity), std::log(2.0), 1e-11);
  const double sum3 = 0.125 + 2 * 0.015625;
  EXPECT_NEAR(SinkIsolatedEntropy(row, 4, 3.0), std::log(sum3) / (1 - 3.0), 1e-11);
}

TEST(EntropyTest, RangeAndOrderMonotonicityOnRandomRows) {
  std::mt19937_64 rng(20261129);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t tokens = 5 + static_cast<int64_t>(rng() % 300);
    std::vector<float> rows = testing::MixedRows(1, tokens, rng);
    double previous = INFINITY;
    for (const double alpha : {0.5, 1.0, 2.0, 4.0, kAlphaInfinity}) {
      const double h = SinkIsolatedEntropy(rows, 4, alpha);
      EXPECT_GE(h, -1e-9) << "trial " << trial;
      EXPECT_LE(h, std::log(static_cast<double>(tokens - 4)) + 1e-9) << "trial " << trial;
      EXPECT_LE(h, previous + 1e-9) << "Renyi entropy must not grow with alpha, trial " << trial;
      previous = h;
    }
  }
}

TEST(EntropyTest, ScaleInvariant) {
  // Isolation renormalises, so accumulated statistics (rows far from summing to 1) score like
  // their normalised form.
  std::mt19937_64 rng(7);
  std::vector<float> row = testing::MixedRows(1, 257, rng);
  std::vector<float> scaled(row.size());
  for (size_t t = 0; t < row.size(); ++t) scaled[t] = row[t] * 1024.0f;  // exact in float
  for (const double alpha : {0.5, 1.0, 2.0, 7.0, kAlphaInfinity}) {
    EXPECT_NEAR(SinkIsolatedEntropy(row, 4, alpha), SinkIsolatedEntropy(scaled, 4, alpha), 1e-9);
  }
}

}  // namespace
}  // namespace entrokv
