// Statistics in a worker's GPU memory (Statistic.device_buffer) against the real daemon over
// loopback, on any machine: every bad region is refused with the field named and nothing
// changed, and a daemon that cannot map device memory (no GPU, or built without CUDA) says so.
// What needs a GPU is in device_buffer_gpu_test.cc.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"
#ifdef ENTROKV_HAVE_CUDA
#include "core/cuda/device.h"
#endif

namespace entrokv::service::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kTokens = 64;
constexpr uint64_t kF32Bytes = uint64_t{kHeads} * kTokens * 4;

// True when this process can map device memory: the no-device answers are then not the ones
// seen (the GPU test covers that machine).
bool HaveDevice() {
#ifdef ENTROKV_HAVE_CUDA
  return cuda::DeviceCount().ok();
#else
  return false;
#endif
}

v1::Statistic DeviceStat(uint64_t length_bytes, int64_t tokens = kTokens) {
  v1::Statistic stat;
  stat.set_dtype(v1::DTYPE_FLOAT32);
  stat.set_query_heads(kHeads);
  stat.set_tokens(tokens);
  v1::DeviceBufferRegion* region = stat.mutable_device_buffer();
  region->set_cuda_ipc_handle(std::string(64, '\x5a'));
  region->set_length_bytes(length_bytes);
  region->set_generation(1);
  return stat;
}

class DeviceBufferTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    Register("m");
    Open("m", "s", kTokens);
  }
  // A Decide of every layer: layer 0..2 inline, layer 3 the device statistic `stat`.
  v1::DecideRequest WithDeviceLayer(const v1::Statistic& stat) {
    v1::DecideRequest request = DecideAll("m", "s", kTokens, 2, 7, v1::DTYPE_FLOAT32);
    *request.mutable_layers(3)->mutable_statistic() = stat;
    return request;
  }
  grpc::Status Decide(const v1::DecideRequest& request) {
    grpc::ClientContext context;
    v1::DecideResponse response;
    return stub_->Decide(&context, request, &response);
  }
  // The state a refused decision must leave as it was.
  std::string Snapshot() {
    return Sequence("m", "s").SerializeAsString() + Stats("m").SerializeAsString();
  }
  void ExpectRefused(const v1::Statistic& stat, grpc::StatusCode code, const std::string& text) {
    const std::string before = Snapshot();
    const grpc::Status status = Decide(WithDeviceLayer(stat));
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(text));
    EXPECT_EQ(Snapshot(), before) << "a refused decision changed the pool";
    EXPECT_EQ(server_->service().device_reader().mapped(), 0);
  }
};

TEST_F(DeviceBufferTest, BadRegionsAreRefusedNamingTheField) {
  v1::Statistic stat = DeviceStat(kF32Bytes);
  stat.mutable_device_buffer()->set_cuda_ipc_handle("short");
  ExpectRefused(stat, grpc::StatusCode::INVALID_ARGUMENT,
                "layers[3].statistic.device_buffer.cuda_ipc_handle: 5 bytes");

  ExpectRefused(DeviceStat(kF32Bytes - 4), grpc::StatusCode::INVALID_ARGUMENT,
                "layers[3].statistic.device_buffer.length_bytes: 1020, expected 1024");

  stat = DeviceStat(kF32Bytes);
  stat.mutable_device_buffer()->set_offset_bytes(6);
  ExpectRefused(stat, grpc::StatusCode::INVALID_ARGUMENT,
                "layers[3].statistic.device_buffer.offset_bytes: 6 is not element-aligned");

  stat = DeviceStat(kF32Bytes);
  stat.mutable_device_buffer()->set_offset_bytes(UINT64_MAX - 3);
  ExpectRefused(stat, grpc::StatusCode::INVALID_ARGUMENT,
                "layers[3].statistic.device_buffer.offset_bytes");

  stat = DeviceStat(kF32Bytes);
  stat.mutable_device_buffer()->set_device(-2);
  ExpectRefused(stat, grpc::StatusCode::INVALID_ARGUMENT,
                "layers[3].statistic.device_buffer.device: -2 is negative");

  // The shape is checked before the region, as for the other sources.
  ExpectRefused(DeviceStat(kF32Bytes + 16, kTokens + 1), grpc::StatusCode::FAILED_PRECONDITION,
                "layers[3].statistic.tokens: 65 but the sequence holds 64");
  stat = DeviceStat(kF32Bytes);
  stat.set_query_heads(kHeads + 1);
  ExpectRefused(stat, grpc::StatusCode::INVALID_ARGUMENT, "layers[3].statistic.query_heads");
}

