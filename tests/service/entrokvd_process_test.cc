// The real entrokvd binary as a subprocess: start-up and shutdown health, drain, bad
// configuration, and the /metrics endpoint checked by promtool and a real Prometheus.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/option_table.h"
#include "tests/service/test_support.h"
#include "tests/support/http_get.h"

namespace entrokv::service {
namespace {

using ::entrokv::service::testing::BytesStatistic;
using ::entrokv::service::testing::DaemonProcess;
using ::entrokv::service::testing::FreePort;
using ::entrokv::service::testing::HealthCheck;
using ::entrokv::service::testing::MakeChannel;
using ::entrokv::service::testing::RandomStatistic;
using ::entrokv::service::testing::RegisterRequest;
using ::entrokv::testing::HttpGet;
using ::testing::HasSubstr;
using ::testing::Not;

const std::vector<std::string> kLoopback = {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0"};

std::vector<std::string> With(std::vector<std::string> extra) {
  std::vector<std::string> args = kLoopback;
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::string TempDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  return dir;
}

// Registers model "m", opens "s" with `tokens` tokens, returns a Decide over every layer.
v1::DecideRequest Workload(v1::CacheManager::Stub& stub, int layers, int64_t tokens) {
  grpc::ClientContext register_context;
  v1::RegisterModelResponse registered;
  EXPECT_TRUE(stub.RegisterModel(&register_context,
                                 RegisterRequest("m", layers, 12, 2, uint64_t{256} << 20),
                                 &registered)
                  .ok());
  grpc::ClientContext open_context;
  v1::OpenSequenceRequest open;
  open.set_model_id("m");
  open.set_sequence_id("s");
  open.set_initial_tokens(tokens);
  v1::OpenSequenceResponse opened;
  EXPECT_TRUE(stub.OpenSequence(&open_context, open, &opened).ok());
  v1::DecideRequest decide;
  decide.set_model_id("m");
  decide.set_sequence_id("s");
  decide.mutable_budget()->set_fraction(0.2);
  for (int layer = 0; layer < layers; ++layer) {
    v1::LayerStatistic* in = decide.add_layers();
    in->set_layer(layer);
    *in->mutable_statistic() =
        BytesStatistic(RandomStatistic(12, tokens, layer), 12, tokens, v1::DTYPE_BFLOAT16);
  }
  return decide;
}

TEST(EntrokvdProcessTest, BadConfigurationExitsNonZeroNamingTheOption) {
  const int port = FreePort();
  struct Case {
    std::vector<std::string> args;
    std::string option;
  };
  const std::string bad_config = ::testing::TempDir() + "/entrokvd_bad.conf";
  std::ofstream(bad_config) << "--tau=0.5\n--frobnicate=1\n";
  const std::vector<Case> cases = {
      {{"--tau=-1"}, "--tau"},
      {{"--neighbourhood_kernel=8"}, "--neighbourhood_kernel"},
      {{"--neighbourhood_pooling=median"}, "--neighbourhood_pooling"},
      // Abseil rejects values it cannot parse itself, naming the flag 'backend'.
      {{"--backend=tpu"}, "backend"},
      {{"--frame_layout=diagonal"}, "frame_layout"},
      {{"--log_level=loud"}, "--log_level"},
      {{"--policy=nope"}, "--policy"},
      {{"--max_inflight_decisions=0"}, "--max_inflight_decisions"},
      {{"--state_dir=/nonexistent/entrokv"}, "--state_dir"},
      {{"--tls_cert=/nonexistent.pem", "--tls_key=/nonexistent.key"}, "--tls_cert"},
      {{"--config=" + bad_config}, "frobnicate"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.push_back("--listen=127.0.0.1:" + std::to_string(port));
    args.push_back("--metrics_listen=127.0.0.1:0");
    DaemonProcess daemon(ENTROKVD_PATH, args);
    const int code = daemon.WaitExit(10000);
    EXPECT_NE(code, 0) << c.option;
    EXPECT_NE(code, -1) << c.option << " did not exit";
    EXPECT_THAT(daemon.Stderr(), HasSubstr(c.option));
  }
  // Nothing was bound: the port is still free to take.
  EXPECT_THAT(HttpGet(port, "/"),
              ::entrokv::testing::StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connect")));
}

TEST(EntrokvdProcessTest, ConfigFileAndStateDirAreAccepted) {
  const std::string dir = TempDir("entrokvd_state");
  const std::string config = ::testing::TempDir() + "/entrokvd_good.conf";
  // An Abseil flagfile. Its --tau is invalid: the daemon starts only if the command line's
  // --tau, given before --config, wins.
  std::ofstream(config) << "# test\n--policy=mean\n--tau=-1\n--state_dir=" << dir << "\n";
  DaemonProcess daemon(ENTROKVD_PATH, With({"--tau=0.5", "--config=" + config}));
  ASSERT_TRUE(daemon.WaitListening(10000)) << daemon.Stderr();
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(10000), 0);
  EXPECT_THAT(daemon.Stderr(), HasSubstr("journaling to " + dir + "/journal"));
}

// Abseil's --help lists only flags defined in main()'s file unless told otherwise; it printed
// "No flags matched" before. Every option of the table must be listed (Abseil wraps the help
// text, so only the flag's "-name (" is matched).
TEST(EntrokvdProcessTest, HelpListsEveryFlag) {
  FILE* pipe = ::popen(ENTROKVD_PATH " --help 2>&1", "r");
  ASSERT_NE(pipe, nullptr);
  std::string help;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) help.append(buffer, n);
  ::pclose(pipe);
  EXPECT_THAT(help, Not(HasSubstr("No flags matched")));
  EXPECT_THAT(help, HasSubstr("-config ("));
#define ENTROKV_EXPECT_IN_HELP(type, name, default_value, help_text) \
  EXPECT_THAT(help, HasSubstr("-" #name " (")) << #name;
  ENTROKV_SERVER_OPTIONS(ENTROKV_EXPECT_IN_HELP)
#undef ENTROKV_EXPECT_IN_HELP
}

// Layer `layer` of the Workload's sequence as one DecideStream message.
v1::DecideLayerRequest StreamLayer(int layer, int64_t tokens) {
  v1::DecideLayerRequest request;
  request.set_model_id("m");
  request.set_sequence_id("s");
  request.mutable_budget()->set_fraction(0.5);
  request.mutable_layer()->set_layer(layer);
  *request.mutable_layer()->mutable_statistic() =
      BytesStatistic(RandomStatistic(12, tokens, layer), 12, tokens, v1::DTYPE_BFLOAT16);
  return request;
}

// The calls in flight are DecideStreams the test holds open, so the drain has work to wait for
// for exactly as long as the test wants, whatever the machine's speed: each has had one layer
// decided before SIGTERM, and ends only when the test writes to it or half-closes it.
TEST(EntrokvdProcessTest, HealthDuringStartAndGracefulSigterm) {
  DaemonProcess daemon(ENTROKVD_PATH, With({"--drain_timeout_ms=60000"}));
  ASSERT_TRUE(daemon.WaitListening(10000)) << daemon.Stderr();
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(daemon.port()));
  EXPECT_EQ(HealthCheck(*channel, ""), 1);
  EXPECT_EQ(HealthCheck(*channel, "entrokv.v1.CacheManager"), 1);
  EXPECT_EQ(HealthCheck(*channel, "entrokv.v1.CacheManager.liveness"), 1);

  auto stub = v1::CacheManager::NewStub(channel);
  constexpr int kTokens = 256;
  (void)Workload(*stub, 4, kTokens);  // registers "m" and opens "s"
  grpc::ClientContext finishing_context;
  grpc::ClientContext refused_context;
  auto finishing = stub->DecideStream(&finishing_context);  // half-closed during the drain
  auto refused = stub->DecideStream(&refused_context);      // sends a layer during the drain
  v1::LayerDecision decision;
  ASSERT_TRUE(finishing->Write(StreamLayer(0, kTokens)));
  ASSERT_TRUE(finishing->Read(&decision));
  ASSERT_TRUE(refused->Write(StreamLayer(1, kTokens)));
  ASSERT_TRUE(refused->Read(&decision));

  daemon.Signal(SIGTERM);
  // Readiness flips at once (the daemon takes the signal on its own thread: wait for that);
  // liveness stays.
  int readiness = 1;
  for (const absl::Time end = absl::Now() + absl::Seconds(20);
       readiness == 1 && absl::Now() < end;) {
    readiness = HealthCheck(*channel, "");
  }
  EXPECT_EQ(readiness, 2);
  EXPECT_EQ(HealthCheck(*channel, "entrokv.v1.CacheManager.liveness"), 1);
  // New calls are refused with UNAVAILABLE (retry elsewhere).
  grpc::ClientContext late_context;
  v1::GetPoolStatsRequest late;
  late.set_model_id("m");
  v1::PoolStats stats;
  EXPECT_EQ(stub->GetPoolStats(&late_context, late, &stats).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // So is further work on a stream that was open before the signal: it ends UNAVAILABLE.
  ASSERT_TRUE(refused->Write(StreamLayer(2, kTokens)));
  EXPECT_FALSE(refused->Read(&decision));
  const grpc::Status refused_status = refused->Finish();
  EXPECT_EQ(refused_status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << refused_status.error_message();
  EXPECT_THAT(refused_status.error_message(), HasSubstr("draining"));
  // The other stream is still in flight, so the daemon is still waiting for it...
  EXPECT_EQ(daemon.WaitExit(500), -1) << "entrokvd exited with a call in flight";
  // ...and the stream ends OK when the client half-closes it.
  finishing->WritesDone();
  const grpc::Status finished = finishing->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_message();
  // The drain ends with the last call, not at --drain_timeout_ms: exit 0 well within it.
  EXPECT_EQ(daemon.WaitExit(20000), 0) << daemon.Stderr();
}

// Seconds from SIGTERM to the exit of a daemon (no metrics endpoint) that answered one call,
// with that call's channel still open and idle or already closed. Exit code 0 expected.
double SecondsToExit(bool idle_connection) {
  DaemonProcess daemon(ENTROKVD_PATH, {"--listen=127.0.0.1:0", "--metrics_listen="});
  EXPECT_TRUE(daemon.WaitListening(10000)) << daemon.Stderr();
  std::shared_ptr<grpc::Channel> channel =
      MakeChannel("127.0.0.1:" + std::to_string(daemon.port()));
  {
    auto stub = v1::CacheManager::NewStub(channel);
    grpc::ClientContext context;
    v1::ListModelsResponse response;
    EXPECT_TRUE(stub->ListModels(&context, {}, &response).ok());
  }
  if (!idle_connection) channel.reset();
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(30000), 0) << daemon.Stderr();
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// The drain waits for admitted calls, not for clients to close their connections: one idle
// channel held the exit about 4 s longer than none (gRPC waited for it to go away).
TEST(EntrokvdProcessTest, SigtermDoesNotWaitForIdleConnections) {
  const double without = SecondsToExit(false);
  const double with_idle = SecondsToExit(true);
  EXPECT_LT(with_idle, without + 2.0) << "without a connection " << without << " s";
}

// Runs a shell command, returns its exit code; output in *output.
int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  output->clear();
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(EntrokvdProcessTest, MetricsPassPromtoolAndReachPrometheus) {
  DaemonProcess daemon(ENTROKVD_PATH, kLoopback);
  ASSERT_TRUE(daemon.WaitListening(10000)) << daemon.Stderr();
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(daemon.port()));
  auto stub = v1::CacheManager::NewStub(channel);
  const v1::DecideRequest decide = Workload(*stub, 4, 2048);
  grpc::ClientContext context;
  v1::DecideResponse response;
  ASSERT_TRUE(stub->Decide(&context, decide, &response).ok());

  ENTROKV_ASSERT_OK_AND_ASSIGN(const std::string metrics,
                               HttpGet(daemon.metrics_port(), "/metrics"));
  ASSERT_THAT(metrics, HasSubstr("entrokv_pool_frames{"));
  ASSERT_THAT(metrics, HasSubstr("entrokv_decisions_total{"));
  const std::string dump = ::testing::TempDir() + "/entrokvd_metrics.txt";
  std::ofstream(dump) << metrics;
  std::string findings;
  if (::access("/usr/bin/promtool", X_OK) == 0 ||
      std::system("command -v promtool >/dev/null") == 0) {
    EXPECT_EQ(RunCommand("promtool check metrics < " + dump, &findings), 0) << findings;
    EXPECT_EQ(findings, "") << findings;
  }

  const char* prometheus = "/usr/bin/prometheus";
  if (::access(prometheus, X_OK) != 0) GTEST_SKIP() << "no prometheus binary";
  const std::string dir = TempDir("entrokvd_prom");
  const std::string config = dir + "/prometheus.yml";
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n"
                        << "scrape_configs:\n  - job_name: entrokvd\n"
                        << "    static_configs:\n      - targets: ['127.0.0.1:"
                        << daemon.metrics_port() << "']\n";
  const int web_port = FreePort();
  DaemonProcess server(
      prometheus,
      {"--config.file=" + config, "--storage.tsdb.path=" + dir + "/data",
       "--web.listen-address=127.0.0.1:" + std::to_string(web_port), "--log.level=warn"});
  auto query = [&](const std::string& expr) {
    return HttpGet(web_port, "/api/v1/query?query=" + expr).value_or("");
  };
  bool frames = false;
  bool buckets = false;
  for (int i = 0; i < 300 && !(frames && buckets); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    frames = frames || query("entrokv_pool_frames").find("\"pool\":\"m\"") != std::string::npos;
    buckets = buckets ||
              query("entrokv_union_overhead_ratio_bucket").find("\"le\":") != std::string::npos;
  }
  EXPECT_TRUE(frames) << query("entrokv_pool_frames") << server.Stderr();
  EXPECT_TRUE(buckets) << query("entrokv_union_overhead_ratio_bucket");
  server.Signal(SIGTERM);
  (void)server.WaitExit(10000);
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(10000), 0);
}

}  // namespace
}  // namespace entrokv::service
