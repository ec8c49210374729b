#include "core/scoring/budget.h"

#include <numeric>

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
