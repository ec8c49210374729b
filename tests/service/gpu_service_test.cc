// The daemon on a GPU (label gpu; every test skips where this host has no CUDA device): a pool
// per device with its metric, a device that does not exist refused by name with nothing
// registered, and the CUDA scorer deciding through the real gRPC service exactly as the CPU one.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/device.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"

namespace entrokv::service::testing {
namespace {

using ::testing::HasSubstr;

class GpuServiceTest : public ServiceTest {
 protected:
  void SetUp() override {
    const absl::StatusOr<int> count = cuda::DeviceCount();
    if (!count.ok()) GTEST_SKIP() << "no GPU here: " << count.status();
    devices_ = *count;
    ServerOptions options = LoopbackOptions();
    options.backend = Backend::kCuda;
    options.scorer = ScorerSetting::kCuda;
    StartServer(options);
  }
  grpc::Status RegisterStatus(const v1::RegisterModelRequest& request,
                              v1::RegisterModelResponse* response) {
    grpc::ClientContext context;
    return stub_->RegisterModel(&context, request, response);
  }
  int devices_ = 0;
};

TEST_F(GpuServiceTest, EachPoolIsOnTheDeviceItNamesWithItsMetric) {
  for (int device = 0; device < devices_; ++device) {
    v1::RegisterModelRequest request =
        RegisterRequest(absl::StrCat("m", device), kLayers, kHeads, kGroups, 4 << 20);
    request.add_devices(device);
    v1::RegisterModelResponse response;
    const grpc::Status status = RegisterStatus(request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    const v1::PoolInfo& pool = response.pool();
    EXPECT_EQ(pool.backend(), v1::BACKEND_CUDA);
    ASSERT_EQ(pool.ranks_size(), 1);
    EXPECT_EQ(pool.ranks(0).device(), device);
    EXPECT_EQ(pool.ranks(0).cuda_ipc_handle().size(), 64u);
    const std::optional<prometheus::ClientMetric> series =
        FindSeries(*server_, "entrokv_pool_device_bytes",
                   {{"pool", absl::StrCat("m", device)}, {"device", absl::StrCat(device)}});
    ASSERT_TRUE(series.has_value());
    EXPECT_EQ(series->gauge.value, static_cast<double>(pool.capacity_bytes()));
  }
}

TEST_F(GpuServiceTest, ADeviceThatDoesNotExistIsRefusedByNameAndNothingChanges) {
  for (const int device : {devices_, 64, -1}) {
    v1::RegisterModelRequest request = RegisterRequest("ghost", kLayers, kHeads, kGroups, 4 << 20);
    request.add_devices(device);
    v1::RegisterModelResponse response;
    const grpc::Status status = RegisterStatus(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << device;
    EXPECT_THAT(status.error_message(), HasSubstr("device")) << device;
    grpc::ClientContext context;
    v1::ListModelsRequest list;
    v1::ListModelsResponse models;
    ASSERT_TRUE(stub_->ListModels(&context, list, &models).ok());
    EXPECT_EQ(models.pools_size(), 0) << device;
  }
}

// The same calls to a daemon scoring on the CPU and to this one: every response equal, field by
// field (kept pages, weights, entropies, measurements, freed frames).
TEST_F(GpuServiceTest, TheCudaScorerDecidesAsTheCpuScorer) {
  ServerOptions cpu_options = LoopbackOptions();
  cpu_options.backend = Backend::kCuda;
  cpu_options.scorer = ScorerSetting::kCpu;
  absl::StatusOr<std::unique_ptr<Server>> cpu_server = Server::Start(cpu_options);
  ASSERT_TRUE(cpu_server.ok()) << cpu_server.status();
  const std::unique_ptr<v1::CacheManager::Stub> cpu =
      v1::CacheManager::NewStub(MakeChannel((*cpu_server)->address()));
  v1::CacheManager::Stub* const stubs[2] = {stub_.get(), cpu.get()};
  for (v1::CacheManager::Stub* stub : stubs) {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    ASSERT_TRUE(stub->RegisterModel(&context,
                                    RegisterRequest("m", kLayers, kHeads, kGroups, 64 << 20),
                                    &response)
                    .ok());
  }
  int sequence = 0;
  for (const char* policy : {"page_entrokv", "mean", "max", "h2o", "raw_entropy"}) {
    for (const v1::SelectionScope scope : {v1::SELECTION_SCOPE_GROUP, v1::SELECTION_SCOPE_LAYER}) {
      for (const int64_t tokens : {5, 1000, 4099}) {
        const std::string id = absl::StrCat("s", sequence++);
        v1::DecideRequest request = DecideAll("m", id, tokens, 1 + tokens / 64, sequence);
        request.mutable_policy()->set_name(policy);
        request.mutable_policy()->set_scope(scope);
        v1::DecideResponse responses[2];
        for (int i = 0; i < 2; ++i) {
          grpc::ClientContext open_context;
          v1::OpenSequenceRequest open;
          open.set_model_id("m");
          open.set_sequence_id(id);
          open.set_initial_tokens(tokens);
          v1::OpenSequenceResponse opened;
          ASSERT_TRUE(stubs[i]->OpenSequence(&open_context, open, &opened).ok());
          grpc::ClientContext context;
          const grpc::Status status = stubs[i]->Decide(&context, request, &responses[i]);
          ASSERT_TRUE(status.ok()) << status.error_message();
        }
        SCOPED_TRACE(::testing::Message() << policy << " scope " << scope << " T " << tokens);
        std::string difference;
        google::protobuf::util::MessageDifferencer differencer;
        differencer.ReportDifferencesToString(&difference);
        EXPECT_TRUE(differencer.Compare(responses[1], responses[0])) << difference;
      }
    }
  }
  (*cpu_server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace entrokv::service::testing
