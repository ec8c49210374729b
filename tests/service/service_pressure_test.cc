// Pool pressure through the real daemon over loopback gRPC: server-chosen budgets, admission
// with its hint, quotas applied at the owner's call, tenants, preemption, swapping.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/pool/cache_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/grpc_status.h"
#include "tests/service/service_fixture.h"
#include "wire/pressure.h"

namespace entrokv::service::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kFrameBytes = 2 * 16 * 8 * 2;  // the fixture's geometry, group layout

class PressureServiceTest : public ServiceTest {
 protected:
  grpc::Status OpenWith(const std::string& model, const std::string& sequence, int64_t tokens,
                        const std::string& tenant, int32_t priority, std::optional<double> floor,
                        v1::OpenSequenceResponse* response) {
    grpc::ClientContext context;
    v1::OpenSequenceRequest request;
    request.set_model_id(model);
    request.set_sequence_id(sequence);
    request.set_initial_tokens(tokens);
    request.set_tenant(tenant);
    request.set_priority(priority);
    if (floor.has_value()) request.mutable_auto_budget()->set_floor_fraction(*floor);
    return stub_->OpenSequence(&context, request, response);
  }
  // A decision of every layer with a server-chosen budget: the first page of each layer holding
  // almost all the mass (`concentrated`), or every token alike.
  grpc::Status DecideAuto(const std::string& model, const std::string& sequence, int64_t tokens,
                          double floor, v1::DecideResponse* response, bool concentrated = true,
                          const std::function<void(v1::DecideRequest&)>& change = {}) {
    v1::DecideRequest request;
    request.set_model_id(model);
    request.set_sequence_id(sequence);
    request.mutable_budget()->mutable_auto_budget()->set_floor_fraction(floor);
    std::vector<float> values(static_cast<size_t>(kHeads * tokens));
    for (int h = 0; h < kHeads; ++h) {
      for (int64_t t = 0; t < tokens; ++t) {
        values[h * tokens + t] = t < 16 || !concentrated ? 1.0f : 0.001f;
      }
    }
    for (int layer = 0; layer < kLayers; ++layer) {
      v1::LayerStatistic* in = request.add_layers();
      in->set_layer(layer);
      *in->mutable_statistic() = BytesStatistic(values, kHeads, tokens, v1::DTYPE_FLOAT32);
    }
    if (change) change(request);
    grpc::ClientContext context;
    return stub_->Decide(&context, request, response);
  }
  grpc::Status Append(const std::string& model, const std::string& sequence, int64_t tokens,
                      v1::AppendTokensResponse* response) {
    grpc::ClientContext context;
    v1::AppendTokensRequest request;
    request.set_model_id(model);
    request.set_sequence_id(sequence);
    request.set_tokens(tokens);
    return stub_->AppendTokens(&context, request, response);
  }
  grpc::Status SwapOut(const std::string& model, const std::string& sequence,
                       v1::SwapOutSequenceResponse* response) {
    grpc::ClientContext context;
    v1::SwapOutSequenceRequest request;
    request.set_model_id(model);
    request.set_sequence_id(sequence);
    return stub_->SwapOutSequence(&context, request, response);
  }
  grpc::Status Resume(const std::string& model, const std::string& sequence,
                      v1::ResumeSequenceResponse* response) {
    grpc::ClientContext context;
    v1::ResumeSequenceRequest request;
    request.set_model_id(model);
    request.set_sequence_id(sequence);
    return stub_->ResumeSequence(&context, request, response);
  }
  double Metric(const std::string& family,
                const std::vector<std::pair<std::string, std::string>>& labels) {
    const std::optional<prometheus::ClientMetric> series = FindSeries(*server_, family, labels);
    if (!series.has_value()) return -1;
    return family.ends_with("_total") ? series->counter.value : series->gauge.value;
  }
  // The pressure of `sequence` as ListSequences reports it.
  v1::PressureInfo Listed(const std::string& model, const std::string& sequence) {
    grpc::ClientContext context;
    v1::ListSequencesRequest request;
    request.set_model_id(model);
    v1::ListSequencesResponse listed;
    EXPECT_TRUE(stub_->ListSequences(&context, request, &listed).ok());
    for (const v1::SequenceInfo& info : listed.sequences()) {
      if (info.sequence_id() == sequence) return info.pressure();
    }
    ADD_FAILURE() << sequence << " is not listed";
    return v1::PressureInfo();
  }
};

