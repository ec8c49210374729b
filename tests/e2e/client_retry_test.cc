// entrokv::Client against a real entrokvd process: retries on UNAVAILABLE only, with backoff.
// (Deadlines are covered by the service tests: docs/reliability.md, "Deadlines".) No sleeps: the
// retry hook orders events. Fail-open decisions (TryDecide) against a daemon that is killed,
// restarted on the same --state_dir and port, and stopped (SIGSTOP: a daemon too slow to answer).
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
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

v1::DecideRequest StreamingDecision(const std::string& sequence) {
  v1::DecideRequest request;
  request.set_model_id("m");
  request.set_sequence_id(sequence);
  request.mutable_budget()->set_pages_per_group(2);
  request.mutable_policy()->set_name("streaming");  // needs no statistic
  request.add_layers()->set_layer(0);
  return request;
}

int64_t MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

// True once every thread of `pid` is stopped: kill(SIGSTOP) returns before the threads that
// are running on another core have stopped, and one of them could still answer a call.
bool WaitStopped(pid_t pid, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    bool all_stopped = true;
    for (const auto& task :
         std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const size_t state = line.rfind(')');  // "tid (name) S ...": the name may hold spaces
      if (state == std::string::npos || state + 2 >= line.size() || line[state + 2] != 'T') {
        all_stopped = false;
        break;
      }
    }
    if (all_stopped) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

TEST(ClientFailOpenTest, NoDecisionComesQuicklyAndDecisionsResumeAfterARestart) {
  const int port = service::testing::FreePort();
  const std::string state_dir =
      absl::StrCat(::testing::TempDir(), "/client_fail_open.", ::getpid());
  std::filesystem::remove_all(state_dir);
  std::filesystem::create_directories(state_dir);
  const std::vector<std::string> args = {absl::StrCat("--listen=127.0.0.1:", port),
                                         "--metrics_listen=", "--state_dir=" + state_dir};
  auto daemon = std::make_unique<service::testing::DaemonProcess>(ENTROKVD_PATH, args);
  ASSERT_TRUE(daemon->WaitListening(20000)) << daemon->Stderr();

  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", port);
  options.initial_backoff = std::chrono::milliseconds(50);
  options.decision_timeout = std::chrono::milliseconds(400);
  std::vector<absl::StatusCode> reported;
  options.on_no_decision = [&reported](const absl::Status& status) {
    reported.push_back(status.code());
  };
  Client client(options);
  ASSERT_TRUE(client.RegisterModel(service::testing::RegisterRequest("m", 2, 4, 2, 1 << 20)).ok());
  v1::OpenSequenceRequest open;
  open.set_model_id("m");
  open.set_sequence_id("s");
  open.set_initial_tokens(100);
  ASSERT_TRUE(client.OpenSequence(open).ok());
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::optional<v1::DecideResponse> first,
                               client.TryDecide(StreamingDecision("s")));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->layers(0).groups(0).kept_pages_size(), 2);

  // Gone: no decision, at once (nobody listens), counted and reported.
  daemon->Signal(SIGKILL);
  EXPECT_EQ(daemon->WaitExit(20000), -1);
  auto start = std::chrono::steady_clock::now();
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::optional<v1::DecideResponse> gone,
                               client.TryDecide(StreamingDecision("s")));
  EXPECT_FALSE(gone.has_value());
  EXPECT_LT(MsSince(start), 400);
  EXPECT_EQ(client.no_decisions().unavailable, 1);
  EXPECT_THAT(reported, ElementsAre(absl::StatusCode::kUnavailable));

  // Back on the same state: the channel reconnects by itself and decisions resume on the
  // recovered sequence (a call or two may still meet the reconnect backoff).
  daemon = std::make_unique<service::testing::DaemonProcess>(ENTROKVD_PATH, args);
  ASSERT_TRUE(daemon->WaitListening(20000)) << daemon->Stderr();
  std::optional<v1::DecideResponse> resumed;
  for (int attempt = 0; attempt < 50 && !resumed.has_value(); ++attempt) {
    ENTROKV_ASSERT_OK_AND_ASSIGN(resumed, client.TryDecide(StreamingDecision("s")));
    if (!resumed.has_value()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(resumed.has_value()) << "no decision within 5 s of the restart";
  EXPECT_EQ(resumed->layers(0).tokens(), 100);
  // Speculative tokens on the recovered sequence: appended, then rolled back.
  v1::AppendTokensRequest append;
  append.set_model_id("m");
  append.set_sequence_id("s");
  append.set_tokens(40);
  ASSERT_TRUE(client.AppendTokens(append).ok());
  v1::TruncateSequenceRequest truncate;
  truncate.set_model_id("m");
  truncate.set_sequence_id("s");
  truncate.set_tokens(30);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const v1::TruncateSequenceResponse truncated,
                               client.TruncateSequence(truncate));
  EXPECT_EQ(truncated.length_tokens(), 110);
  // A bad request is the caller's to fix: an error, not "no decision", and not counted.
  const int64_t before = client.no_decisions().total();
  EXPECT_EQ(client.TryDecide(StreamingDecision("absent")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client.no_decisions().total(), before);

  // Too slow (stopped): no decision once decision_timeout has passed, not later.
  daemon->Signal(SIGSTOP);
  ASSERT_TRUE(WaitStopped(daemon->pid(), 5000));
  start = std::chrono::steady_clock::now();
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::optional<v1::DecideResponse> slow,
                               client.TryDecide(StreamingDecision("s")));
  const int64_t slow_ms = MsSince(start);
  daemon->Signal(SIGCONT);
  EXPECT_FALSE(slow.has_value());
  EXPECT_GE(slow_ms, 350);
  EXPECT_LT(slow_ms, 2000);
  EXPECT_EQ(client.no_decisions().deadline_exceeded, 1);
  EXPECT_EQ(reported.back(), absl::StatusCode::kDeadlineExceeded);
  v1::UnregisterModelRequest unregister;  // a --state_dir daemon keeps its arenas otherwise
  unregister.set_model_id("m");
  unregister.set_force(true);
  EXPECT_TRUE(client.UnregisterModel(unregister).ok());
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->WaitExit(20000), 0);
  std::filesystem::remove_all(state_dir);
}

}  // namespace
}  // namespace entrokv
