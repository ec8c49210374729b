#include "wire/resolve.h"

#include <limits>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/convert.h"

namespace entrokv::wire {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Optional;

// Defaults as entrokvd fills them from its flags' defaults.
Defaults DaemonLikeDefaults() {
  Defaults defaults;
  defaults.policy = "page_entrokv";
  defaults.policy_options.tau = 0.5;
  defaults.policy_options.alpha = 2.0;
  defaults.policy_options.sink_tokens = 4;
  defaults.policy_options.protections.tail_page = true;
  defaults.pool_capacity_bytes = int64_t{1} << 30;
  return defaults;
}

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

TEST(ResolvePoolTest, FillsDefaultsAndRoundsToFrames) {
  Defaults defaults = DaemonLikeDefaults();
  defaults.frame_layout = FrameLayout::kLayer;
  defaults.limits.max_sequences_per_model = 7;
  v1::RegisterModelRequest request = GoodRegister();
  request.set_capacity_bytes((1 << 20) + 7);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const CacheOptions options, ResolvePool(request, defaults));
  EXPECT_EQ(options.name, "qwen");
  EXPECT_EQ(options.geometry.kv_groups, 2);
  EXPECT_EQ(options.layout, FrameLayout::kLayer);
  EXPECT_EQ(options.backend, Backend::kHost);
  EXPECT_EQ(options.limits.max_sequences_per_model, 7);
  EXPECT_EQ(options.capacity_bytes % FrameBytes(options.geometry, options.layout), 0);
  EXPECT_LE(options.capacity_bytes, (1 << 20) + 7);
  EXPECT_GT(options.capacity_bytes + FrameBytes(options.geometry, options.layout), (1 << 20) + 7);

  // What the request sets wins over the defaults; 0 bytes asks for the default capacity.
  request.set_frame_layout(v1::FRAME_LAYOUT_GROUP);
  request.set_capacity_bytes(0);
  defaults.pool_capacity_bytes = 1 << 16;
  ENTROKV_ASSERT_OK_AND_ASSIGN(const CacheOptions group, ResolvePool(request, defaults));
  EXPECT_EQ(group.layout, FrameLayout::kGroup);
  EXPECT_EQ(group.capacity_bytes, 1 << 16);
}

TEST(ResolvePoolTest, NamesTheBadField) {
  const Defaults defaults = DaemonLikeDefaults();
  v1::RegisterModelRequest request = GoodRegister();
  request.mutable_geometry()->set_query_heads(3);
  EXPECT_THAT(ResolvePool(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("geometry")));
  request = GoodRegister();
  request.clear_geometry();
  EXPECT_THAT(ResolvePool(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, Eq("geometry: must be set")));
  request = GoodRegister();
  request.set_capacity_bytes(3);
  EXPECT_THAT(ResolvePool(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("capacity_bytes")));
  request.set_capacity_bytes(std::numeric_limits<uint64_t>::max());
  EXPECT_THAT(ResolvePool(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, Eq("capacity_bytes: too large")));
  request = GoodRegister();
  request.set_frame_layout(static_cast<v1::FrameLayout>(9));
  EXPECT_THAT(ResolvePool(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, Eq("frame_layout: unknown value 9")));
  request = GoodRegister();
  request.set_backend(static_cast<v1::Backend>(9));
  EXPECT_THAT(ResolvePool(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, Eq("backend: unknown value 9")));
  request = GoodRegister();
  request.set_model_id("a b");
  EXPECT_THAT(ResolvePool(request, defaults),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model_id")));
}

// A request built from core types reads back as the pool it describes.
TEST(ResolvePoolTest, ReadsBackToRegisterRequest) {
  const Defaults defaults = DaemonLikeDefaults();
  PoolRequest pool;
  pool.geometry = ModelGeometry{.layers = 2,
                                .query_heads = 8,
                                .kv_groups = 2,
                                .head_dim = 16,
                                .page_size = 32,
                                .element_bytes = 2};
  pool.capacity_bytes = 1 << 20;
  pool.layout = FrameLayout::kLayer;
  pool.backend = Backend::kHost;
  const v1::RegisterModelRequest request = ToRegisterRequest("m", pool);
  EXPECT_EQ(request.frame_layout(), v1::FRAME_LAYOUT_LAYER);
  EXPECT_EQ(request.backend(), v1::BACKEND_HOST);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const CacheOptions options, ResolvePool(request, defaults));
  EXPECT_EQ(options.name, "m");
  EXPECT_EQ(options.geometry.query_heads, 8);
  EXPECT_EQ(options.geometry.page_size, 32);
  EXPECT_EQ(options.layout, FrameLayout::kLayer);
  EXPECT_EQ(options.capacity_bytes, 1 << 20);  // a whole number of 4 KiB frames
  // Unset: the daemon's defaults, not values the client made up.
  PoolRequest unset;
  unset.geometry = pool.geometry;
  const v1::RegisterModelRequest bare = ToRegisterRequest("m", unset);
  EXPECT_EQ(bare.frame_layout(), v1::FRAME_LAYOUT_UNSPECIFIED);
  EXPECT_EQ(bare.backend(), v1::BACKEND_UNSPECIFIED);
  EXPECT_EQ(bare.capacity_bytes(), 0u);
}

