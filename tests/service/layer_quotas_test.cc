// The "mass" layer allocator (budget.allocator) through the real daemon over loopback: layers
// whose attention sits on one page give their pages to layers that spread it, the pool holds
// exactly the frames the uniform plan buys, a layer decided by position keeps its uniform quota,
// and what cannot move layer quotas is refused by name with nothing changed.
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"

namespace entrokv::service::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kTokens = 256;  // 16 pages of 16 tokens; a fraction of 0.25 buys 4 per layer

class LayerQuotasTest : public ServiceTest {
 protected:
  // Layers 0 and 1: every head attends to token 3 alone. Layers 2 and 3: every head spreads its
  // attention over every token, rising with the token. f32, [H_Q, T].
  static v1::DecideRequest Request(std::optional<double> floor) {
    std::vector<float> concentrated(static_cast<size_t>(kHeads * kTokens), 0.0f);
    std::vector<float> spread(concentrated.size());
    for (int head = 0; head < kHeads; ++head) {
      concentrated[static_cast<size_t>(head * kTokens + 3)] = 1.0f;
      for (int64_t t = 0; t < kTokens; ++t) {
        spread[static_cast<size_t>(head * kTokens + t)] = static_cast<float>(t + 1) / 32896.0f;
      }
    }
    v1::DecideRequest request;
    request.set_model_id("m");
    request.set_sequence_id("s");
    request.mutable_budget()->set_fraction(0.25);
    request.mutable_budget()->set_allocator("mass");
    if (floor.has_value()) request.mutable_budget()->set_layer_floor(*floor);
    v1::PolicyParams* policy = request.mutable_policy();
    policy->set_name("mean");
    policy->set_scope(v1::SELECTION_SCOPE_GROUP);
    policy->set_protect_tail_page(false);
    for (int layer = 0; layer < kLayers; ++layer) {
      v1::LayerStatistic* in = request.add_layers();
      in->set_layer(layer);
      *in->mutable_statistic() =
          BytesStatistic(layer < 2 ? concentrated : spread, kHeads, kTokens, v1::DTYPE_FLOAT32);
    }
    return request;
  }

  grpc::Status Decide(const v1::DecideRequest& request, v1::DecideResponse* response) {
    grpc::ClientContext context;
    return stub_->Decide(&context, request, response);
  }
};

TEST_F(LayerQuotasTest, ConcentratedLayersGiveTheirPagesToSpreadOnesAndTheFramesStayExact) {
  Register("m");
  Open("m", "s", kTokens);
  v1::DecideResponse response;
  // 16 layer-pages, floor 1/4 of 4 = one page each: the concentrated layers' second pages add
  // nothing, so the spread layers take the other 12, six each.
  const grpc::Status status = Decide(Request(0.25), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.layers_size(), kLayers);
  std::vector<int64_t> quotas;
  for (const v1::LayerDecision& layer : response.layers()) {
    quotas.push_back(layer.quota_pages());
    ASSERT_EQ(layer.groups_size(), kGroups);
    for (const v1::GroupDecision& group : layer.groups()) {
      if (layer.layer() < 2) {
        EXPECT_THAT(group.kept_pages(), ElementsAre(0));
      } else {  // the pages of most attention
        EXPECT_THAT(group.kept_pages(), ElementsAre(9, 10, 11, 12, 13, 14, 15));
      }
    }
  }
  EXPECT_THAT(quotas, ElementsAre(1, 1, 7, 7));
  const v1::PoolStats stats = Stats("m");
  EXPECT_EQ(stats.used_frames(), kGroups * 16);  // what the uniform plan keeps: 4 x 4 x 2
  EXPECT_EQ(stats.used_frames() + stats.free_frames(), stats.capacity_frames());
  ExpectInvariants("m");
}

TEST_F(LayerQuotasTest, AFloorOfOneIsTheUniformSplit) {
  Register("m");
  Open("m", "s", kTokens);
  v1::DecideResponse response;
  ASSERT_TRUE(Decide(Request(1.0), &response).ok());
  for (const v1::LayerDecision& layer : response.layers()) EXPECT_EQ(layer.quota_pages(), 4);
  EXPECT_EQ(Stats("m").used_frames(), kLayers * kGroups * 4);
  ExpectInvariants("m");
}

TEST_F(LayerQuotasTest, LayersDecidedByPositionKeepTheirUniformQuotas) {
  Register("m");
  Open("m", "s", kTokens);
  v1::DecideResponse response;
  const grpc::Status status = DecideAllDegraded(Request(0.25), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  for (const v1::LayerDecision& layer : response.layers()) {
    EXPECT_TRUE(layer.degraded());
    EXPECT_EQ(layer.quota_pages(), 4);
  }
  EXPECT_EQ(Stats("m").used_frames(), kLayers * kGroups * 4);
  ExpectInvariants("m");
}

TEST_F(LayerQuotasTest, WhatCannotMoveLayerQuotasIsRefusedByNameWithNothingChanged) {
  Register("m");
  Open("m", "s", kTokens);
  std::vector<BadDecide> cases;
  for (const double floor : {-0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    cases.push_back({Request(floor), "budget.layer_floor"});
  }
  v1::DecideRequest uniform = Request(0.5);
  uniform.mutable_budget()->set_allocator("uniform");
  cases.push_back({uniform, "budget.layer_floor"});
  v1::DecideRequest explicit_pages = Request(std::nullopt);
  explicit_pages.mutable_budget()->set_pages_per_group(3);
  cases.push_back({explicit_pages, "budget.allocator"});
  for (const char* name : {"head_independent", "streaming"}) {
    v1::DecideRequest request = Request(std::nullopt);
    request.mutable_policy()->set_name(name);
    cases.push_back({request, "budget.allocator: 'mass'"});
  }
  ExpectRefusedChangingNothing("m", cases);

  // DecideStream decides one layer at a time: nothing to move between.
  const v1::SequenceInfo before = Sequence("m", "s");
  const v1::DecideRequest whole = Request(std::nullopt);
  v1::DecideLayerRequest layer;
  layer.set_model_id("m");
  layer.set_sequence_id("s");
  *layer.mutable_budget() = whole.budget();
  *layer.mutable_policy() = whole.policy();
  *layer.mutable_layer() = whole.layers(2);
  grpc::ClientContext context;
  auto stream = stub_->DecideStream(&context);
  ASSERT_TRUE(stream->Write(layer));
  stream->WritesDone();
  v1::LayerDecision ignored;
  while (stream->Read(&ignored)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("budget.allocator: 'mass'"));
  EXPECT_THAT(status.error_message(), HasSubstr("DecideStream"));
  EXPECT_EQ(Sequence("m", "s").DebugString(), before.DebugString());
  ExpectInvariants("m");
}

}  // namespace
}  // namespace entrokv::service::testing
