#include "core/scoring/key_scores.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;

std::vector<float> Scores(KeyScore score, const std::vector<float>& keys, int head_dim,
                          const std::vector<uint8_t>& present) {
  std::vector<float> out(present.size(), -1.0F);
  ScoreKeys(score, keys, head_dim, present, out);
  return out;
}

// Two keys along x and one along y: the anchor is (2, 1) / sqrt(5) in direction, so the y key
// is the most distinct (1 - 1/sqrt(5)) and the x keys the least (1 - 2/sqrt(5)). A token whose
// key is gone scores 0 and leaves the anchor as it was; a zero key scores 1.
TEST(KeyScoresTest, KeyDiffScoresDistanceFromTheAverageDirection) {
  const std::vector<float> keys = {3, 0, 0.5F, 0, 0, 2, 0, 7, 0, 0};
  const std::vector<uint8_t> present = {1, 1, 1, 0, 1};
  const float x = static_cast<float>(1.0 - 2.0 / std::sqrt(5.0));
  const float y = static_cast<float>(1.0 - 1.0 / std::sqrt(5.0));
  EXPECT_THAT(Scores(KeyScore::kKeyDiff, keys, 2, present),
              Pointwise(FloatNear(1e-6F), std::vector<float>{x, x, y, 0.0F, 1.0F}));
  // Scale does not matter: only directions do.
  std::vector<float> scaled = keys;
  for (float& value : scaled) value *= 40.0F;
  EXPECT_THAT(Scores(KeyScore::kKeyDiff, scaled, 2, present),
              Pointwise(FloatNear(1e-6F), std::vector<float>{x, x, y, 0.0F, 1.0F}));
}

TEST(KeyScoresTest, KeyDiffOfOppositeKeysIsOneForEach) {
  // The anchor is zero: no direction is common, every key is as distinct as any other.
  EXPECT_THAT(Scores(KeyScore::kKeyDiff, {1, 0, -1, 0}, 2, {1, 1}),
              Pointwise(FloatNear(1e-6F), std::vector<float>{1.0F, 1.0F}));
}

TEST(KeyScoresTest, NormKeepsSmallKeys) {
  EXPECT_THAT(Scores(KeyScore::kNorm, {3, 4, 0, 0, 1, 0}, 2, {1, 1, 0}),
              Pointwise(FloatNear(1e-7F), std::vector<float>{1.0F / 6.0F, 1.0F, 0.0F}));
}

// Head dim 2, mean (2, 0): exponents k_x * 2 / sqrt(2) (+ the covariance's k'Sk / 4), softmax
// over the tokens present; a token whose key is gone scores 0 and takes no share.
TEST(KeyScoresTest, ExpectedAttentionIsTheSoftmaxOfTheExpectedExponents) {
  const std::vector<float> keys = {1, 0, 0, 1, -1, 0, 5, 5};
  const std::vector<uint8_t> present = {1, 1, 1, 0};
  const std::vector<float> mean = {2, 0};
  auto softmax = [](std::vector<double> e) {
    double total = 0.0;
    for (double& v : e) total += (v = std::exp(v));
    std::vector<float> out;
    for (const double v : e) out.push_back(static_cast<float>(v / total));
    out.push_back(0.0F);
    return out;
  };
  const double a = 2.0 / std::sqrt(2.0);
  std::vector<float> out(4, -1.0F);
  ScoreExpectedAttention(keys, 2, present, mean, {}, out);
  EXPECT_THAT(out, Pointwise(FloatNear(1e-6F), softmax({a, 0.0, -a})));
  // Covariance diag(0, 8): k'Sk / (2 d) = 8 k_y^2 / 4 lifts the y key by 2.
  const std::vector<float> covariance = {0, 0, 0, 8};
  ScoreExpectedAttention(keys, 2, present, mean, covariance, out);
  EXPECT_THAT(out, Pointwise(FloatNear(1e-6F), softmax({a, 2.0, -a})));
  // The same covariance as a factor F = [0, sqrt(8)] (S = F'F), and as a rank-2 factor of a
  // full S = A'A: each gives what S itself gives.
  const std::vector<float> factor = {0, std::sqrt(8.0F)};
  std::vector<float> from_factor(4, -1.0F);
  ScoreExpectedAttention(keys, 2, present, mean, factor, from_factor, 1);
  EXPECT_THAT(from_factor, Pointwise(FloatNear(1e-6F), out));
  const std::vector<float> f = {1, 2, -0.5F, 1.5F};  // rows of F
  const std::vector<float> full = {f[0] * f[0] + f[2] * f[2], f[0] * f[1] + f[2] * f[3],
                                   f[0] * f[1] + f[2] * f[3], f[1] * f[1] + f[3] * f[3]};
  std::vector<float> from_full(4, -1.0F);
  ScoreExpectedAttention(keys, 2, present, mean, full, from_full);
  ScoreExpectedAttention(keys, 2, present, mean, f, from_factor, 2);
  EXPECT_THAT(from_factor, Pointwise(FloatNear(1e-6F), from_full));
  // Large exponents do not overflow: only their differences count.
  const std::vector<float> far = {1000, 0};
  ScoreExpectedAttention(keys, 2, present, far, {}, out);
  EXPECT_NEAR(out[0], 1.0F, 1e-6F);
  EXPECT_FALSE(std::isnan(out[2]));
}

