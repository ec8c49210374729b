#include "core/scoring/portable_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace entrokv::portable {
namespace {

using A = HostArithmetic;

// Distance in units in the last place between two finite doubles of the same sign.
int64_t UlpDistance(double a, double b) {
  int64_t x = 0;
  int64_t y = 0;
  std::memcpy(&x, &a, sizeof(x));
  std::memcpy(&y, &b, sizeof(y));
  return x > y ? x - y : y - x;
}

TEST(PortableMathTest, LogIsWithinTwoUlpOfTheLibrary) {
  std::mt19937_64 random(7);
  std::uniform_real_distribution<double> exponent(-1000.0, 1000.0);
  for (int i = 0; i < 200000; ++i) {
    const double x = std::exp2(exponent(random));
    const double want = std::log(x);
    // Near ln x = 0 the ulp shrinks with the result: compare there relative to ln of nearby
    // values' size.
    if (std::abs(want) < 1e-3) {
      EXPECT_NEAR(Log<A>(x), want, 1e-18) << x;
    } else {
      EXPECT_LE(UlpDistance(Log<A>(x), want), 2) << x;
    }
  }
  EXPECT_EQ(Log<A>(1.0), 0.0);
  EXPECT_EQ(Log<A>(2.0), std::log(2.0));
  EXPECT_LE(UlpDistance(Log<A>(std::numeric_limits<double>::max()),
                        std::log(std::numeric_limits<double>::max())),
            2);
  EXPECT_LE(UlpDistance(Log<A>(1e-12), std::log(1e-12)), 2);
}

TEST(PortableMathTest, ExpIsWithinTwoUlpOfTheLibrary) {
  std::mt19937_64 random(8);
  std::uniform_real_distribution<double> argument(-700.0, 700.0);
  for (int i = 0; i < 200000; ++i) {
    const double y = argument(random);
    EXPECT_LE(UlpDistance(Exp<A>(y), std::exp(y)), 2) << y;
  }
  EXPECT_EQ(Exp<A>(0.0), 1.0);
  EXPECT_EQ(Exp<A>(-0.0), 1.0);
  EXPECT_EQ(Exp<A>(-800.0), 0.0);
  EXPECT_EQ(Exp<A>(800.0), HUGE_VAL);
  // Not finite (a bad statistic's entropies reach here before the statistic is refused): no
  // conversion of a NaN to int, which clang's UBSan (float-cast-overflow) aborts on.
  EXPECT_EQ(Exp<A>(HUGE_VAL), HUGE_VAL);
  EXPECT_EQ(Exp<A>(-HUGE_VAL), 0.0);
  EXPECT_TRUE(std::isnan(Exp<A>(std::numeric_limits<double>::quiet_NaN())));
  // Subnormal results: the library's, to one ulp of the smallest subnormal.
  EXPECT_LE(UlpDistance(Exp<A>(-740.0), std::exp(-740.0)), 1);
}

TEST(PortableMathTest, EntropyOfSumsIsTheFormula) {
  // Four equal values: sum p^2 = 1/4, H_2 = ln 4.
  EXPECT_NEAR(EntropyOfSums<A>(4.0, 4.0, 2.0, 4), std::log(4.0), 1e-11);
  // A one-hot row: H = 0 up to the guard.
  EXPECT_NEAR(EntropyOfSums<A>(3.0, 9.0, 2.0, 10), 0.0, 1e-11);
  EXPECT_NEAR(EntropyOfSums<A>(3.0, 3.0, std::numeric_limits<double>::infinity(), 10), 0.0, 1e-11);
  // Shannon: ln(total) - sum(x ln x) / total; two values of 1: ln 2.
  EXPECT_NEAR(EntropyOfSums<A>(2.0, 0.0, 1.0, 2), std::log(2.0), 1e-15);
  // No mass: the maximal entropy ln(support), and ln 1 = 0 for an empty support.
  EXPECT_EQ(EntropyOfSums<A>(0.0, 0.0, 2.0, 8), Log<A>(8.0));
  EXPECT_EQ(EntropyOfSums<A>(0.0, 0.0, 2.0, 0), 0.0);
}

TEST(PortableMathTest, SoftminWeightsSumToOneAndFavourLowEntropy) {
  const std::vector<double> entropies = {2.0, 1.0, 3.0, 1.0};
  std::vector<double> weights(entropies.size());
  SoftminWeights<A>(entropies.data(), 4, 0.5, weights.data());
  double sum = 0.0;
  for (const double w : weights) sum += w;
  EXPECT_NEAR(sum, 1.0, 1e-15);
  EXPECT_EQ(weights[1], weights[3]);
  EXPECT_GT(weights[1], weights[0]);
  EXPECT_GT(weights[0], weights[2]);
  const double z = 2.0 + std::exp(-2.0) + std::exp(-4.0);
  EXPECT_NEAR(weights[1], 1.0 / z, 1e-15);
  EXPECT_NEAR(weights[2], std::exp(-4.0) / z, 1e-15);
}

}  // namespace
}  // namespace entrokv::portable