// Above --target_occupancy the daemon sets a quota on the sequence with a server-chosen budget at
// once, and its owner's next call applies it (reason "target"); well under the target again, with
// nothing waiting, the quota is lifted.
TEST_F(PressureServiceTest, AboveTheTargetTheOwnersNextCallGivesTheFrames) {
  ServerOptions options = LoopbackOptions();
  options.target_occupancy = 0.5;
  Restart(options);
  Register("m", 80 * kFrameBytes);
  v1::OpenSequenceResponse opened;
  ASSERT_TRUE(OpenWith("m", "a", 60, "", 0, 0.25, &opened).ok());  // 32 frames
  EXPECT_DOUBLE_EQ(opened.pressure().target_occupancy(), 0.5);
  v1::DecideResponse decided;
  ASSERT_TRUE(DecideAuto("m", "a", 60, 0.25, &decided).ok());
  EXPECT_EQ(decided.pressure().quota_frames(), 0);  // 32 of 80: under the target
  Open("m", "b", 60);                               // 64 of 80 frames: 24 over the target
  EXPECT_EQ(Stats("m").used_frames(), 64);          // nothing moves before a's own call
  const v1::PressureInfo listed = Listed("m", "a");
  EXPECT_EQ(listed.quota_frames(), 8);  // a's floor: 25% of its 32 frames
  v1::AppendTokensResponse grown;
  ASSERT_TRUE(Append("m", "a", 1, &grown).ok());
  int evicted = 0;
  for (const v1::GroupEviction& group : grown.evicted()) {
    EXPECT_THAT(group.pages(), ::testing::Not(::testing::Contains(3)));  // the tail
    evicted += group.pages_size();
  }
  EXPECT_EQ(grown.pressure().reclaimed_frames(), evicted);
  EXPECT_EQ(evicted, 24);
  EXPECT_EQ(grown.pressure().live_frames(), 8);
  EXPECT_DOUBLE_EQ(grown.pressure().occupancy(), 40.0 / 80.0);
  v1::PoolStats stats = Stats("m");
  EXPECT_EQ(stats.used_frames(), 40);
  EXPECT_EQ(stats.frames_reclaimed_target_total(), 24);
  EXPECT_EQ(stats.frames_reclaimed_admission_total(), 0);
  EXPECT_EQ(Metric("entrokv_frames_reclaimed_total", {{"pool", "m"}, {"reason", "target"}}), 24);
  // b goes: 8 of 80 frames, far under the target, nothing waiting: the quota is lifted.
  grpc::ClientContext context;
  v1::CloseSequenceRequest close;
  close.set_model_id("m");
  close.set_sequence_id("b");
  v1::CloseSequenceResponse closed;
  ASSERT_TRUE(stub_->CloseSequence(&context, close, &closed).ok());
  EXPECT_EQ(Listed("m", "a").quota_frames(), 0);
  ExpectInvariants("m");
}