// Many tokens (not a multiple of the 8 scored at once), a wider head, random keys, covariance
// and factor, some keys gone: the scores are the double-precision formula's. A gone key full of
// NaN changes nobody's score.
TEST(KeyScoresTest, ExpectedAttentionOfManyTokensIsTheFormulasInDouble) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> value(-1.0F, 1.0F);
  for (const int head_dim : {1, 5, 24}) {
    const size_t tokens = 37;
    std::vector<float> keys(tokens * head_dim);
    for (float& v : keys) v = value(rng);
    std::vector<uint8_t> present(tokens, 1);
    present[3] = present[17] = present[36] = 0;
    for (int d = 0; d < head_dim; ++d) keys[17 * head_dim + d] = std::nanf("");
    std::vector<float> mean(head_dim), factor(3 * head_dim), covariance(head_dim * head_dim);
    for (float& v : mean) v = value(rng);
    for (float& v : factor) v = value(rng);
    for (float& v : covariance) v = value(rng);  // not symmetric: k'Sk as written
    for (const int rank : {0, 3}) {
      const std::vector<float>& matrix = rank > 0 ? factor : covariance;
      std::vector<double> exponents;
      for (size_t t = 0; t < tokens; ++t) {
        if (present[t] == 0) continue;
        const float* k = &keys[t * head_dim];
        double linear = 0.0, quadratic = 0.0;
        for (int d = 0; d < head_dim; ++d) linear += double{mean[d]} * k[d];
        for (int i = 0; i < (rank > 0 ? rank : head_dim); ++i) {
          double row = 0.0;
          for (int d = 0; d < head_dim; ++d) row += double{matrix[i * head_dim + d]} * k[d];
          quadratic += (rank > 0 ? row : double{k[i]}) * row;
        }
        exponents.push_back(linear / std::sqrt(double(head_dim)) + quadratic / (2.0 * head_dim));
      }
      const double largest = *std::max_element(exponents.begin(), exponents.end());
      double total = 0.0;
      for (const double e : exponents) total += std::exp(e - largest);
      std::vector<float> want;
      for (size_t t = 0, i = 0; t < tokens; ++t) {
        want.push_back(present[t] == 0
                           ? 0.0F
                           : static_cast<float>(std::exp(exponents[i++] - largest) / total));
      }
      std::vector<float> out(tokens, -1.0F);
      ScoreExpectedAttention(keys, head_dim, present, mean, matrix, out, rank);
      SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim << " rank " << rank);
      for (size_t t = 0; t < tokens; ++t) {
        EXPECT_NEAR(out[t], want[t], 1e-5 * want[t] + 1e-7) << "token " << t;
      }
    }
  }
}

TEST(KeyScoresTest, NamesParseAndBadOnesAreRefusedByName) {
  EXPECT_EQ(*ParseKeyScore("keydiff"), KeyScore::kKeyDiff);
  EXPECT_EQ(*ParseKeyScore("norm"), KeyScore::kNorm);
  EXPECT_EQ(KeyScoreName(KeyScore::kNorm), "norm");
  EXPECT_THAT(ParseKeyScore("cosine"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"cosine\"")));
}

}  // namespace
}  // namespace entrokv
