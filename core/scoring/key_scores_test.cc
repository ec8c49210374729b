#include "core/scoring/key_scores.h"

#include <cmath>
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

TEST(KeyScoresTest, NamesParseAndBadOnesAreRefusedByName) {
  EXPECT_EQ(*ParseKeyScore("keydiff"), KeyScore::kKeyDiff);
  EXPECT_EQ(*ParseKeyScore("norm"), KeyScore::kNorm);
  EXPECT_EQ(KeyScoreName(KeyScore::kNorm), "norm");
  EXPECT_THAT(ParseKeyScore("cosine"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"cosine\"")));
}

}  // namespace
}  // namespace entrokv
