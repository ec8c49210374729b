#include "wire/pressure.h"

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/grpc_status.h"
#include "wire/resolve.h"

namespace entrokv::wire {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PressureWireTest, OpenSequenceTermsAreTheRequestsFields) {
  v1::OpenSequenceRequest request;
  EXPECT_FALSE(ToSequenceTerms(request).auto_floor.has_value());
  request.set_tenant("gold");
  request.set_priority(7);
  request.mutable_auto_budget()->set_floor_fraction(0.25);
  const SequenceTerms terms = ToSequenceTerms(request);
  EXPECT_EQ(terms.tenant, "gold");
  EXPECT_EQ(terms.priority, 7);
  EXPECT_EQ(terms.auto_floor, 0.25);
  request.mutable_auto_budget()->clear_floor_fraction();  // set but 0: refused by the pool
  EXPECT_EQ(ToSequenceTerms(request).auto_floor, 0.0);
}

TEST(PressureWireTest, AnAdmissionHintTravelsWithItsStatusThroughGrpc) {
  AdmissionRefusal refusal;
  refusal.refused = true;
  refusal.missing_frames = 12;
  refusal.reclaiming_frames = 4;
  refusal.retry_after_ms = 35;
  refusal.preempt = {"a", "b"};
  const absl::Status status =
      WithAdmissionHint(absl::ResourceExhaustedError("pool exhausted"), refusal);
  EXPECT_FALSE(AdmissionHintOf(absl::ResourceExhaustedError("pool exhausted")).has_value());
  // What a client gets back from the wire.
  const absl::Status received = FromGrpcStatus(ToGrpcStatus(status));
  EXPECT_THAT(received, StatusIs(absl::StatusCode::kResourceExhausted, "pool exhausted"));
  const std::optional<v1::AdmissionHint> hint = AdmissionHintOf(received);
  ASSERT_TRUE(hint.has_value());
  EXPECT_EQ(hint->outcome(), v1::AdmissionHint::OUTCOME_REFUSED);
  EXPECT_EQ(hint->missing_frames(), 12);
  EXPECT_EQ(hint->reclaiming_frames(), 4);
  EXPECT_EQ(hint->retry_after_ms(), 35);
  EXPECT_THAT(hint->preempt_sequence_ids(), ElementsAre("a", "b"));
  refusal.refused = false;
  EXPECT_EQ(ToProto(refusal).outcome(), v1::AdmissionHint::OUTCOME_DELAYED);
}

TEST(PressureWireTest, ReportsAndStatsFieldByField) {
  const v1::PressureInfo info = ToProto(PressureReport{.quota_frames = 8,
                                                       .live_frames = 10,
                                                       .floor_frames = 4,
                                                       .occupancy = 0.5,
                                                       .target_occupancy = 0.9,
                                                       .reclaimed_frames = 2,
                                                       .preempt = true});
  EXPECT_EQ(info.quota_frames(), 8);
  EXPECT_EQ(info.live_frames(), 10);
  EXPECT_EQ(info.floor_frames(), 4);
  EXPECT_EQ(info.occupancy(), 0.5);
  EXPECT_EQ(info.target_occupancy(), 0.9);
  EXPECT_EQ(info.reclaimed_frames(), 2);
  EXPECT_TRUE(info.preempt());
  PressureStats stats;
  stats.target_occupancy = 0.8;
  stats.frames_reclaimed_admission = 3;
  stats.frames_reclaimed_target = 4;
  stats.admissions_delayed = 5;
  stats.admissions_refused = 6;
  stats.preemptions = 7;
  stats.sequences_swapped = 1;
  stats.swapped_bytes = 4096;
  stats.tenants = {{.tenant = "gold", .used_frames = 9, .share = 0.5, .guaranteed_frames = 50},
                   {.tenant = "", .used_frames = 1, .share = 0.0, .guaranteed_frames = 0}};
  v1::PoolStats out;
  FillPressureStats(stats, &out);
  EXPECT_EQ(out.target_occupancy(), 0.8);
  EXPECT_EQ(out.frames_reclaimed_admission_total(), 3);
  EXPECT_EQ(out.frames_reclaimed_target_total(), 4);
  EXPECT_EQ(out.admissions_delayed_total(), 5);
  EXPECT_EQ(out.admissions_refused_total(), 6);
  EXPECT_EQ(out.preemptions_total(), 7);
  EXPECT_EQ(out.sequences_swapped(), 1);
  EXPECT_EQ(out.swapped_bytes(), 4096);
  ASSERT_EQ(out.tenants_size(), 2);
  EXPECT_EQ(out.tenants(0).tenant(), "gold");
  EXPECT_EQ(out.tenants(0).guaranteed_frames(), 50);
  EXPECT_EQ(out.tenants(1).used_frames(), 1);
}

TEST(PressureWireTest, AnAutoBudgetRanksEveryPageAndNamesABadFloor) {
  const ModelGeometry geometry{.layers = 2,
                               .query_heads = 4,
                               .kv_groups = 2,
                               .head_dim = 8,
                               .page_size = 16,
                               .element_bytes = 2};
  v1::Budget budget;
  budget.mutable_auto_budget()->set_floor_fraction(0.3);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ResolvedBudget resolved,
                               ResolveBudget(budget, true, geometry, 100));
  EXPECT_THAT(resolved.pages_per_layer, ElementsAre(7, 7));
  EXPECT_EQ(resolved.auto_floor, 0.3);
  budget.mutable_auto_budget()->set_floor_fraction(0.0);
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 100),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("budget.auto_budget.floor_fraction: must be in (0, 1]")));
  budget.mutable_auto_budget()->set_floor_fraction(1.01);
  EXPECT_THAT(ResolveBudget(budget, true, geometry, 100),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("floor_fraction")));
}

}  // namespace
}  // namespace entrokv::wire
