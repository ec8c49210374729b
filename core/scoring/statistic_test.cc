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

}  // namespace
}  // namespace entrokv