// Tenants over loopback gRPC: a tenant above its guaranteed share gives first, even where another
// tenant's pages are worth less.
TEST_F(PressureServiceTest, ATenantAboveItsShareGivesBeforeCheaperPagesOfOneWithinIt) {
  ServerOptions options = LoopbackOptions();
  options.tenant_share = {{"gold", 0.5}, {"silver", 0.5}};
  options.target_occupancy = 1.0;
  Restart(options);
  Register("m", 96 * kFrameBytes);  // 48 frames guaranteed to each tenant
  v1::OpenSequenceResponse opened;
  v1::DecideResponse decided;
  ASSERT_TRUE(OpenWith("m", "g", 60, "gold", 0, 0.25, &opened).ok());
  ASSERT_TRUE(DecideAuto("m", "g", 60, 0.25, &decided, /*concentrated=*/false).ok());
  ASSERT_TRUE(OpenWith("m", "g2", 60, "gold", 0, std::nullopt, &opened).ok());  // gold: 64
  ASSERT_TRUE(OpenWith("m", "s", 60, "silver", 0, 0.25, &opened).ok());         // silver: 32
  ASSERT_TRUE(DecideAuto("m", "s", 60, 0.25, &decided, /*concentrated=*/true).ok());
  // The pool is full; silver asks for one page (8 frames).
  const grpc::Status status = OpenWith("m", "z", 16, "silver", 0, std::nullopt, &opened);
  ASSERT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  const std::optional<v1::AdmissionHint> hint = wire::AdmissionHintOf(FromGrpcStatus(status));
  ASSERT_TRUE(hint.has_value());
  EXPECT_EQ(hint->outcome(), v1::AdmissionHint::OUTCOME_DELAYED);
  EXPECT_EQ(hint->missing_frames(), 8);
  // s's light pages are worth far less than g's, but silver holds less than its share.
  EXPECT_EQ(Listed("m", "s").quota_frames(), 0);
  EXPECT_EQ(Listed("m", "g").quota_frames(), 24);
  v1::AppendTokensResponse grown;
  ASSERT_TRUE(Append("m", "g", 1, &grown).ok());
  EXPECT_EQ(grown.pressure().reclaimed_frames(), 8);
  ASSERT_TRUE(OpenWith("m", "z", 16, "silver", 0, std::nullopt, &opened).ok());
  const v1::PoolStats stats = Stats("m");
  ASSERT_EQ(stats.tenants_size(), 3);
  EXPECT_EQ(stats.tenants(0).used_frames(), 56);  // gold
  EXPECT_EQ(stats.tenants(1).used_frames(), 40);  // silver
  EXPECT_EQ(Metric("entrokv_tenant_used_frames", {{"pool", "m"}, {"tenant", "gold"}}), 56);
  ExpectInvariants("m");
}

