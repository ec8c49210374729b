#include "service/validation.h"

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::service {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

v1::RegisterModelRequest GoodRegister() {
  v1::RegisterModelRequest request;
  request.set_model_id("qwen");
  v1::ModelGeometry* g = request.mutable_geometry();
  g->set_layers(4);
  g->set_query_heads(4);
  g->set_kv_groups(2);
  g->set_head_dim(8);
  g->set_page_size(16);
  g->set_element_bytes(2);
  request.set_capacity_bytes(1 << 20);
  return request;
}

TEST(ValidateIdTest, AcceptsAndRejects) {
  EXPECT_THAT(ValidateId("model_id", "org/model-1.5b:v2"), IsOk());
  EXPECT_THAT(ValidateId("model_id", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model_id")));
  EXPECT_THAT(ValidateId("sequence_id", std::string(129, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sequence_id")));
  EXPECT_THAT(ValidateId("sequence_id", "a b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sequence_id")));
}

TEST(ToCacheOptionsTest, FillsDefaultsAndRoundsToFrames) {
  ServerOptions defaults;
  defaults.frame_layout = FrameLayout::kLayer;
  v1::RegisterModelRequest request = GoodRegister();
  request.set_capacity_bytes((1 << 20) + 7);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const CacheOptions options, ToCacheOptions(request, defaults));
  EXPECT_EQ(options.layout, FrameLayout::kLayer);
  EXPECT_EQ(options.backend, Backend::kHost);
  EXPECT_EQ(options.capacity_bytes % FrameBytes(options.geometry, options.layout), 0);
  EXPECT_LE(options.capacity_bytes, (1 << 20) + 7);
}

TEST(ToCacheOptionsTest, NamesTheBadField) {
  ServerOptions defaults;
  v1::RegisterModelRequest request = GoodRegister();
  request.mutable_geometry()->set_query_heads(3);
  EXPECT_THAT(ToCacheOptions(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("geometry")));
  request = GoodRegister();
  request.clear_geometry();
  EXPECT_THAT(ToCacheOptions(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("geometry")));
  request = GoodRegister();
  request.set_capacity_bytes(3);
  EXPECT_THAT(ToCacheOptions(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("capacity_bytes")));
  request = GoodRegister();
  request.set_frame_layout(static_cast<v1::FrameLayout>(9));
  EXPECT_THAT(ToCacheOptions(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("frame_layout")));
}

TEST(ToDTypeTest, UnspecifiedIsInvalid) {
  EXPECT_THAT(ToDType("statistic.dtype", v1::DTYPE_UNSPECIFIED),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("statistic.dtype")));
  ENTROKV_ASSERT_OK_AND_ASSIGN(const DType dtype, ToDType("d", v1::DTYPE_BFLOAT16));
  EXPECT_EQ(dtype, DType::kBFloat16);
}

TEST(ResolvePolicyTest, OverridesDefaultsAndNamesFields) {
  ServerOptions defaults;
  v1::PolicyParams params;
  params.set_tau(2.0);
  params.set_protect_tail_page(false);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ResolvedPolicy resolved, ResolvePolicy(params, defaults, 16));
  EXPECT_EQ(resolved.policy->name(), "page_entrokv");
  EXPECT_DOUBLE_EQ(resolved.options.tau, 2.0);
  EXPECT_DOUBLE_EQ(resolved.options.alpha, 2.0);
  EXPECT_FALSE(resolved.options.protections.tail_page);

  params.set_name("nope");
  EXPECT_THAT(ResolvePolicy(params, defaults, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.name")));
  params.set_name("");
  params.set_tau(-1);
  EXPECT_THAT(ResolvePolicy(params, defaults, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.tau")));
}

TEST(ResolveBudgetTest, ExplicitAndPlanned) {
  ModelGeometry geometry{.layers = 4,
                         .query_heads = 4,
                         .kv_groups = 2,
                         .head_dim = 8,
                         .page_size = 16,
                         .element_bytes = 2};
  v1::Budget budget;
  EXPECT_THAT(ResolveBudget(budget, false, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budget")));
  budget.set_pages_per_group(5);
  ENTROKV_ASSERT_OK_AND_ASSIGN(ResolvedBudget quotas, ResolveBudget(budget, true, geometry, 1024));
  EXPECT_EQ(quotas.pages_per_layer, std::vector<int64_t>(4, 5));
  budget.set_fraction(0.25);  // P = floor(0.25 * 1024 * 4 / 16) = 64, 16 per layer
  ENTROKV_ASSERT_OK_AND_ASSIGN(quotas, ResolveBudget(budget, true, geometry, 1024));
  EXPECT_EQ(quotas.pages_per_layer, std::vector<int64_t>(4, 16));
  budget.set_fraction(1.5);
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budget.fraction")));
  budget.set_pages_per_group(0);
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pages_per_group")));
}

TEST(ResolveScopeTest, RequestThenFlagThenThePoolsLayout) {
  ServerOptions defaults;
  EXPECT_EQ(*ResolveScope(v1::SELECTION_SCOPE_UNSPECIFIED, defaults, FrameLayout::kLayer),
            SelectionScope::kLayer);
  EXPECT_EQ(*ResolveScope(v1::SELECTION_SCOPE_UNSPECIFIED, defaults, FrameLayout::kGroup),
            SelectionScope::kGroup);
  EXPECT_EQ(*ResolveScope(v1::SELECTION_SCOPE_GROUP, defaults, FrameLayout::kLayer),
            SelectionScope::kGroup);
  EXPECT_EQ(*ResolveScope(v1::SELECTION_SCOPE_LAYER, defaults, FrameLayout::kGroup),
            SelectionScope::kLayer);
  defaults.selection_scope = SelectionScope::kGroup;
  EXPECT_EQ(*ResolveScope(v1::SELECTION_SCOPE_UNSPECIFIED, defaults, FrameLayout::kLayer),
            SelectionScope::kGroup);
  EXPECT_THAT(ResolveScope(static_cast<v1::SelectionScope>(9), defaults, FrameLayout::kLayer),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.scope")));
}

}  // namespace
}  // namespace entrokv::service
