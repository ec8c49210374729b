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
// The sums' order is the striped lanes' (entropy.h), which the CUDA scorer reproduces: a row
// where that order and a plain left-to-right sum give different doubles.
TEST(EntropyTest, SumsTakeTheStripedLanesOrder) {
  std::vector<float> row(300, 1.0f);
  row[0] = 0x1p60f;  // a double's ulp here is 256: ones added one by one vanish
  double plain = 0.0;
  for (const float x : row) plain += x;
  // Lane 0 holds 2^60 (its 1 vanishes); the folds add the even lanes' partial sums (at most 75,
  // below half an ulp) to it and they vanish too; the last fold adds the odd lanes' 128 + 22 ones,
  // and 2^60 + 150 rounds to 2^60 + 256.
  const EntropySums sums = EntropySumsOf(row, 2.0);
  EXPECT_EQ(plain, 0x1p60);
  EXPECT_EQ(sums.total, 0x1p60 + 256.0);
  // Chunks of any length continue the lanes: the same bits as one call.
  std::mt19937_64 rng(3);
  std::vector<float> values(5000);
  for (float& value : values) value = static_cast<float>(rng() % 1000) * 0.37f;
  for (const double alpha : {2.0, 1.0, kAlphaInfinity}) {
    const EntropySums whole = EntropySumsOf(values, alpha);
    EntropyLanes lanes;
    size_t at = 0;
    for (const size_t chunk : {1, 255, 300, 17, 1024, 3403}) {
      const size_t count = std::min(chunk, values.size() - at);
      AccumulateEntropyLanes(std::span<const float>(values).subspan(at, count), alpha, &lanes);
      at += count;
    }
    ASSERT_EQ(at, values.size());
    const EntropySums chunked = FoldEntropyLanes(lanes, alpha);
    EXPECT_EQ(chunked.total, whole.total) << alpha;
    EXPECT_EQ(chunked.power, whole.power) << alpha;
  }
}

}  // namespace entrokv
