// The load generator against a real entrokvd subprocess (docs/reliability.md, "Load"): a few
// seconds of load with bad requests mixed in give zero wrong answers, crashes and leaked frames;
// and a daemon killed under load is reported as a crash, not as a clean run, and the next daemon
// removes the host arenas the killed one left in /dev/shm.
#include "bench/load/load_generator.h"

#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/service/test_support.h"

namespace entrokv::bench {
namespace {

using ::entrokv::service::testing::DaemonProcess;

std::unique_ptr<DaemonProcess> StartDaemon() {
  auto daemon = std::make_unique<DaemonProcess>(
      ENTROKVD_PATH, std::vector<std::string>{"--listen=127.0.0.1:0",
                                              "--metrics_listen=127.0.0.1:0", "--worker_threads=2",
                                              "--max_message_bytes=1048576", "--log_level=error"});
  if (!daemon->WaitListening(20000)) return nullptr;
  return daemon;
}

LoadOptions OptionsFor(const DaemonProcess& daemon) {
  LoadOptions options;
  options.target = "127.0.0.1:" + std::to_string(daemon.port());
  options.daemon_pid = daemon.pid();
  options.metrics_port = daemon.metrics_port();
  options.workers = 4;
  options.seed = 20261130;
  options.max_message_bytes = 1048576;
  return options;
}

// The shared-memory objects named after the daemon process `pid` (its arenas and lock object:
// "/entrokv.e<pid>-<start>...", service/arena_names.h).
std::vector<std::string> ObjectsOfDaemon(pid_t pid) {
  const std::string prefix = "entrokv.e" + std::to_string(pid) + "-";
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

void StopGracefully(DaemonProcess& daemon) {
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(30000), 0) << daemon.Stderr();
}

TEST(LoadGeneratorTest, AShortLoadWithBadRequestsGetsOnlyRightAnswers) {
  std::unique_ptr<DaemonProcess> daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  LoadOptions options = OptionsFor(*daemon);
  options.duration_s = 5;
  options.max_requests = 4000;
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::string table = FormatTable(*report);
  EXPECT_EQ(report->wrong_answers, 0) << table;
  EXPECT_EQ(report->crashes, 0) << table << daemon->Stderr();
  EXPECT_EQ(report->unavailable, 0) << table;
  EXPECT_EQ(report->leaked_frames, 0) << table;
  EXPECT_GT(report->requests, 200) << table;
  EXPECT_GE(report->bad_requests * 10, report->requests) << table;  // >= 10% bad
  EXPECT_GT(report->checked, report->requests / 2) << table;
  EXPECT_GE(report->bad_cases.size(), 12u) << table;
  EXPECT_GT(report->rss_end_kb, 0) << table;
  StopGracefully(*daemon);
  EXPECT_TRUE(ObjectsOfDaemon(daemon->pid()).empty());
}

TEST(LoadGeneratorTest, ADaemonKilledUnderLoadIsACrash) {
  std::unique_ptr<DaemonProcess> daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  LoadOptions options = OptionsFor(*daemon);
  options.duration_s = 60;
  bool killed = false;
  bool had_arenas = false;
  options.on_tick = [&](int64_t requests) {
    if (!killed && requests > 100) {
      // Looked at while it lives: its lock keeps other tests' daemons off its arenas.
      had_arenas = !ObjectsOfDaemon(daemon->pid()).empty();
      daemon->Signal(SIGKILL);
      killed = true;
    }
  };
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_TRUE(killed) << FormatTable(*report);
  EXPECT_EQ(report->crashes, 1) << FormatTable(*report);
  EXPECT_LT(report->seconds, 30) << "the run did not stop when the daemon died";

  // A killed daemon cannot remove its arenas; the next one to start does (its lock is free;
  // under a parallel ctest another test's daemon may get there first).
  ASSERT_TRUE(had_arenas) << "the daemon had made no arena before it was killed";
  const pid_t dead = daemon->pid();
  ASSERT_EQ(daemon->WaitExit(10000), -1);  // died by the signal
  std::unique_ptr<DaemonProcess> next = StartDaemon();
  ASSERT_NE(next, nullptr);
  EXPECT_TRUE(ObjectsOfDaemon(dead).empty());
  StopGracefully(*next);
}

}  // namespace
}  // namespace entrokv::bench
