#include "core/util/dtype.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

TEST(DTypeTest, Float16RoundTripsEveryFiniteValue) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    const float wide = Float16ToFloat(half);
    if (std::isnan(wide)) continue;
    EXPECT_EQ(FloatToFloat16(wide), half) << "bits " << bits;
  }
}

TEST(DTypeTest, Float16KnownValues) {
  EXPECT_EQ(Float16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Float16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(Float16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Float16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(Float16ToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(Float16ToFloat(0x7e00)));
  EXPECT_EQ(FloatToFloat16(1e6f), 0x7c00);
  EXPECT_EQ(FloatToFloat16(1e-9f), 0x0000);
}

TEST(DTypeTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f)), 1.0f);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie goes to even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  for (uint32_t bits = 0; bits < 0x10000u; bits += 7) {
    const float wide = BFloat16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(wide)) continue;
    EXPECT_EQ(FloatToBFloat16(wide), bits);
  }
}

TEST(DTypeTest, ParseNamesEveryTypeAndRejectsOthers) {
  EXPECT_EQ(*ParseDType("f32"), DType::kFloat32);
  EXPECT_EQ(*ParseDType("float16"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
  EXPECT_THAT(ParseDType("int8"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
}

}  // namespace
}  // namespace entrokv
