#include "core/scoring/budget.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "core/scoring/pages.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

BudgetRequest Llama8B() {
  BudgetRequest request;
  request.layers = 32;
  request.kv_groups = 8;
  request.page_size = 16;
  return request;
}

TEST(BudgetTest, Llama8BAlignedBudgetIsExact) {
  BudgetRequest request = Llama8B();
  request.token_slots = 32768;
  ENTROKV_ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(request));
  EXPECT_EQ(plan.pages_per_layer, std::vector<int64_t>(32, 8));
  EXPECT_EQ(plan.residual_slots, 0);
}

TEST(BudgetTest, Llama8BUnalignedBudgetPlansByLargestRemainder) {
  BudgetRequest request = Llama8B();
  request.token_slots = 35000;
  ENTROKV_ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(request));
  EXPECT_EQ(plan.planned_slots, 34944);
  EXPECT_EQ(plan.residual_slots, 56);
  EXPECT_EQ(plan.layer_pages, 273);
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(plan.pages_per_layer[l], l < 17 ? 9 : 8) << "layer " << l;
  }
}

TEST(BudgetTest, QuotasAlwaysSumToThePlannedPages) {
  for (const LayerAllocator allocator : {LayerAllocator::kUniform, LayerAllocator::kPyramid}) {
    for (int64_t slots = 32 * 128; slots < 200000; slots += 977) {
      BudgetRequest request = Llama8B();
      request.allocator = allocator;
      request.token_slots = slots;
      ENTROKV_ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(request));
      EXPECT_EQ(
          std::accumulate(plan.pages_per_layer.begin(), plan.pages_per_layer.end(), int64_t{0}),
          slots / 128);
      EXPECT_GE(plan.residual_slots, 0);
      EXPECT_LT(plan.residual_slots, 128);
      EXPECT_GE(*std::min_element(plan.pages_per_layer.begin(), plan.pages_per_layer.end()), 1);
    }
  }
}

TEST(BudgetTest, PyramidGivesLowerLayersMore) {
  BudgetRequest request = Llama8B();
  request.allocator = LayerAllocator::kPyramid;
  request.token_slots = 32 * 128 * 20;
  ENTROKV_ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(request));
  EXPECT_TRUE(std::is_sorted(plan.pages_per_layer.rbegin(), plan.pages_per_layer.rend()));
  EXPECT_GT(plan.pages_per_layer.front(), plan.pages_per_layer.back());
}

TEST(BudgetTest, FractionOfTheSequence) {
  // Qwen2.5-1.5B shape: 28 layers, 2 groups, T = 131072, 20%: P = floor(0.2 * T * 28 / 16).
  BudgetRequest request;
  request.layers = 28;
  request.kv_groups = 2;
  request.page_size = 16;
  request.tokens = 131072;
  request.fraction = 0.2;
  ENTROKV_ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(request));
  EXPECT_EQ(plan.layer_pages, 45875);  // floor(45875.2)
  EXPECT_EQ(std::accumulate(plan.pages_per_layer.begin(), plan.pages_per_layer.end(), int64_t{0}),
            45875);
}

// No layer gets more than its n pages, and what a capped layer cannot take goes to
// the others, so G * P frames are kept whenever P <= L * n.
TEST(BudgetTest, NoLayerGetsMoreThanItsPagesAndTheExcessGoesToTheOthers) {
  BudgetRequest request;
  request.layers = 6;
  request.kv_groups = 4;
  request.page_size = 16;
  request.tokens = 386;  // n = 25
  request.fraction = 0.869;
  request.allocator = LayerAllocator::kPyramid;
  ENTROKV_ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(request));
  EXPECT_EQ(plan.layer_pages, 125);
  EXPECT_EQ(plan.pages_per_layer, (std::vector<int64_t>{25, 25, 25, 24, 17, 9}));

  std::mt19937_64 rng(14);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 2000; ++trial) {
    request.layers = static_cast<int>(pick(1, 40));
    request.kv_groups = static_cast<int>(pick(1, 8));
    request.page_size = static_cast<int>(pick(1, 32));
    request.tokens = pick(1, 5000);
    request.allocator = pick(0, 1) == 0 ? LayerAllocator::kUniform : LayerAllocator::kPyramid;
    const int64_t n = PageCount(request.tokens, request.page_size);
    const int64_t pages = pick(request.layers, request.layers * n + 5);
    request.fraction.reset();
    request.token_slots = pages * request.kv_groups * request.page_size;
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " L " << request.layers << " B " << request.page_size
                 << " T " << request.tokens << " P " << pages);
    ENTROKV_ASSERT_OK_AND_ASSIGN(plan, PlanBudget(request));
    for (const int64_t quota : plan.pages_per_layer) {
      EXPECT_GE(quota, 1);
      EXPECT_LE(quota, n);
    }
    const int64_t kept = std::min(pages, request.layers * n);
    EXPECT_EQ(std::accumulate(plan.pages_per_layer.begin(), plan.pages_per_layer.end(), int64_t{0}),
              kept);
    EXPECT_EQ(plan.layer_pages, kept);
    // The frames kept in the GROUP layout: G * min(K_l, n) per layer.
    int64_t frames = 0;
    for (const int64_t quota : plan.pages_per_layer) {
      frames += request.kv_groups * std::min(quota, n);
    }
    EXPECT_EQ(frames, request.kv_groups * kept);
    if (request.allocator == LayerAllocator::kPyramid) {
      EXPECT_TRUE(std::is_sorted(plan.pages_per_layer.rbegin(), plan.pages_per_layer.rend()));
    }
    if (::testing::Test::HasFailure()) return;
  }
}

