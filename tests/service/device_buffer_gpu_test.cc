// device_buffer statistics on a GPU (label gpu; skipped without a device): a worker process
// (device_buffer_exporter) exports an allocation, the in-process daemon maps it and decides on
// it exactly as on the same values sent inline; generations, ranges, a freed allocation and a
// worker that exits while its allocation is mapped get clear answers, never a crash; closing
// the sequence releases the mapping.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/cuda/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/device_buffer_values.h"
#include "tests/service/service_fixture.h"

extern char** environ;

namespace entrokv::service::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kTokens = 64;
constexpr uint64_t kValues = uint64_t{kHeads} * kTokens;
constexpr uint64_t kF32Bytes = kValues * 4;

// The exporter binary: $ENTROKV_DEVICE_BUFFER_EXPORTER, else next to this test, else where the
// build put it.
std::string ExporterPath() {
  if (const char* path = std::getenv("ENTROKV_DEVICE_BUFFER_EXPORTER")) return path;
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir.resize(dir.rfind('/') + 1);
    const std::string beside = dir + "device_buffer_exporter";
    if (::access(beside.c_str(), X_OK) == 0) return beside;
  }
  return ENTROKV_DEVICE_BUFFER_EXPORTER_PATH;
}

// One exporter process with pipes to its stdin and from its stdout; killed when destroyed.
class Exporter {
 public:
  explicit Exporter(uint64_t bytes) {
    int to_child[2];
    int from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    posix_spawn_file_actions_addclose(&actions, to_child[1]);
    posix_spawn_file_actions_addclose(&actions, from_child[0]);
    const std::string path = ExporterPath();
    const std::string size = std::to_string(bytes);
    char* argv[] = {const_cast<char*>(path.c_str()), const_cast<char*>(size.c_str()), nullptr};
    if (posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv, environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    ::close(to_child[0]);
    ::close(from_child[1]);
    in_ = ::fdopen(to_child[1], "w");
    out_ = ::fdopen(from_child[0], "r");
    const std::string first = ReadLine();  // "handle <hex> bytes <n>"
    const std::vector<std::string> words = absl::StrSplit(first, ' ');
    if (words.size() == 4 && words[0] == "handle") handle_ = absl::HexStringToBytes(words[1]);
  }
  ~Exporter() {
    if (in_ != nullptr) std::fclose(in_);
    if (out_ != nullptr) std::fclose(out_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  [[nodiscard]] const std::string& handle() const { return handle_; }
  std::string Command(const std::string& line) {
    std::fprintf(in_, "%s\n", line.c_str());
    std::fflush(in_);
    return ReadLine();
  }
  // Asks it to exit and waits until it has.
  void Exit() {
    std::fprintf(in_, "exit\n");
    std::fflush(in_);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  std::string ReadLine() {
    char buffer[512];
    if (out_ == nullptr || std::fgets(buffer, sizeof(buffer), out_) == nullptr) return "";
    std::string line(buffer);
    while (!line.empty() && line.back() == '\n') line.pop_back();
    return line;
  }
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  std::string handle_;
};

v1::Statistic DeviceStat(const std::string& handle, uint64_t offset, uint64_t generation) {
  v1::Statistic stat;
  stat.set_dtype(v1::DTYPE_FLOAT32);
  stat.set_query_heads(kHeads);
  stat.set_tokens(kTokens);
  v1::DeviceBufferRegion* region = stat.mutable_device_buffer();
  region->set_cuda_ipc_handle(handle);
  region->set_offset_bytes(offset);
  region->set_length_bytes(kF32Bytes);
  region->set_generation(generation);
  return stat;
}

// The exporter's values from element `first` on, as one layer's statistic.
std::vector<float> ExportedValues(uint64_t first) {
  std::vector<float> values(kValues);
  for (uint64_t i = 0; i < kValues; ++i) values[i] = entrokv::testing::ExporterValue(first + i);
  return values;
}

class DeviceBufferGpuTest : public ServiceTest {
 protected:
  void SetUp() override {
    if (!cuda::DeviceCount().ok()) GTEST_SKIP() << "no CUDA device";
    ServiceTest::SetUp();
    Register("m");
  }
  grpc::Status DecideLayer3(const std::string& sequence, const v1::Statistic& stat,
                            v1::DecideResponse* response) {
    v1::DecideRequest request;
    request.set_model_id("m");
    request.set_sequence_id(sequence);
    request.mutable_budget()->set_pages_per_group(2);
    v1::LayerStatistic* layer = request.add_layers();
    layer->set_layer(3);
    *layer->mutable_statistic() = stat;
    grpc::ClientContext context;
    return stub_->Decide(&context, request, response);
  }
  int Mapped() { return server_->service().device_reader().mapped(); }
};

TEST_F(DeviceBufferGpuTest, DecidesAsTheSameValuesInlineAndReleasesOnClose) {
  Exporter worker(2 * kF32Bytes);
  ASSERT_EQ(worker.handle().size(), 64u) << "no handle from " << ExporterPath();
  Open("m", "inline", kTokens);
  Open("m", "device", kTokens);
  v1::DecideResponse inline_answer;
  ASSERT_TRUE(
      DecideLayer3("inline",
                   BytesStatistic(ExportedValues(kValues), kHeads, kTokens, v1::DTYPE_FLOAT32),
                   &inline_answer)
          .ok());
  v1::DecideResponse device_answer;
  const grpc::Status status =
      DecideLayer3("device", DeviceStat(worker.handle(), kF32Bytes, 1), &device_answer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(device_answer.layers_size(), 1);
  for (int g = 0; g < kGroups; ++g) {
    EXPECT_EQ(device_answer.layers(0).groups(g).kept_pages_size(), 2);
    EXPECT_THAT(device_answer.layers(0).groups(g).kept_pages(),
                ::testing::ElementsAreArray(inline_answer.layers(0).groups(g).kept_pages()));
  }
  EXPECT_EQ(Mapped(), 1);
  const auto bytes =
      FindSeries(*server_, "entrokv_stats_bytes_total", {{"source", "device_buffer"}});
  ASSERT_TRUE(bytes.has_value());
  EXPECT_EQ(bytes->counter.value, static_cast<double>(kF32Bytes));

  // Mapped once: the same handle again, and a newer generation, decide; an older one does not.
  v1::DecideResponse again;
  EXPECT_TRUE(DecideLayer3("device", DeviceStat(worker.handle(), kF32Bytes, 1), &again).ok());
  EXPECT_EQ(Mapped(), 1);
  const grpc::Status newer = DecideLayer3("device", DeviceStat(worker.handle(), 0, 2), &again);
  EXPECT_TRUE(newer.ok()) << newer.error_message();
  EXPECT_EQ(Mapped(), 1);
  const grpc::Status older = DecideLayer3("device", DeviceStat(worker.handle(), 0, 1), &again);
  EXPECT_EQ(older.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(older.error_message(), HasSubstr("layers[0].statistic.device_buffer.generation"));

  // A range past the allocation's end (far past: the driver may round the allocation up).
  const grpc::Status outside =
      DecideLayer3("device", DeviceStat(worker.handle(), uint64_t{1} << 30, 2), &again);
  EXPECT_EQ(outside.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(outside.error_message(), HasSubstr("is outside the allocation of"));

  grpc::ClientContext context;
  v1::CloseSequenceRequest close;
  close.set_model_id("m");
  close.set_sequence_id("device");
  v1::CloseSequenceResponse closed;
  ASSERT_TRUE(stub_->CloseSequence(&context, close, &closed).ok());
  EXPECT_EQ(Mapped(), 0);
}

TEST_F(DeviceBufferGpuTest, AFreedAllocationIsAClearError) {
  Exporter worker(kF32Bytes);
  ASSERT_EQ(worker.handle().size(), 64u);
  ASSERT_EQ(worker.Command("free"), "freed");
  Open("m", "s", kTokens);
  v1::DecideResponse response;
  const grpc::Status status = DecideLayer3("s", DeviceStat(worker.handle(), 0, 1), &response);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.error_message(), HasSubstr("layers[0].statistic.device_buffer"));
  EXPECT_EQ(Mapped(), 0);
  // The daemon goes on deciding.
  EXPECT_TRUE(DecideLayer3("s",
                           BytesStatistic(ExportedValues(0), kHeads, kTokens, v1::DTYPE_FLOAT32),
                           &response)
                  .ok());
}

TEST_F(DeviceBufferGpuTest, AWorkerExitingWhileMappedNeverCrashesTheDaemon) {
  Open("m", "s", kTokens);
  v1::DecideResponse response;
  {
    Exporter worker(kF32Bytes);
    ASSERT_EQ(worker.handle().size(), 64u);
    const std::string handle = worker.handle();
    ASSERT_TRUE(DecideLayer3("s", DeviceStat(handle, 0, 1), &response).ok());
    worker.Exit();
    // The mapping still holds the memory, or the read fails cleanly: either way an answer.
    const grpc::Status after = DecideLayer3("s", DeviceStat(handle, 0, 1), &response);
    if (!after.ok()) {
      EXPECT_THAT(after.error_message(), HasSubstr("layers[0].statistic.device_buffer"));
    }
  }
  grpc::ClientContext context;
  v1::CloseSequenceRequest close;
  close.set_model_id("m");
  close.set_sequence_id("s");
  v1::CloseSequenceResponse closed;
  ASSERT_TRUE(stub_->CloseSequence(&context, close, &closed).ok());
  EXPECT_EQ(Mapped(), 0);
  Open("m", "t", kTokens);
  EXPECT_TRUE(DecideLayer3("t",
                           BytesStatistic(ExportedValues(0), kHeads, kTokens, v1::DTYPE_FLOAT32),
                           &response)
                  .ok());
}

}  // namespace
}  // namespace entrokv::service::testing