TEST_F(DeviceBufferTest, ADaemonThatCannotMapDeviceMemorySaysSo) {
  if (HaveDevice()) GTEST_SKIP() << "a GPU is here: device_buffer_gpu_test covers it";
#ifdef ENTROKV_HAVE_CUDA
  const grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE;  // no driver or device
  const std::string why = "no usable CUDA device";
#else
  const grpc::StatusCode code = grpc::StatusCode::FAILED_PRECONDITION;
  const std::string why = "built without CUDA";
#endif
  ExpectRefused(DeviceStat(kF32Bytes), code, "layers[3].statistic.device_buffer.cuda_ipc_handle: ");
  const grpc::Status status = Decide(WithDeviceLayer(DeviceStat(kF32Bytes)));
  EXPECT_THAT(status.error_message(), HasSubstr(why));
  // Nothing was counted as received from a device buffer.
  const auto bytes =
      FindSeries(*server_, "entrokv_stats_bytes_total", {{"source", "device_buffer"}});
  ASSERT_TRUE(bytes.has_value());
  EXPECT_EQ(bytes->counter.value, 0.0);
  // The daemon still decides the same layers sent inline.
  EXPECT_TRUE(Decide(DecideAll("m", "s", kTokens, 2, 7, v1::DTYPE_FLOAT32)).ok());
}

TEST_F(DeviceBufferTest, DecideStreamNamesItsField) {
  v1::DecideLayerRequest request;
  request.set_model_id("m");
  request.set_sequence_id("s");
  request.mutable_budget()->set_pages_per_group(2);
  request.mutable_layer()->set_layer(1);
  *request.mutable_layer()->mutable_statistic() = DeviceStat(kF32Bytes * 2);
  const std::string before = Snapshot();
  grpc::ClientContext context;
  auto stream = stub_->DecideStream(&context);
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  v1::LayerDecision ignored;
  while (stream->Read(&ignored)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("layer.statistic.device_buffer.length_bytes: 2048, expected 1024"));
  EXPECT_EQ(Snapshot(), before);
}

TEST_F(DeviceBufferTest, TensorParallelRanksNameTheirField) {
  ServerOptions options = LoopbackOptions();
  options.host_devices = 2;  // host arenas stand in for the ranks' devices
  Restart(options);
  v1::RegisterModelRequest tp = RegisterRequest("tp", kLayers, kHeads, kGroups, 1 << 20);
  tp.set_frame_layout(v1::FRAME_LAYOUT_LAYER);
  tp.set_tensor_parallel_size(2);
  {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    const grpc::Status registered = stub_->RegisterModel(&context, tp, &response);
    ASSERT_TRUE(registered.ok()) << registered.error_message();
  }
  Open("tp", "s", kTokens);
  v1::DecideRequest request;
  request.set_model_id("tp");
  request.set_sequence_id("s");
  request.set_rank(0);
  request.mutable_budget()->set_pages_per_group(2);
  v1::LayerStatistic* layer = request.add_layers();
  layer->set_layer(0);
  *layer->mutable_statistic() = DeviceStat(kF32Bytes);  // the whole model's, not rank 0's
  layer->mutable_statistic()->set_query_heads(kHeads / 2);
  const grpc::Status status = Decide(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("layers[0].statistic.device_buffer.length_bytes: 1024, expected 512"));
  EXPECT_EQ(server_->service().device_reader().mapped(), 0);
}

}  // namespace
}  // namespace entrokv::service::testing