TEST_F(PressureServiceTest, AnAdmissionThatDoesNotFitCarriesItsHintAndWaitsForTheOwnersCall) {
  Register("m", 80 * kFrameBytes);
  v1::OpenSequenceResponse opened;
  ASSERT_TRUE(OpenWith("m", "a", 60, "", 0, 0.25, &opened).ok());  // 32 frames
  EXPECT_EQ(opened.pressure().live_frames(), 32);
  EXPECT_EQ(opened.pressure().floor_frames(), 8);
  EXPECT_DOUBLE_EQ(opened.pressure().target_occupancy(), 0.9);
  v1::DecideResponse decided;
  ASSERT_TRUE(DecideAuto("m", "a", 60, 0.25, &decided).ok());
  for (const v1::LayerDecision& layer : decided.layers()) {
    for (const v1::GroupDecision& group : layer.groups()) {
      EXPECT_EQ(group.kept_pages_size(), 4);  // the pool can afford every page
      EXPECT_EQ(group.evicted_pages_size(), 0);
    }
  }
  EXPECT_EQ(decided.pressure().quota_frames(), 0);
  Open("m", "b", 60);  // 64 of 80 frames used
  v1::OpenSequenceResponse refused;
  grpc::ClientContext context;
  v1::OpenSequenceRequest request;
  request.set_model_id("m");
  request.set_sequence_id("c");
  request.set_initial_tokens(60);
  const grpc::Status status = stub_->OpenSequence(&context, request, &refused);
  ASSERT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("being reclaimed"));
  const std::optional<v1::AdmissionHint> hint = wire::AdmissionHintOf(FromGrpcStatus(status));
  ASSERT_TRUE(hint.has_value()) << "no AdmissionHint in the status details";
  EXPECT_EQ(hint->outcome(), v1::AdmissionHint::OUTCOME_DELAYED);
  EXPECT_EQ(hint->missing_frames(), 16);
  EXPECT_GE(hint->reclaiming_frames(), 16);
  EXPECT_GT(hint->retry_after_ms(), 0);
  v1::PoolStats stats = Stats("m");
  EXPECT_EQ(stats.used_frames(), 64);  // nothing moved yet
  EXPECT_EQ(stats.sequences_active(), 2);
  EXPECT_EQ(stats.admissions_delayed_total(), 1);
  // The owner's append (into its partial tail page) gives the frames and lists the pages.
  v1::AppendTokensResponse grown;
  ASSERT_TRUE(Append("m", "a", 1, &grown).ok());
  int evicted = 0;
  for (const v1::GroupEviction& group : grown.evicted()) {
    EXPECT_THAT(group.pages(), ::testing::Not(::testing::Contains(0)));  // the heavy page
    EXPECT_THAT(group.pages(), ::testing::Not(::testing::Contains(3)));  // the tail
    evicted += group.pages_size();
  }
  EXPECT_GE(evicted, 16);
  EXPECT_EQ(grown.pressure().reclaimed_frames(), evicted);
  EXPECT_GT(grown.pressure().quota_frames(), 0);
  ASSERT_TRUE(OpenStatus("m", "c", 60).ok());
  stats = Stats("m");
  EXPECT_EQ(stats.used_frames() + stats.free_frames(), stats.capacity_frames());
  EXPECT_GE(stats.frames_reclaimed_admission_total(), 16);
  EXPECT_GE(Metric("entrokv_frames_reclaimed_total", {{"pool", "m"}, {"reason", "admission"}}), 16);
  EXPECT_EQ(Metric("entrokv_admissions_total", {{"pool", "m"}, {"outcome", "delayed"}}), 1);
  EXPECT_DOUBLE_EQ(Metric("entrokv_pool_target_occupancy", {{"pool", "m"}}), 0.9);
  ExpectInvariants("m");
}

TEST_F(PressureServiceTest, BadPressureInputNamesTheFieldAndChangesNothing) {
  Register("m", 80 * kFrameBytes);
  v1::OpenSequenceResponse response;
  grpc::Status status = OpenWith("m", "s", 16, "silver", 0, std::nullopt, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("tenant: 'silver' is not a tenant"));
  status = OpenWith("m", "s", 16, "", 10, std::nullopt, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("priority: must be in [0, 9], got 10"));
  status = OpenWith("m", "s", 16, "", 0, 0.0, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("auto_budget.floor_fraction"));
  EXPECT_EQ(Stats("m").sequences_active(), 0);
  Open("m", "s", 32);
  v1::DecideResponse decided;
  status = DecideAuto("m", "s", 32, 1.5, &decided);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("budget.auto_budget.floor_fraction"));
  v1::ResumeSequenceResponse resumed;
  status = Resume("m", "s", &resumed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("only a swapped-out sequence resumes"));
  EXPECT_EQ(Resume("m", "nobody", &resumed).error_code(), grpc::StatusCode::NOT_FOUND);
  const v1::PoolStats stats = Stats("m");
  EXPECT_EQ(stats.sequences_active(), 1);
  EXPECT_EQ(stats.used_frames(), 16);
  EXPECT_EQ(stats.pages_evicted_total(), 0);
  ExpectInvariants("m");
}

