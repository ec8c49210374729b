// entrokv::Client against a real entrokvd process: retries on UNAVAILABLE only, with backoff.
// (Deadlines are covered by the service tests, R3.)
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/test_support.h"

namespace entrokv {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

TEST(ClientRetryTest, UnavailableIsRetriedWithBackoffUntilTheDaemonListens) {
  const int port = service::testing::FreePort();
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", port);
  options.max_attempts = 8;
  options.initial_backoff = std::chrono::milliseconds(100);  // 100+200+...: ~25 s in all
  options.timeout = std::chrono::milliseconds(2000);
  Client client(options);
  // The daemon comes up while the client is already retrying.
  std::unique_ptr<service::testing::DaemonProcess> daemon;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    daemon = std::make_unique<service::testing::DaemonProcess>(
        ENTROKVD_PATH, std::vector<std::string>{absl::StrCat("--listen=127.0.0.1:", port),
                                                "--metrics_listen=127.0.0.1:0"});
  });
  const auto start = Clock::now();
  const absl::StatusOr<v1::ListModelsResponse> models = client.ListModels();
  const auto elapsed = Clock::now() - start;
  starter.join();
  ASSERT_TRUE(daemon->WaitListening(20000));
  EXPECT_TRUE(models.ok()) << models.status();
  // The channel's own reconnect backoff follows ours, so the call lands soon after the daemon
  // listens, not after gRPC's default 1 s-and-growing reconnect delay.
  EXPECT_LT(elapsed, std::chrono::seconds(5));
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->WaitExit(20000), 0);
}

TEST(ClientRetryTest, GivesUpAfterMaxAttemptsWithUnavailable) {
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", service::testing::FreePort());  // nobody there
  options.max_attempts = 3;
  options.initial_backoff = std::chrono::milliseconds(100);
  Client client(options);
  const auto start = Clock::now();
  const absl::StatusOr<v1::ListModelsResponse> models = client.ListModels();
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(models.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_GE(elapsed, std::chrono::milliseconds(300));  // slept 100 + 200 between the attempts
}

TEST(ClientRetryTest, OtherErrorsAreNotRetried) {
  service::testing::DaemonProcess daemon(ENTROKVD_PATH,
                                         {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(daemon.WaitListening(20000)) << daemon.Stderr();
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", daemon.port());
  Client client(options);
  v1::GetModelRequest request;
  request.set_model_id("absent");
  EXPECT_EQ(client.GetModel(request).status().code(), absl::StatusCode::kNotFound);
  // The daemon counted exactly one GetModel call: NOT_FOUND was not retried.
  const std::string metrics = service::testing::HttpGet(daemon.metrics_port(), "/metrics");
  EXPECT_THAT(metrics,
              HasSubstr("entrokv_rpc_requests_total{code=\"NOT_FOUND\",method=\"GetModel\"} 1\n"));
  const absl::StatusOr<std::string> health = client.Health("");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(20000), 0);
}

}  // namespace
}  // namespace entrokv
