// Selection scope over loopback (docs/architecture.md §3.9): in the LAYER frame layout a pooled
// policy ends at exactly the planned frames (layer scope, the pool's default there); group scope
// keeps the union of the groups' pages, reported per layer and equal to what the block tables hold.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/scoring/budget.h"
#include "core/testing/policies.h"
#include "core/util/page_count.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"
#include "tests/service/test_support.h"

namespace entrokv::service {
namespace {

using ::entrokv::service::testing::BytesStatistic;
using ::entrokv::service::testing::kGroups;
using ::entrokv::service::testing::kHeads;
using ::entrokv::service::testing::kLayers;
using ::entrokv::service::testing::LoopbackOptions;
using ::entrokv::service::testing::RandomStatistic;
using ::entrokv::service::testing::RegisterRequest;
using ::entrokv::service::testing::ServiceTest;
using ::testing::HasSubstr;

constexpr int64_t kTokens = 1000;  // 63 pages of 16
constexpr double kFraction = 0.2;

class LayerScopeTest : public ServiceTest {
 protected:
  void RegisterLayout(const std::string& model, v1::FrameLayout layout) {
    v1::RegisterModelRequest request = RegisterRequest(model, kLayers, kHeads, kGroups, 8 << 20);
    request.set_frame_layout(layout);
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    const grpc::Status status = stub_->RegisterModel(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  // Every layer of `sequence` at kFraction, with a statistic whose groups disagree.
  grpc::Status DecideFraction(const std::string& model, const std::string& sequence,
                              const std::string& policy, v1::SelectionScope scope,
                              v1::DecideResponse* response) {
    v1::DecideRequest request;
    request.set_model_id(model);
    request.set_sequence_id(sequence);
    request.mutable_budget()->set_fraction(kFraction);
    request.mutable_policy()->set_name(policy);
    request.mutable_policy()->set_scope(scope);
    for (int layer = 0; layer < kLayers; ++layer) {
      v1::LayerStatistic* in = request.add_layers();
      in->set_layer(layer);
      *in->mutable_statistic() = BytesStatistic(RandomStatistic(kHeads, kTokens, 7 + layer), kHeads,
                                                kTokens, v1::DTYPE_FLOAT32);
    }
    grpc::ClientContext context;
    return stub_->Decide(&context, request, response);
  }
  BudgetPlan Plan() {
    return *PlanBudget(FractionBudget(kLayers, kGroups, 16, kTokens, kFraction));
  }
  // Distinct pages with a frame per layer in the sequence's block tables (the groups' tables
  // of a layer name the same frame for a page in the LAYER layout).
  std::vector<int64_t> LivePagesPerLayer(const std::string& model, const std::string& sequence) {
    std::vector<std::vector<bool>> live_page(kLayers);
    const v1::SequenceInfo info = Sequence(model, sequence);
    for (const v1::BlockTable& table : info.block_tables()) {
      std::vector<bool>& pages = live_page[table.layer()];
      pages.resize(std::max<size_t>(pages.size(), table.frames_size()), false);
      for (int page = 0; page < table.frames_size(); ++page) {
        if (table.frames(page) >= 0) pages[page] = true;
      }
    }
    std::vector<int64_t> live;
    for (const auto& pages : live_page)
      live.push_back(std::count(pages.begin(), pages.end(), true));
    return live;
  }
};

TEST_F(LayerScopeTest, LayerLayoutKeepsExactlyThePlannedFramesForEveryPooledPolicy) {
  const BudgetPlan plan = Plan();
  for (const absl::string_view policy : ::entrokv::testing::ExactBudgetPolicyNames()) {
    SCOPED_TRACE(policy);
    const std::string model = absl::StrCat("m-", policy);
    RegisterLayout(model, v1::FRAME_LAYOUT_LAYER);
    Open(model, "s", kTokens);
    v1::DecideResponse response;
    // UNSPECIFIED: the pool's default, layer scope for the LAYER layout.
    const grpc::Status status =
        DecideFraction(model, "s", std::string(policy), v1::SELECTION_SCOPE_UNSPECIFIED, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(Stats(model).used_frames(), plan.layer_pages);
    for (const v1::LayerDecision& layer : response.layers()) {
      EXPECT_EQ(layer.scope(), v1::SELECTION_SCOPE_LAYER);
      EXPECT_EQ(layer.union_pages(), plan.pages_per_layer[layer.layer()]);
      EXPECT_GE(layer.group_scope_union_pages(), layer.union_pages());
      EXPECT_DOUBLE_EQ(layer.page_union_ratio(), 1.0);
      for (const v1::GroupDecision& group : layer.groups()) {
        EXPECT_THAT(group.kept_pages(), ::testing::ElementsAreArray(layer.groups(0).kept_pages()));
      }
    }
    ExpectInvariants(model);
  }
}

TEST_F(LayerScopeTest, GroupScopeInTheLayerLayoutReportsTheUnionTheBlockTablesHold) {
  RegisterLayout("m", v1::FRAME_LAYOUT_LAYER);
  Open("m", "s", kTokens);
  v1::DecideResponse response;
  const grpc::Status status =
      DecideFraction("m", "s", "page_entrokv", v1::SELECTION_SCOPE_GROUP, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::vector<int64_t> live = LivePagesPerLayer("m", "s");
  int64_t union_total = 0;
  bool some_union = false;
  for (const v1::LayerDecision& layer : response.layers()) {
    EXPECT_EQ(layer.scope(), v1::SELECTION_SCOPE_GROUP);
    EXPECT_EQ(layer.union_pages(), live[layer.layer()]);
    EXPECT_EQ(layer.group_scope_union_pages(), layer.union_pages());
    some_union |= layer.union_pages() > layer.quota_pages();
    union_total += layer.union_pages();
  }
  EXPECT_TRUE(some_union) << "the groups' statistics should disagree somewhere";
  EXPECT_EQ(Stats("m").used_frames(), union_total);
  ExpectInvariants("m");
}

// The shadow in layer scope is the union group scope keeps for the same statistic.
TEST_F(LayerScopeTest, LayerScopeReportsTheGroupScopeUnionAsItsShadow) {
  RegisterLayout("m", v1::FRAME_LAYOUT_LAYER);
  Open("m", "group", kTokens);
  Open("m", "layer", kTokens);
  v1::DecideResponse group_scope;
  v1::DecideResponse layer_scope;
  ASSERT_TRUE(DecideFraction("m", "group", "mean", v1::SELECTION_SCOPE_GROUP, &group_scope).ok());
  ASSERT_TRUE(DecideFraction("m", "layer", "mean", v1::SELECTION_SCOPE_LAYER, &layer_scope).ok());
  for (int i = 0; i < kLayers; ++i) {
    EXPECT_EQ(layer_scope.layers(i).group_scope_union_pages(), group_scope.layers(i).union_pages());
  }
}

// In the GROUP layout layer scope is a choice: every group keeps the same exact set.
TEST_F(LayerScopeTest, GroupLayoutDefaultsToGroupScopeAndLayerScopeStaysExact) {
  const BudgetPlan plan = Plan();
  RegisterLayout("m", v1::FRAME_LAYOUT_GROUP);
  Open("m", "a", kTokens);
  Open("m", "b", kTokens);
  v1::DecideResponse response;
  ASSERT_TRUE(
      DecideFraction("m", "a", "page_entrokv", v1::SELECTION_SCOPE_UNSPECIFIED, &response).ok());
  EXPECT_EQ(response.layers(0).scope(), v1::SELECTION_SCOPE_GROUP);
  const int64_t after_a = Stats("m").used_frames();
  ASSERT_TRUE(DecideFraction("m", "b", "page_entrokv", v1::SELECTION_SCOPE_LAYER, &response).ok());
  EXPECT_EQ(response.layers(0).scope(), v1::SELECTION_SCOPE_LAYER);
  EXPECT_EQ(Stats("m").used_frames(),
            after_a + kGroups * plan.layer_pages - kGroups * kLayers * PageCount(kTokens, 16));
  ExpectInvariants("m");
}

TEST_F(LayerScopeTest, TheDaemonFlagChoosesTheScopeOfUnspecifiedRequests) {
  ServerOptions options = LoopbackOptions();
  options.selection_scope = ScopeSetting::kGroup;
  Restart(options);
  RegisterLayout("m", v1::FRAME_LAYOUT_LAYER);
  Open("m", "s", kTokens);
  v1::DecideResponse response;
  ASSERT_TRUE(
      DecideFraction("m", "s", "page_entrokv", v1::SELECTION_SCOPE_UNSPECIFIED, &response).ok());
  EXPECT_EQ(response.layers(0).scope(), v1::SELECTION_SCOPE_GROUP);
}

TEST_F(LayerScopeTest, AnUndefinedScopeIsRejectedNamingTheFieldAndChangesNothing) {
  RegisterLayout("m", v1::FRAME_LAYOUT_LAYER);
  Open("m", "s", kTokens);
  const int64_t before = Stats("m").used_frames();
  v1::DecideResponse response;
  const grpc::Status status =
      DecideFraction("m", "s", "mean", static_cast<v1::SelectionScope>(7), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("policy.scope"));
  EXPECT_EQ(Stats("m").used_frames(), before);
}

}  // namespace
}  // namespace entrokv::service
