// Group quotas that move (policy.group_floor) through the real daemon over loopback: the groups
// of a layer keep different page counts, the pool holds exactly the frames fixed quotas hold,
// bad floors and what cannot move quotas are refused by name with nothing changed, and a layer
// degraded to position keeps fixed quotas.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"

namespace entrokv::service::testing {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kTokens = 256;  // 16 pages of 16 tokens

class GroupQuotasTest : public ServiceTest {
 protected:
  // Every layer: group 0's heads attend to token 3 alone, group 1's spread over every token,
  // rising with the token. f32, [H_Q, T].
  static v1::DecideRequest Request(double floor, int64_t pages) {
    std::vector<float> rows(static_cast<size_t>(kHeads * kTokens), 0.0f);
    const int per_group = kHeads / kGroups;
    for (int head = 0; head < kHeads; ++head) {
      for (int64_t t = 0; t < kTokens; ++t) {
        rows[static_cast<size_t>(head * kTokens + t)] =
            head < per_group ? (t == 3 ? 1.0f : 0.0f) : static_cast<float>(t + 1) / 32896.0f;
      }
    }
    v1::DecideRequest request;
    request.set_model_id("m");
    request.set_sequence_id("s");
    request.mutable_budget()->set_pages_per_group(pages);
    v1::PolicyParams* policy = request.mutable_policy();
    policy->set_name("mean");
    policy->set_scope(v1::SELECTION_SCOPE_GROUP);
    policy->set_protect_tail_page(false);
    if (floor < 1.0) policy->set_group_floor(floor);
    for (int layer = 0; layer < kLayers; ++layer) {
      v1::LayerStatistic* in = request.add_layers();
      in->set_layer(layer);
      *in->mutable_statistic() = BytesStatistic(rows, kHeads, kTokens, v1::DTYPE_FLOAT32);
    }
    return request;
  }

  grpc::Status Decide(const v1::DecideRequest& request, v1::DecideResponse* response) {
    grpc::ClientContext context;
    return stub_->Decide(&context, request, response);
  }
};

TEST_F(GroupQuotasTest, AGroupWithOnePageOfMassGivesItsQuotaToTheOtherAndTheFramesStayExact) {
  Register("m");
  Open("m", "s", kTokens);
  v1::DecideResponse response;
  // K = 4, floor 1/4: each group keeps its best page, and the six others all go to group 1.
  const grpc::Status status = Decide(Request(0.25, 4), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.layers_size(), kLayers);
  for (const v1::LayerDecision& layer : response.layers()) {
    ASSERT_EQ(layer.groups_size(), kGroups);
    EXPECT_THAT(layer.groups(0).kept_pages(), ElementsAre(0));
    EXPECT_THAT(layer.groups(1).kept_pages(), ElementsAre(9, 10, 11, 12, 13, 14, 15));
    EXPECT_EQ(layer.quota_pages(), 4);
  }
  // The block tables hold what the reply says, and the pool what fixed quotas would hold.
  const v1::SequenceInfo info = Sequence("m", "s");
  for (const v1::BlockTable& table : info.block_tables()) {
    int held = 0;
    for (const int32_t frame : table.frames()) held += frame >= 0 ? 1 : 0;
    EXPECT_EQ(held, table.group() == 0 ? 1 : 7) << "layer " << table.layer();
  }
  const v1::PoolStats stats = Stats("m");
  EXPECT_EQ(stats.used_frames(), kLayers * kGroups * 4);
  EXPECT_EQ(stats.used_frames() + stats.free_frames(), stats.capacity_frames());
  ExpectInvariants("m");

  // A later decision at K = 2 keeps what fixed quotas would of the pages still held: group 0
  // holds one page and keeps it, group 1 keeps two, 3 per layer.
  v1::DecideResponse again;
  ASSERT_TRUE(Decide(Request(0.25, 2), &again).ok());
  for (const v1::LayerDecision& layer : again.layers()) {
    EXPECT_THAT(layer.groups(0).kept_pages(), ElementsAre(0));
    EXPECT_THAT(layer.groups(1).kept_pages(), ElementsAre(14, 15));
  }
  EXPECT_EQ(Stats("m").used_frames(), kLayers * (1 + 2));
  ExpectInvariants("m");
}

TEST_F(GroupQuotasTest, BadFloorsAndWhatCannotMoveQuotasAreRefusedWithNothingChanged) {
  Register("m");
  Open("m", "s", kTokens);
  std::vector<BadDecide> cases;
  for (const double floor : {-0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    v1::DecideRequest request = Request(0.5, 4);
    request.mutable_policy()->set_group_floor(floor);
    cases.push_back({request, "policy.group_floor"});
  }
  v1::DecideRequest layer_scope = Request(0.5, 4);
  layer_scope.mutable_policy()->set_scope(v1::SELECTION_SCOPE_LAYER);
  cases.push_back({layer_scope, "policy.group_floor"});
  for (const char* name : {"head_independent", "streaming"}) {
    v1::DecideRequest request = Request(0.5, 4);
    request.mutable_policy()->set_name(name);
    cases.push_back({request, "policy.group_floor"});
  }
  ExpectRefusedChangingNothing("m", cases);
}

TEST_F(GroupQuotasTest, LayersDecidedByPositionKeepFixedQuotas) {
  Register("m");
  Open("m", "s", kTokens);
  v1::DecideResponse response;
  const grpc::Status status = DecideAllDegraded(Request(0.25, 4), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  for (const v1::LayerDecision& layer : response.layers()) {
    EXPECT_TRUE(layer.degraded());
    for (const v1::GroupDecision& group : layer.groups()) EXPECT_EQ(group.kept_pages_size(), 4);
  }
  EXPECT_EQ(Stats("m").used_frames(), kLayers * kGroups * 4);
  ExpectInvariants("m");
}

}  // namespace
}  // namespace entrokv::service::testing
