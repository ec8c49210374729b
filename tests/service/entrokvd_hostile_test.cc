// A real entrokvd subprocess against hostile clients and local users: whatever they
// send or do to their shared-memory segments, the call may fail but the daemon lives and keeps
// deciding for everyone else.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/test_support.h"
#include "tests/support/http_get.h"

namespace entrokv::service {
namespace {

using ::entrokv::service::testing::DaemonProcess;
using ::entrokv::service::testing::Encode;
using ::entrokv::service::testing::MakeChannel;
using ::entrokv::service::testing::RandomStatistic;
using ::entrokv::service::testing::RegisterRequest;

constexpr int kHeads = 8;

// A daemon on loopback with two scoring threads and no metrics endpoint.
class HostileClientTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }

  void Start(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--listen=127.0.0.1:0",
                                     "--metrics_listen=", "--worker_threads=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<DaemonProcess>(ENTROKVD_PATH, args);
    ASSERT_TRUE(daemon_->WaitListening(10000)) << daemon_->Stderr();
    stub_ = v1::CacheManager::NewStub(MakeChannel("127.0.0.1:" + std::to_string(daemon_->port())));
  }

  // Registers model "m" (one layer) and opens sequence "s" of `tokens` tokens.
  void RegisterAndOpen(int64_t tokens) {
    grpc::ClientContext c1;
    v1::RegisterModelResponse registered;
    ASSERT_TRUE(stub_
                    ->RegisterModel(&c1, RegisterRequest("m", 1, kHeads, 2, uint64_t{64} << 20),
                                    &registered)
                    .ok());
    grpc::ClientContext c2;
    v1::OpenSequenceRequest open;
    open.set_model_id("m");
    open.set_sequence_id("s");
    open.set_initial_tokens(tokens);
    v1::OpenSequenceResponse opened;
    ASSERT_TRUE(stub_->OpenSequence(&c2, open, &opened).ok());
  }

  // A one-layer Decide of "s" reading its bf16 statistic from `segment` at offset 0.
  static v1::DecideRequest ShmDecide(const std::string& segment, int64_t tokens) {
    v1::DecideRequest request;
    request.set_model_id("m");
    request.set_sequence_id("s");
    request.mutable_budget()->set_pages_per_group(64);
    v1::LayerStatistic* layer = request.add_layers();
    layer->set_layer(0);
    v1::Statistic* stat = layer->mutable_statistic();
    stat->set_dtype(v1::DTYPE_BFLOAT16);
    stat->set_query_heads(kHeads);
    stat->set_tokens(tokens);
    v1::SharedMemoryRegion* region = stat->mutable_shared_memory();
    region->set_segment(segment);
    region->set_length_bytes(static_cast<uint64_t>(kHeads) * tokens * 2);
    return request;
  }

  grpc::Status Decide(const v1::DecideRequest& request, int timeout_ms = 10000) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    v1::DecideResponse response;
    return stub_->Decide(&context, request, &response);
  }

  // True when the daemon still answers.
  bool Answers() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListModelsResponse response;
    return stub_->ListModels(&context, v1::ListModelsRequest(), &response).ok();
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::CacheManager::Stub> stub_;
};

// A worker shrinking its segment while the daemon reads it used to SIGBUS the
// daemon within a few calls.
TEST_F(HostileClientTest, ShrinkingASegmentWhileDecidingFailsTheCallNotTheDaemon) {
  constexpr int64_t kTokens = 65536;
  RegisterAndOpen(kTokens);
  const std::string name = "/entrokv-shrink-" + std::to_string(::getpid());
  const std::string values = Encode(RandomStatistic(kHeads, kTokens, 7), v1::DTYPE_BFLOAT16);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, values.data(), values.size(), 0), static_cast<ssize_t>(values.size()));

  std::atomic<bool> stop{false};
  std::thread shrinker([&] {
    while (!stop.load()) {
      (void)::ftruncate(fd, 4096);
      (void)::ftruncate(fd, static_cast<off_t>(values.size()));
    }
  });
  const v1::DecideRequest request = ShmDecide(name, kTokens);
  int ok = 0;
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    const grpc::Status status = Decide(request);
    if (!status.ok() && status.error_code() != grpc::StatusCode::INVALID_ARGUMENT &&
        status.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
      ADD_FAILURE() << "call " << i << ": " << status.error_code() << " " << status.error_message();
      break;
    }
    (status.ok() ? ok : refused) += 1;
  }
  stop.store(true);
  shrinker.join();
  ::close(fd);
  ::shm_unlink(name.c_str());
  EXPECT_TRUE(Answers());
  EXPECT_EQ(::kill(daemon_->pid(), 0), 0);
  RecordProperty("ok", ok);
  RecordProperty("refused", refused);
}

// A FIFO named as a segment used to block the worker threads in open(2) for good,
// and with them every later decision and the shutdown.
TEST_F(HostileClientTest, AFifoNamedAsASegmentIsRefusedWithoutBlocking) {
  constexpr int64_t kTokens = 256;
  RegisterAndOpen(kTokens);
  const std::string name = "/entrokv-fifo-" + std::to_string(::getpid());
  const std::string path = "/dev/shm" + name;
  ::unlink(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const v1::DecideRequest request = ShmDecide(name, kTokens);
  for (int i = 0; i < 3; ++i) {  // more calls than scoring threads
    const grpc::Status status = Decide(request, 3000);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr("layers[0].statistic.shared_memory"));
  }
  ::unlink(path.c_str());
  EXPECT_TRUE(Answers());
  daemon_->Signal(SIGTERM);
  EXPECT_EQ(daemon_->WaitExit(15000), 0);
}