// A server-chosen budget with the request lifecycle: a chunk's running sum and a decision by
// position have no place in the pool's quota, so both are refused naming the field, and a
// swapped-out sequence is not truncated. Nothing changes.
TEST_F(PressureServiceTest, AServerChosenBudgetRefusesChunksAndDegradingAndSwappedTruncation) {
  Register("m", 80 * kFrameBytes);
  Open("m", "s", 32);
  v1::DecideResponse decided;
  grpc::Status status = DecideAuto("m", "s", 32, 0.5, &decided, true, [](v1::DecideRequest& r) {
    r.mutable_layers(1)->set_accumulate(true);
    r.mutable_layers(1)->mutable_statistic()->set_kind(v1::STATISTIC_KIND_ACCUMULATED);
  });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("layers[1].accumulate: not with budget.auto_budget"));
  status = DecideAuto("m", "s", 32, 0.5, &decided, true,
                      [](v1::DecideRequest& r) { r.set_degrade_on_deadline(true); });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("degrade_on_deadline: not with budget.auto_budget"));
  v1::SwapOutSequenceResponse swapped;
  ASSERT_TRUE(SwapOut("m", "s", &swapped).ok());
  {
    grpc::ClientContext context;
    v1::TruncateSequenceRequest request;
    request.set_model_id("m");
    request.set_sequence_id("s");
    request.set_tokens(1);
    v1::TruncateSequenceResponse truncated;
    status = stub_->TruncateSequence(&context, request, &truncated);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(), HasSubstr("swapped out"));
  }
  v1::ResumeSequenceResponse resumed;
  ASSERT_TRUE(Resume("m", "s", &resumed).ok());
  EXPECT_EQ(resumed.sequence().length_tokens(), 32);
  const v1::PoolStats stats = Stats("m");
  EXPECT_EQ(stats.used_frames(), 16);
  EXPECT_EQ(stats.pages_evicted_total(), 0);
  ExpectInvariants("m");
}

TEST_F(PressureServiceTest, FloorsReachedNameTheVictimOnItsNextCall) {
  Register("m", 80 * kFrameBytes);
  v1::OpenSequenceResponse opened;
  ASSERT_TRUE(OpenWith("m", "low", 60, "", 0, 1.0, &opened).ok());
  v1::DecideResponse decided;
  ASSERT_TRUE(DecideAuto("m", "low", 60, 1.0, &decided).ok());
  ASSERT_TRUE(OpenWith("m", "mid", 60, "", 5, std::nullopt, &opened).ok());
  grpc::ClientContext context;
  v1::OpenSequenceRequest request;
  request.set_model_id("m");
  request.set_sequence_id("high");
  request.set_initial_tokens(60);
  request.set_priority(7);
  v1::OpenSequenceResponse refused;
  const grpc::Status status = stub_->OpenSequence(&context, request, &refused);
  ASSERT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  const std::optional<v1::AdmissionHint> hint = wire::AdmissionHintOf(FromGrpcStatus(status));
  ASSERT_TRUE(hint.has_value());
  EXPECT_EQ(hint->outcome(), v1::AdmissionHint::OUTCOME_REFUSED);
  EXPECT_THAT(hint->preempt_sequence_ids(), ElementsAre("low"));
  v1::AppendTokensResponse grown;
  ASSERT_TRUE(Append("m", "low", 1, &grown).ok());
  EXPECT_TRUE(grown.pressure().preempt());
  ASSERT_TRUE(Append("m", "mid", 1, &grown).ok());
  EXPECT_FALSE(grown.pressure().preempt());
  EXPECT_EQ(Stats("m").preemptions_total(), 1);
  EXPECT_EQ(Metric("entrokv_preemptions_total", {{"pool", "m"}}), 1);
  EXPECT_EQ(Metric("entrokv_admissions_total", {{"pool", "m"}, {"outcome", "refused"}}), 1);
  ExpectInvariants("m");
}