// A decimal fraction plans what the formula says, not what its binary double
// floors to: floor(0.03 * 1440 * 5 / 8) = 27 (the double 0.03 is 0.029999..., giving 26).
TEST(BudgetTest, DecimalFractionsPlanExactly) {
  BudgetRequest request;
  request.layers = 5;
  request.kv_groups = 1;
  request.page_size = 8;
  request.tokens = 1440;
  request.fraction = 0.03;
  ENTROKV_ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(request));
  EXPECT_EQ(plan.layer_pages, 27);
  EXPECT_EQ(plan.residual_slots, 0);  // 0.03 * 1440 * 5 * 1 = 216 slots = 27 pages of 8
  request.fraction = 0.1;
  request.tokens = 160;
  request.layers = 1;
  request.page_size = 16;  // 0.1 * 160 / 16 = 1 exactly
  ENTROKV_ASSERT_OK_AND_ASSIGN(plan, PlanBudget(request));
  EXPECT_EQ(plan.layer_pages, 1);
  request.fraction = 1.0;
  request.tokens = 1000;
  request.layers = 3;
  request.page_size = 10;
  ENTROKV_ASSERT_OK_AND_ASSIGN(plan, PlanBudget(request));
  EXPECT_EQ(plan.pages_per_layer, (std::vector<int64_t>{100, 100, 100}));
}

// Values a client can send that once overflowed int64 are refused before any arithmetic.
TEST(BudgetTest, RefusesValuesThatWouldOverflow) {
  BudgetRequest request = Llama8B();
  request.token_slots = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(PlanBudget(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token_slots")));
  request.token_slots = kMaxBudgetTokenSlots;  // the largest accepted: no overflow
  ENTROKV_ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(request));
  EXPECT_EQ(plan.layer_pages, kMaxBudgetTokenSlots / 128);
  request.token_slots.reset();
  request.fraction = 0.5;
  request.tokens = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(PlanBudget(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens")));
  request.tokens = kMaxBudgetTokens;
  request.layers = std::numeric_limits<int>::max();
  EXPECT_THAT(PlanBudget(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layers")));
  request.layers = static_cast<int>(kMaxBudgetLayers);
  request.kv_groups = static_cast<int>(kMaxBudgetGroups);
  request.page_size = 1;
  request.fraction = 0.999999999999999;  // 2^72 slots: beyond what a plan can count
  EXPECT_THAT(PlanBudget(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token slots")));
  request.kv_groups = 1 << 6;  // 2^62 slots at most: the largest a plan counts
  ENTROKV_ASSERT_OK_AND_ASSIGN(plan, PlanBudget(request));
  EXPECT_LE(plan.planned_slots, kMaxBudgetTokenSlots);
  EXPECT_GE(plan.residual_slots, 0);
  request.kv_groups = static_cast<int>(kMaxBudgetGroups);
  request.fraction = 1e-30;  // more than 18 decimal places
  EXPECT_THAT(PlanBudget(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fraction")));
}

TEST(BudgetTest, RejectsBadRequestsNamingTheField) {
  BudgetRequest request = Llama8B();
  EXPECT_THAT(PlanBudget(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exactly one")));
  request.token_slots = 32 * 128 - 1;  // below one page per layer
  EXPECT_THAT(PlanBudget(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one page per layer")));
  request.page_size = 0;
  EXPECT_THAT(PlanBudget(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_size")));
  request = Llama8B();
  request.fraction = 1.5;
  request.tokens = 100;
  EXPECT_THAT(PlanBudget(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fraction")));
  EXPECT_THAT(ParseLayerAllocator("adaptive"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("allocator")));
}

}  // namespace
}  // namespace entrokv
