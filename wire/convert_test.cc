#include "wire/convert.h"

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::wire {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::Eq;
using ::testing::HasSubstr;

TEST(ConvertTest, EveryCoreValueRoundTrips) {
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    EXPECT_EQ(*ToDType("dtype", ToProto(dtype)), dtype) << DTypeName(dtype);
  }
  for (const FrameLayout layout : {FrameLayout::kGroup, FrameLayout::kLayer}) {
    EXPECT_EQ(*ToFrameLayout("frame_layout", ToProto(layout)), layout);
  }
  for (const Backend backend : {Backend::kHost, Backend::kCuda}) {
    EXPECT_EQ(*ToBackend("backend", ToProto(backend)), backend);
  }
  for (const SelectionScope scope : {SelectionScope::kGroup, SelectionScope::kLayer}) {
    EXPECT_EQ(*ToSelectionScope("scope", ToProto(scope)), scope);
  }
  const ModelGeometry geometry{.layers = 3,
                               .query_heads = 8,
                               .kv_groups = 2,
                               .head_dim = 64,
                               .page_size = 32,
                               .element_bytes = 1};
  const ModelGeometry back = ToGeometry(ToProto(geometry));
  EXPECT_EQ(back.layers, 3);
  EXPECT_EQ(back.query_heads, 8);
  EXPECT_EQ(back.kv_groups, 2);
  EXPECT_EQ(back.head_dim, 64);
  EXPECT_EQ(back.page_size, 32);
  EXPECT_EQ(back.element_bytes, 1);
}

TEST(ConvertTest, CoreValuesMapToTheirOwnWireValues) {
  EXPECT_EQ(ToProto(DType::kFloat32), v1::DTYPE_FLOAT32);
  EXPECT_EQ(ToProto(DType::kFloat16), v1::DTYPE_FLOAT16);
  EXPECT_EQ(ToProto(DType::kBFloat16), v1::DTYPE_BFLOAT16);
  EXPECT_EQ(ToProto(FrameLayout::kLayer), v1::FRAME_LAYOUT_LAYER);
  EXPECT_EQ(ToProto(Backend::kCuda), v1::BACKEND_CUDA);
  EXPECT_EQ(ToProto(SelectionScope::kLayer), v1::SELECTION_SCOPE_LAYER);
  EXPECT_EQ(ToProto(StatisticKind::kLastRow), v1::STATISTIC_KIND_LAST_ROW);
  EXPECT_EQ(ToProto(StatisticKind::kWindowMean), v1::STATISTIC_KIND_WINDOW_MEAN);
  EXPECT_EQ(ToProto(StatisticKind::kAccumulated), v1::STATISTIC_KIND_ACCUMULATED);
}

// An unknown or unspecified wire value is refused, naming the field: never read as a default
// (an unknown dtype read as float32 would score bf16 bytes as floats).
TEST(ConvertTest, UnknownAndUnspecifiedValuesAreRefused) {
  for (const v1::DType dtype : {v1::DTYPE_UNSPECIFIED, static_cast<v1::DType>(9)}) {
    EXPECT_THAT(ToDType("layers[0].statistic.dtype", dtype),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("layers[0].statistic.dtype: must be FLOAT32, FLOAT16 or "
                                   "BFLOAT16, got ")));
  }
  EXPECT_THAT(ToFrameLayout("frame_layout", static_cast<v1::FrameLayout>(9)),
              StatusIs(absl::StatusCode::kInvalidArgument, Eq("frame_layout: unknown value 9")));
  EXPECT_THAT(ToFrameLayout("frame_layout", v1::FRAME_LAYOUT_UNSPECIFIED),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("frame_layout")));
  EXPECT_THAT(ToBackend("backend", static_cast<v1::Backend>(9)),
              StatusIs(absl::StatusCode::kInvalidArgument, Eq("backend: unknown value 9")));
  EXPECT_THAT(ToBackend("backend", v1::BACKEND_UNSPECIFIED),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("backend")));
  EXPECT_THAT(ToSelectionScope("policy.scope", static_cast<v1::SelectionScope>(7)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       Eq("policy.scope: unknown value 7, expected SELECTION_SCOPE_GROUP or "
                          "SELECTION_SCOPE_LAYER")));
  EXPECT_THAT(ToSelectionScope("policy.scope", v1::SELECTION_SCOPE_UNSPECIFIED),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.scope")));
}

TEST(ConvertTest, NamesAreTheCoresAndSayWhatIsUnset) {
  EXPECT_EQ(LayoutName(v1::FRAME_LAYOUT_GROUP), "group");
  EXPECT_EQ(LayoutName(v1::FRAME_LAYOUT_LAYER), "layer");
  EXPECT_EQ(LayoutName(v1::FRAME_LAYOUT_UNSPECIFIED), "default");
  EXPECT_EQ(LayoutName(static_cast<v1::FrameLayout>(9)), "unknown(9)");
  EXPECT_EQ(BackendName(v1::BACKEND_HOST), "host");
  EXPECT_EQ(BackendName(v1::BACKEND_CUDA), "cuda");
  EXPECT_EQ(BackendName(v1::BACKEND_UNSPECIFIED), "default");
  EXPECT_EQ(ScopeName(v1::SELECTION_SCOPE_GROUP), "group");
  EXPECT_EQ(ScopeName(v1::SELECTION_SCOPE_LAYER), "layer");
  EXPECT_EQ(ScopeName(v1::SELECTION_SCOPE_UNSPECIFIED), "auto");
  EXPECT_EQ(ScopeName(static_cast<v1::SelectionScope>(5)), "unknown(5)");
}

}  // namespace
}  // namespace entrokv::wire