TEST_F(PressureServiceTest, SwapOutAndResumeKeepTheBytes) {
  Register("m", 80 * kFrameBytes);
  Open("m", "s", 40);  // 3 pages: 24 frames
  CacheState& state = (*server_->service().registry().Find("m"))->state();
  const SequenceInfo before = *state.GetSequence("s", true);
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int group = 0; group < kGroups; ++group) {
      for (size_t page = 0; page < before.block_tables[layer][group].size(); ++page) {
        std::memset(state.FrameAddress(before.block_tables[layer][group][page]),
                    static_cast<int>(1 + layer * 16 + group * 4 + page), kFrameBytes);
      }
    }
  }
  v1::SwapOutSequenceResponse swapped;
  grpc::Status status = SwapOut("m", "s", &swapped);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(swapped.freed_frames(), 24);
  EXPECT_EQ(swapped.swapped_bytes(), static_cast<int64_t>(24 * kFrameBytes));
  v1::PoolStats stats = Stats("m");
  EXPECT_EQ(stats.used_frames(), 0);
  EXPECT_EQ(stats.sequences_swapped(), 1);
  EXPECT_EQ(Metric("entrokv_sequences_swapped", {{"pool", "m"}}), 1);
  v1::AppendTokensResponse grown;
  status = Append("m", "s", 1, &grown);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("swapped out"));
  Open("m", "other", 40);  // takes the frames s had
  v1::ResumeSequenceResponse resumed;
  status = Resume("m", "s", &resumed);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(resumed.sequence().length_tokens(), 40);
  EXPECT_EQ(resumed.new_frames_size(), 24);
  for (const v1::FrameAssignment& entry : resumed.new_frames()) {
    const auto* bytes = static_cast<const unsigned char*>(state.FrameAddress(entry.frame()));
    EXPECT_EQ(bytes[0], 1 + entry.layer() * 16 + entry.group() * 4 + entry.page());
    EXPECT_EQ(bytes[kFrameBytes - 1], bytes[0]);
  }
  EXPECT_EQ(Metric("entrokv_swaps_total", {{"pool", "m"}, {"direction", "in"}}), 1);
  ExpectInvariants("m");
}

TEST_F(PressureServiceTest, TenantsComeFromTheFlagAndTheirSeriesAreBounded) {
  ServerOptions options = LoopbackOptions();
  options.tenant_share = {{"gold", 0.5}, {"silver", 0.25}};
  Restart(options);
  Register("m", 80 * kFrameBytes);
  v1::OpenSequenceResponse opened;
  ASSERT_TRUE(OpenWith("m", "g", 16, "gold", 0, std::nullopt, &opened).ok());
  ASSERT_TRUE(OpenWith("m", "d", 32, "", 0, std::nullopt, &opened).ok());
  const v1::PoolStats stats = Stats("m");
  ASSERT_EQ(stats.tenants_size(), 3);
  EXPECT_EQ(stats.tenants(0).tenant(), "gold");
  EXPECT_EQ(stats.tenants(0).used_frames(), 8);
  EXPECT_EQ(stats.tenants(0).guaranteed_frames(), 40);
  EXPECT_EQ(stats.tenants(1).tenant(), "silver");
  EXPECT_EQ(stats.tenants(2).tenant(), "");
  EXPECT_EQ(stats.tenants(2).used_frames(), 16);
  EXPECT_EQ(Metric("entrokv_tenant_used_frames", {{"pool", "m"}, {"tenant", "gold"}}), 8);
  EXPECT_EQ(Metric("entrokv_tenant_used_frames", {{"pool", "m"}, {"tenant", "default"}}), 16);
  EXPECT_EQ(Metric("entrokv_tenant_guaranteed_frames", {{"pool", "m"}, {"tenant", "silver"}}), 20);
  int series = 0;
  for (const prometheus::MetricFamily& family : server_->metrics().registry()->Collect()) {
    if (family.name == "entrokv_tenant_used_frames")
      series += static_cast<int>(family.metric.size());
  }
  EXPECT_EQ(series, 3);  // the configured tenants and the default one, whatever is asked
  const grpc::Status status = OpenWith("m", "x", 16, "bronze", 0, std::nullopt, &opened);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("gold, silver"));
  // Listing shows each sequence's terms.
  grpc::ClientContext context;
  v1::ListSequencesRequest request;
  request.set_model_id("m");
  v1::ListSequencesResponse listed;
  ASSERT_TRUE(stub_->ListSequences(&context, request, &listed).ok());
  ASSERT_EQ(listed.sequences_size(), 2);
  EXPECT_EQ(listed.sequences(1).tenant(), "gold");
  EXPECT_EQ(listed.sequences(1).pressure().live_frames(), 8);
}

}  // namespace
}  // namespace entrokv::service::testing
