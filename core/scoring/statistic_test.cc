#include "core/scoring/statistic.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

TEST(StatisticViewTest, Float32RowsAreViewsWithoutCopy) {
  std::vector<float> data = {1, 2, 3, 4, 5, 6};
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView view,
                               StatisticView::Create(data.data(), DType::kFloat32, 2, 3));
  std::vector<float> scratch;
  const std::span<const float> row = view.Row(1, &scratch);
  EXPECT_EQ(row.data(), data.data() + 3);
  EXPECT_TRUE(scratch.empty());
}

TEST(StatisticViewTest, HalfPrecisionRowsAreWidenedExactly) {
  std::vector<uint16_t> half = {FloatToFloat16(0.5f), FloatToFloat16(0.25f)};
  std::vector<uint16_t> brain = {FloatToBFloat16(3.0f), FloatToBFloat16(0.125f)};
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView f16,
                               StatisticView::Create(half.data(), DType::kFloat16, 1, 2));
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView bf16,
                               StatisticView::Create(brain.data(), DType::kBFloat16, 2, 1));
  std::vector<float> scratch;
  EXPECT_EQ(f16.Row(0, &scratch)[1], 0.25f);
  EXPECT_EQ(bf16.Row(1, &scratch)[0], 0.125f);
}

TEST(StatisticViewTest, RejectsBadShapes) {
  float x = 0;
  EXPECT_THAT(StatisticView::Create(nullptr, DType::kFloat32, 1, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no data")));
  EXPECT_THAT(StatisticView::Create(&x, DType::kFloat32, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("query_heads")));
  EXPECT_THAT(StatisticView::Create(&x, DType::kFloat32, 1, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens")));
}

TEST(StatisticViewTest, ValidateValuesNamesTheBadEntry) {
  for (const float bad :
       {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> data = {0, 1, 2, 3, 4, 5};
    data[4] = bad;
    ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView view,
                                 StatisticView::Create(data.data(), DType::kFloat32, 2, 3));
    EXPECT_THAT(view.ValidateValues(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head 1, token 1")));
  }
  std::vector<uint16_t> half = {FloatToFloat16(1.0f), 0x7e00};  // NaN in float16
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView view,
                               StatisticView::Create(half.data(), DType::kFloat16, 1, 2));
  EXPECT_THAT(view.ValidateValues(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head 0, token 1")));
}

// Two chunks of a 2-head prefill: 3 tokens after the first, 5 after the second. The second
// chunk's columns add to the first's; tokens 3 and 4 start at 0.
TEST(AddChunkTest, ChunksAddColumnByColumn) {
  const std::vector<float> first = {1, 2, 3, 10, 20, 30};
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView first_view,
                               StatisticView::Create(first.data(), DType::kFloat32, 2, 3));
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::vector<float> running, AddChunk(first_view, {}));
  EXPECT_EQ(running, first);
  const std::vector<float> second = {0.5, 0.5, 0.5, 4, 5, 1, 1, 1, 6, 7};
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView second_view,
                               StatisticView::Create(second.data(), DType::kFloat32, 2, 5));
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::vector<float> sum, AddChunk(second_view, running));
  EXPECT_THAT(sum, ::testing::ElementsAre(1.5, 2.5, 3.5, 4, 5, 11, 21, 31, 6, 7));
}

TEST(AddChunkTest, BadChunksAndSumsAreRefused) {
  const std::vector<float> bad = {1, -2, 3, 4};
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView view,
                               StatisticView::Create(bad.data(), DType::kFloat32, 2, 2));
  // A negative chunk value is refused even where the running sum would have covered it.
  const std::vector<float> running = {5, 5, 5, 5};
  EXPECT_THAT(AddChunk(view, running),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head 0, token 1")));
  const std::vector<float> good = {1, 2, 3, 4};
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView good_view,
                               StatisticView::Create(good.data(), DType::kFloat32, 2, 2));
  const std::vector<float> longer = {1, 1, 1, 1, 1, 1};  // 3 tokens of a 2-token chunk
  EXPECT_THAT(AddChunk(good_view, longer),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("at most 2 tokens")));
  const std::vector<float> ragged = {1, 1, 1};
  EXPECT_THAT(AddChunk(good_view, ragged),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("3 values")));
}

// Head 0: sent {1, 3} (1/4, 3/4) and keys {2, 2} (1/2, 1/2); head 1 sends zeros, so its keys'
// row alone, scaled by its weight, remains. Half-precision rows are widened first.
TEST(MixRowsTest, EachHeadAveragesItsTwoRowsScaledToSumOne) {
  const std::vector<float> sent = {1, 3, 0, 0};
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView view,
                               StatisticView::Create(sent.data(), DType::kFloat32, 2, 2));
  std::vector<float> keys = {2, 2, 1, 3};
  ASSERT_TRUE(MixRows(view, 0.5, MixRule::kAverage, keys).ok());
  EXPECT_THAT(keys, ::testing::ElementsAre(0.375F, 0.625F, 0.125F, 0.375F));
  std::vector<float> weighted = {2, 2, 1, 3};
  ASSERT_TRUE(MixRows(view, 0.25, MixRule::kAverage, weighted).ok());
  EXPECT_THAT(weighted, ::testing::ElementsAre(0.3125F, 0.6875F, 0.0625F, 0.1875F));
  const std::vector<uint16_t> half = {FloatToFloat16(1), FloatToFloat16(3)};
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView half_view,
                               StatisticView::Create(half.data(), DType::kFloat16, 1, 2));
  std::vector<float> one = {2, 2};
  ASSERT_TRUE(MixRows(half_view, 0.5, MixRule::kAverage, one).ok());
  EXPECT_THAT(one, ::testing::ElementsAre(0.375F, 0.625F));
}

// The same rows as above, each token's larger scaled score: head 0 keeps the keys' 1/4 at
// token 0 and the sent 3/8 at token 1; with 25% on the keys, their 1/8 loses to the sent 3/16.
TEST(MixRowsTest, TheMaxRuleKeepsEachTokensLargerScaledScore) {
  const std::vector<float> sent = {1, 3, 0, 0};
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView view,
                               StatisticView::Create(sent.data(), DType::kFloat32, 2, 2));
  std::vector<float> keys = {2, 2, 1, 3};
  ASSERT_TRUE(MixRows(view, 0.5, MixRule::kMax, keys).ok());
  EXPECT_THAT(keys, ::testing::ElementsAre(0.25F, 0.375F, 0.125F, 0.375F));
  std::vector<float> weighted = {2, 2, 1, 3};
  ASSERT_TRUE(MixRows(view, 0.25, MixRule::kMax, weighted).ok());
  EXPECT_THAT(weighted, ::testing::ElementsAre(0.1875F, 0.5625F, 0.0625F, 0.1875F));
}

TEST(MixRowsTest, ABadSentValueIsNamedAndTheKeysAreLeft) {
  const std::vector<float> sent = {1, std::numeric_limits<float>::quiet_NaN()};
  ENTROKV_ASSERT_OK_AND_ASSIGN(StatisticView view,
                               StatisticView::Create(sent.data(), DType::kFloat32, 1, 2));
  std::vector<float> keys = {2, 2};
  EXPECT_THAT(MixRows(view, 0.5, MixRule::kAverage, keys),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head 0, token 1")));
  EXPECT_THAT(keys, ::testing::ElementsAre(2, 2));
}

}  // namespace
}  // namespace entrokv
