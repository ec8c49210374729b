// The in-process daemon fixture the integration tests share.
#ifndef ENTROKV_TESTS_SERVICE_SERVICE_FIXTURE_H_
#define ENTROKV_TESTS_SERVICE_SERVICE_FIXTURE_H_

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "tests/service/test_support.h"

namespace entrokv::service::testing {

inline constexpr int kLayers = 4;
inline constexpr int kHeads = 4;
inline constexpr int kGroups = 2;

// The first series of the daemon's metric family `family` whose labels include every
// (name, value) of `labels`; nullopt when there is none.
inline std::optional<prometheus::ClientMetric> FindSeries(
    const Server& server, const std::string& family,
    const std::vector<std::pair<std::string, std::string>>& labels) {
  for (const prometheus::MetricFamily& collected :
       const_cast<Server&>(server).metrics().registry()->Collect()) {
    if (collected.name != family) continue;
    for (const prometheus::ClientMetric& metric : collected.metric) {
      const auto carries = [&metric](const std::pair<std::string, std::string>& wanted) {
        return std::any_of(metric.label.begin(), metric.label.end(), [&wanted](const auto& label) {
          return label.name == wanted.first && label.value == wanted.second;
        });
      };
      if (std::all_of(labels.begin(), labels.end(), carries)) return metric;
    }
  }
  return std::nullopt;
}

class ServiceTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions options = LoopbackOptions()) {
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = MakeChannel(server_->address());
    // Connected before the test's first call: a channel whose first connection attempt fails
    // (seen once under load: every call of the test then failed fast with UNAVAILABLE during
    // the reconnect backoff) reconnects here instead. A server that never accepts fails here.
    ASSERT_TRUE(
        channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
        << "no connection to " << server_->address();
    stub_ = v1::CacheManager::NewStub(channel_);
  }
  void SetUp() override { StartServer(); }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }
  void Restart(ServerOptions options) {
    server_->Shutdown(absl::Seconds(1));
    server_.reset();
    StartServer(options);
  }

  void Register(const std::string& model, uint64_t capacity = 4 << 20) {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    const grpc::Status status = stub_->RegisterModel(
        &context, RegisterRequest(model, kLayers, kHeads, kGroups, capacity), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  grpc::Status OpenStatus(const std::string& model, const std::string& sequence, int64_t tokens) {
    grpc::ClientContext context;
    v1::OpenSequenceRequest request;
    request.set_model_id(model);
    request.set_sequence_id(sequence);
    request.set_initial_tokens(tokens);
    v1::OpenSequenceResponse response;
    return stub_->OpenSequence(&context, request, &response);
  }
  void Open(const std::string& model, const std::string& sequence, int64_t tokens) {
    const grpc::Status status = OpenStatus(model, sequence, tokens);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  v1::PoolStats Stats(const std::string& model) {
    grpc::ClientContext context;
    v1::GetPoolStatsRequest request;
    request.set_model_id(model);
    v1::PoolStats stats;
    EXPECT_TRUE(stub_->GetPoolStats(&context, request, &stats).ok());
    return stats;
  }
  // The open sequence `sequence` of `model` with its block tables (ListSequences).
  v1::SequenceInfo Sequence(const std::string& model, const std::string& sequence) {
    grpc::ClientContext context;
    v1::ListSequencesRequest request;
    request.set_model_id(model);
    request.set_include_block_tables(true);
    v1::ListSequencesResponse response;
    EXPECT_TRUE(stub_->ListSequences(&context, request, &response).ok());
    for (const v1::SequenceInfo& info : response.sequences()) {
      if (info.sequence_id() == sequence) return info;
    }
    ADD_FAILURE() << "no sequence " << sequence;
    return {};
  }
  void ExpectInvariants(const std::string& model) {
    absl::StatusOr<std::shared_ptr<Model>> found = server_->service().registry().Find(model);
    ASSERT_TRUE(found.ok());
    EXPECT_TRUE((*found)->state().CheckInvariants().ok()) << (*found)->state().CheckInvariants();
  }
  // A Decide that must be refused: INVALID_ARGUMENT whose message names `field`.
  struct BadDecide {
    v1::DecideRequest request;
    std::string field;
  };
  // Each request is refused by name, and sequence "s" of `model` and its pool stay as they were.
  void ExpectRefusedChangingNothing(const std::string& model, const std::vector<BadDecide>& cases) {
    const v1::SequenceInfo before = Sequence(model, "s");
    const int64_t evicted = Stats(model).pages_evicted_total();
    for (const BadDecide& bad : cases) {
      grpc::ClientContext context;
      v1::DecideResponse response;
      const grpc::Status status = stub_->Decide(&context, bad.request, &response);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.field;
      EXPECT_THAT(status.error_message(), ::testing::HasSubstr(bad.field));
    }
    EXPECT_EQ(Sequence(model, "s").DebugString(), before.DebugString());
    EXPECT_EQ(Stats(model).pages_evicted_total(), evicted);
    ExpectInvariants(model);
  }
  // `request` with degrade_on_deadline, on a call that must answer within 20 s, while the
  // decider estimates every layer past its time: each layer is decided by position.
  grpc::Status DecideAllDegraded(v1::DecideRequest request, v1::DecideResponse* response) {
    server_->service().decider().SetSecondsPerValueForTest(1.0);
    request.set_degrade_on_deadline(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return stub_->Decide(&context, request, response);
  }
  v1::DecideRequest DecideAll(const std::string& model, const std::string& sequence, int64_t tokens,
                              int64_t pages, uint32_t seed, v1::DType dtype = v1::DTYPE_BFLOAT16) {
    v1::DecideRequest request;
    request.set_model_id(model);
    request.set_sequence_id(sequence);
    request.mutable_budget()->set_pages_per_group(pages);
    for (int layer = 0; layer < kLayers; ++layer) {
      v1::LayerStatistic* in = request.add_layers();
      in->set_layer(layer);
      *in->mutable_statistic() =
          BytesStatistic(RandomStatistic(kHeads, tokens, seed + layer), kHeads, tokens, dtype);
    }
    return request;
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CacheManager::Stub> stub_;
};

}  // namespace entrokv::service::testing

#endif  // ENTROKV_TESTS_SERVICE_SERVICE_FIXTURE_H_