// Another daemon's arena named as a statistic, under its own name or a hard link of a
// worker's kind: the check matched only an old arena name form, so this daemon read the other
// one's KV bytes and answered OK. Arenas are known by what they hold, whatever the name.
TEST_F(HostileClientTest, AnotherDaemonsArenaIsNeverReadAsAStatistic) {
  constexpr int64_t kTokens = 64;
  DaemonProcess other(ENTROKVD_PATH, {"--listen=127.0.0.1:0", "--metrics_listen="});
  ASSERT_TRUE(other.WaitListening(10000)) << other.Stderr();
  auto other_stub =
      v1::CacheManager::NewStub(MakeChannel("127.0.0.1:" + std::to_string(other.port())));
  std::string arena;
  {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    ASSERT_TRUE(
        other_stub
            ->RegisterModel(&context, RegisterRequest("victim", 1, kHeads, 2, 1 << 20), &response)
            .ok());
    arena = response.pool().arena_name();
  }
  const std::string link = "/entrokv-stat-link-" + std::to_string(::getpid());
  ::unlink(("/dev/shm" + link).c_str());
  ASSERT_EQ(::link(("/dev/shm" + arena).c_str(), ("/dev/shm" + link).c_str()), 0);
  RegisterAndOpen(kTokens);
  for (const std::string& name : {arena, link}) {
    const grpc::Status status = Decide(ShmDecide(name, kTokens));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << name << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr("arena"));
  }
  ::unlink(("/dev/shm" + link).c_str());
  EXPECT_TRUE(Answers());
  other.Signal(SIGTERM);
  EXPECT_EQ(other.WaitExit(15000), 0);
}

// A directory as --token_file or --tls_cert aborted (rc 134), garbage TLS material
// exited 1 blaming --listen after binding the metrics port, a huge --drain_timeout_ms overflowed
// at SIGTERM. Each must exit 2 naming the option, with no port bound.
TEST(BadConfigurationTest, ExitsTwoNamingTheOptionBeforeBindingAnything) {
  const std::string dir = ::testing::TempDir() + "/entrokvd_dir_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  const std::string garbage = dir + "/garbage.pem";
  FILE* f = std::fopen(garbage.c_str(), "w");
  std::fputs("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n", f);
  std::fclose(f);
  const int port = testing::FreePort();
  const int metrics_port = testing::FreePort();
  struct Case {
    std::vector<std::string> args;
    std::string option;
  };
  const std::vector<Case> cases = {
      {{"--token_file=" + dir}, "--token_file"},
      {{"--tls_cert=" + dir, "--tls_key=" + garbage}, "--tls_cert"},
      {{"--tls_cert=" + garbage, "--tls_key=" + garbage}, "--tls_cert"},
      {{"--drain_timeout_ms=9223372036854775807"}, "--drain_timeout_ms"},
      {{"--keepalive_ms=4294967296"}, "--keepalive_ms"},
      // Abseil reads a directory as an empty flagfile: the daemon started on its defaults.
      {{"--config=" + dir}, "--config"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.push_back("--listen=127.0.0.1:" + std::to_string(port));
    args.push_back("--metrics_listen=127.0.0.1:" + std::to_string(metrics_port));
    DaemonProcess daemon(ENTROKVD_PATH, args);
    EXPECT_EQ(daemon.WaitExit(10000), 2) << c.option << ": " << daemon.Stderr();
    EXPECT_THAT(daemon.Stderr(), ::testing::HasSubstr(c.option));
  }
  // Nothing was bound: both ports are still free.
  EXPECT_THAT(::entrokv::testing::HttpGet(metrics_port, "/metrics"),
              ::entrokv::testing::StatusIs(absl::StatusCode::kUnavailable,
                                           ::testing::HasSubstr("connect")));
  EXPECT_THAT(::entrokv::testing::HttpGet(port, "/"),
              ::entrokv::testing::StatusIs(absl::StatusCode::kUnavailable,
                                           ::testing::HasSubstr("connect")));
  ::unlink(garbage.c_str());
  ::rmdir(dir.c_str());
}

// --scorer=cuda where the build or the host has no CUDA device is configuration to fix: exit 2
// naming --scorer, not a daemon scoring on the CPU against what it was told. (On a GPU host the
// daemon starts: nothing to check here.)
TEST(BadConfigurationTest, ScorerCudaWithoutAGpuExitsTwoNamingIt) {
  DaemonProcess daemon(ENTROKVD_PATH,
                       {"--scorer=cuda", "--listen=127.0.0.1:0", "--metrics_listen="});
  if (daemon.WaitListening(10000)) {
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.WaitExit(15000), 0);
    GTEST_SKIP() << "this host has a CUDA device";
  }
  EXPECT_EQ(daemon.WaitExit(10000), 2) << daemon.Stderr();
  EXPECT_THAT(daemon.Stderr(), ::testing::HasSubstr("--scorer=cuda"));
}

}  // namespace
}  // namespace entrokv::service
