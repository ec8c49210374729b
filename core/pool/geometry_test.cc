#include "core/pool/geometry.h"

#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

ModelGeometry Llama70B() {
  return {.layers = 80,
          .query_heads = 64,
          .kv_groups = 8,
          .head_dim = 128,
          .page_size = 16,
          .element_bytes = 2};
}

TEST(GeometryTest, ValidGeometryPasses) { EXPECT_THAT(ValidateGeometry(Llama70B()), IsOk()); }

TEST(GeometryTest, EveryNonPositiveFieldIsNamed) {
  const char* fields[] = {"layers",   "query_heads", "kv_groups",
                          "head_dim", "page_size",   "element_bytes"};
  for (int i = 0; i < 6; ++i) {
    ModelGeometry geometry = Llama70B();
    int* values[] = {&geometry.layers,   &geometry.query_heads, &geometry.kv_groups,
                     &geometry.head_dim, &geometry.page_size,   &geometry.element_bytes};
    *values[i] = 0;
    EXPECT_THAT(ValidateGeometry(geometry),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(fields[i])));
  }
}

TEST(GeometryTest, QueryHeadsMustBeAMultipleOfGroups) {
  ModelGeometry geometry = Llama70B();
  geometry.query_heads = 60;
  geometry.kv_groups = 8;
  EXPECT_THAT(ValidateGeometry(geometry),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("query_heads")));
}

TEST(GeometryTest, FrameBytesPerLayout) {
  // K and V, 16 tokens, 128 dims, 2 bytes.
  EXPECT_EQ(FrameBytes(Llama70B(), FrameLayout::kGroup), 2 * 16 * 128 * 2);
  EXPECT_EQ(FrameBytes(Llama70B(), FrameLayout::kLayer), 2 * 16 * 128 * 2 * 8);
}

TEST(GeometryTest, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseFrameLayout("group"), FrameLayout::kGroup);
  EXPECT_EQ(*ParseFrameLayout("layer"), FrameLayout::kLayer);
  EXPECT_THAT(ParseFrameLayout("page"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("frame_layout")));
  EXPECT_EQ(*ParseBackend("host"), Backend::kHost);
  EXPECT_EQ(*ParseBackend("cuda"), Backend::kCuda);
  EXPECT_THAT(ParseBackend("rocm"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("backend")));
  EXPECT_EQ(FrameLayoutName(FrameLayout::kLayer), "layer");
  EXPECT_EQ(BackendName(Backend::kCuda), "cuda");
}

}  // namespace
}  // namespace entrokv