TEST(ResolvePolicyTest, OverridesDefaultsAndNamesFields) {
  const Defaults defaults = DaemonLikeDefaults();
  v1::PolicyParams params;
  params.set_tau(2.0);
  params.set_protect_tail_page(false);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ResolvedPolicy resolved, ResolvePolicy(params, defaults, 16));
  EXPECT_EQ(resolved.policy->name(), "page_entrokv");
  EXPECT_DOUBLE_EQ(resolved.options.tau, 2.0);
  EXPECT_DOUBLE_EQ(resolved.options.alpha, 2.0);
  EXPECT_EQ(resolved.options.sink_tokens, 4);
  EXPECT_EQ(resolved.options.page_size, 16);
  EXPECT_FALSE(resolved.options.protections.tail_page);

  params.set_name("nope");
  EXPECT_THAT(ResolvePolicy(params, defaults, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.name")));
  params.set_name("");
  params.set_tau(-1);
  EXPECT_THAT(ResolvePolicy(params, defaults, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.tau")));
}

TEST(ResolvePolicyTest, NeighbourhoodPoolingIsTakenAndBadValuesAreNamed) {
  const Defaults defaults = DaemonLikeDefaults();
  v1::PolicyParams params;
  ENTROKV_ASSERT_OK_AND_ASSIGN(ResolvedPolicy resolved, ResolvePolicy(params, defaults, 16));
  EXPECT_EQ(resolved.options.neighbourhood_kernel, 1);  // off unless asked
  params.set_neighbourhood_kernel(7);
  params.set_neighbourhood_pooling(v1::NEIGHBOURHOOD_POOLING_MEAN);
  ENTROKV_ASSERT_OK_AND_ASSIGN(resolved, ResolvePolicy(params, defaults, 16));
  EXPECT_EQ(resolved.options.neighbourhood_kernel, 7);
  EXPECT_EQ(resolved.options.neighbourhood, NeighbourhoodKind::kMean);
  for (const int kernel : {0, 2, -1, 65}) {
    params.set_neighbourhood_kernel(kernel);
    EXPECT_THAT(
        ResolvePolicy(params, defaults, 16),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.neighbourhood_kernel")))
        << kernel;
  }
  params.set_neighbourhood_kernel(3);
  params.set_neighbourhood_pooling(static_cast<v1::NeighbourhoodPooling>(9));
  EXPECT_THAT(
      ResolvePolicy(params, defaults, 16),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.neighbourhood_pooling")));
}

// 4 layers of 2 KV groups in pages of 16 tokens: the budgets' model.
ModelGeometry BudgetGeometry() {
  return ModelGeometry{.layers = 4,
                       .query_heads = 4,
                       .kv_groups = 2,
                       .head_dim = 8,
                       .page_size = 16,
                       .element_bytes = 2};
}

TEST(ResolveBudgetTest, ExplicitAndPlanned) {
  const ModelGeometry geometry = BudgetGeometry();
  v1::Budget budget;
  EXPECT_THAT(ResolveBudget(budget, false, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budget")));
  budget.set_pages_per_group(5);
  ENTROKV_ASSERT_OK_AND_ASSIGN(ResolvedBudget quotas, ResolveBudget(budget, true, geometry, 1024));
  EXPECT_EQ(quotas.pages_per_layer, std::vector<int64_t>(4, 5));
  budget.set_fraction(0.25);  // P = floor(0.25 * 1024 * 4 / 16) = 64, 16 per layer
  ENTROKV_ASSERT_OK_AND_ASSIGN(quotas, ResolveBudget(budget, true, geometry, 1024));
  EXPECT_EQ(quotas.pages_per_layer, std::vector<int64_t>(4, 16));
  budget.set_allocator("pyramid");  // weights 4:3:2:1 over the 60 pages beyond the first four
  ENTROKV_ASSERT_OK_AND_ASSIGN(quotas, ResolveBudget(budget, true, geometry, 1024));
  EXPECT_EQ(quotas.pages_per_layer, (std::vector<int64_t>{25, 19, 13, 7}));
  budget.set_allocator("");
  budget.set_token_slots(4 * 2 * 16 * 10);  // 10 pages per layer
  ENTROKV_ASSERT_OK_AND_ASSIGN(quotas, ResolveBudget(budget, true, geometry, 1024));
  EXPECT_EQ(quotas.pages_per_layer, std::vector<int64_t>(4, 10));
  budget.set_fraction(1.5);
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       Eq("budget.fraction: must be in (0, 1], got 1.5")));
  budget.set_pages_per_group(0);
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pages_per_group")));
  budget.set_token_slots(1);  // below one page per layer
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budget: ")));
  budget.set_fraction(0.5);
  budget.set_allocator("zigzag");
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budget.allocator")));
}

TEST(ResolveBudgetTest, MassPlansTheUniformPagesAndMovesThemWithAFloor) {
  const ModelGeometry geometry = BudgetGeometry();
  v1::Budget budget;
  budget.set_fraction(0.25);
  budget.set_allocator("mass");
  ENTROKV_ASSERT_OK_AND_ASSIGN(ResolvedBudget quotas, ResolveBudget(budget, true, geometry, 1024));
  EXPECT_EQ(quotas.pages_per_layer, std::vector<int64_t>(4, 16));  // the decision moves them
  EXPECT_THAT(quotas.mass_floor, Optional(0.5));
  budget.set_layer_floor(0.2);
  ENTROKV_ASSERT_OK_AND_ASSIGN(quotas, ResolveBudget(budget, true, geometry, 1024));
  EXPECT_THAT(quotas.mass_floor, Optional(0.2));
  budget.set_allocator("uniform");  // a floor without the allocator it is for
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budget.layer_floor")));
  budget.clear_layer_floor();
  ENTROKV_ASSERT_OK_AND_ASSIGN(quotas, ResolveBudget(budget, true, geometry, 1024));
  EXPECT_EQ(quotas.mass_floor, std::nullopt);
  budget.set_layer_floor(0.2);
  budget.set_allocator("");
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       Eq("budget.layer_floor: only with allocator \"mass\"")));
  budget.set_allocator("mass");
  budget.set_layer_floor(1.5);
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       Eq("budget.layer_floor: must be in [0, 1], got 1.5")));
  budget.clear_layer_floor();
  budget.set_pages_per_group(3);  // an allocator spreads a fraction or token slots only
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("budget.allocator: only with fraction or token_slots")));
}

TEST(ResolveScopeTest, RequestThenDefaultThenThePoolsLayout) {
  Defaults defaults = DaemonLikeDefaults();
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
}  // namespace entrokv::wire
