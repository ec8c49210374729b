// entrokv::Client against a real entrokvd process: retries on UNAVAILABLE only, with backoff.
// (Deadlines are covered by the service tests: docs/reliability.md, "Deadlines".) No sleeps: the
// retry hook orders events.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/test_support.h"
#include "tests/support/http_get.h"

namespace entrokv {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(ClientRetryTest, UnavailableIsRetriedWithBackoffUntilTheDaemonListens) {
  const int port = service::testing::FreePort();
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", port);
  options.max_attempts = 8;
  options.initial_backoff = std::chrono::milliseconds(100);
  options.timeout = std::chrono::milliseconds(2000);
  // The daemon comes up only once the first attempt has failed with UNAVAILABLE (nobody
  // listening), so the call can only succeed by retrying, whatever the timing.
  std::unique_ptr<service::testing::DaemonProcess> daemon;
  std::vector<absl::StatusCode> failures;
  options.on_retry = [&](int attempt, const absl::Status& status, std::chrono::milliseconds) {
    failures.push_back(status.code());
    if (attempt != 1) return;
    daemon = std::make_unique<service::testing::DaemonProcess>(
        ENTROKVD_PATH, std::vector<std::string>{absl::StrCat("--listen=127.0.0.1:", port),
                                                "--metrics_listen=127.0.0.1:0"});
    ASSERT_TRUE(daemon->WaitListening(20000)) << daemon->Stderr();
  };
  Client client(options);
  const absl::StatusOr<v1::ListModelsResponse> models = client.ListModels();
  ASSERT_NE(daemon, nullptr) << "the first attempt did not fail: " << models.status();
  EXPECT_TRUE(models.ok()) << models.status();
  EXPECT_THAT(failures, Each(absl::StatusCode::kUnavailable));
  EXPECT_THAT(failures, Not(IsEmpty()));
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->WaitExit(20000), 0);
}

TEST(ClientRetryTest, GivesUpAfterMaxAttemptsWithUnavailable) {
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", service::testing::FreePort());  // nobody there
  options.max_attempts = 3;
  options.initial_backoff = std::chrono::milliseconds(100);
  std::vector<int> attempts;
  std::vector<std::chrono::milliseconds> backoffs;
  options.on_retry = [&](int attempt, const absl::Status& status,
                         std::chrono::milliseconds backoff) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    attempts.push_back(attempt);
    backoffs.push_back(backoff);
  };
  Client client(options);
  const absl::StatusOr<v1::ListModelsResponse> models = client.ListModels();
  EXPECT_EQ(models.status().code(), absl::StatusCode::kUnavailable);
  // Three attempts: two retries, after backoffs of 100 and then 200 ms (doubling).
  EXPECT_THAT(attempts, ElementsAre(1, 2));
  EXPECT_THAT(backoffs,
              ElementsAre(std::chrono::milliseconds(100), std::chrono::milliseconds(200)));
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
  ENTROKV_ASSERT_OK_AND_ASSIGN(const std::string metrics,
                               ::entrokv::testing::HttpGet(daemon.metrics_port(), "/metrics"));
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
