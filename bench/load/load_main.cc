// entrokv_loadgen: drives a running entrokvd over loopback with worker streams, bad requests
// mixed in, and checks the answers (bench/load/load_generator.h). Prints a table (and JSON with
// --json_out); exits 0 when there were no wrong answers, crashes, unavailable calls or leaked
// frames, 1 otherwise, 2 for bad flags or a daemon it cannot reach.
//
//   entrokvd --listen=127.0.0.1:50051 --metrics_listen=127.0.0.1:9464 &
//   entrokv_loadgen --target=127.0.0.1:50051 --metrics_port=9464 --workers=8 --duration_s=60
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "bench/load/load_generator.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "entrokvd's gRPC address (loopback only)");
ABSL_FLAG(int, daemon_pid, 0, "entrokvd's pid, for RSS and crash checks; 0: the port's owner");
ABSL_FLAG(int, metrics_port, 0, "entrokvd's /metrics port on 127.0.0.1; 0: no scrapes");
ABSL_FLAG(int, workers, 8, "concurrent worker threads, one connection each");
ABSL_FLAG(double, duration_s, 10, "seconds to run");
ABSL_FLAG(int64_t, max_requests, 0, "stop after this many requests; 0: no bound");
ABSL_FLAG(uint64_t, seed, 0, "seed of the choice sequence; 0: from the clock (printed)");
ABSL_FLAG(int, bad_percent, 30, "share of worker steps that send a bad request, percent");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20, "the daemon's --max_message_bytes");
ABSL_FLAG(int, call_timeout_ms, 30000, "deadline of each ordinary call");
ABSL_FLAG(std::string, token_file, "", "file holding the bearer token, when the daemon wants one");
ABSL_FLAG(std::string, json_out, "", "write the report as JSON to this file");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Loopback load with bad requests against a running entrokvd; checks answers, reports "
      "requests, wrong answers, crashes, leaked frames, p50/p99 per RPC and the daemon's RSS.");
  absl::ParseCommandLine(argc, argv);
  entrokv::bench::LoadOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.daemon_pid = absl::GetFlag(FLAGS_daemon_pid);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.workers = absl::GetFlag(FLAGS_workers);
  options.duration_s = absl::GetFlag(FLAGS_duration_s);
  options.max_requests = absl::GetFlag(FLAGS_max_requests);
  options.seed = absl::GetFlag(FLAGS_seed);
  if (options.seed == 0) {
    options.seed =
        static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) %
            1000000000 +
        1;
  }
  options.bad_percent = absl::GetFlag(FLAGS_bad_percent);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.call_timeout_ms = absl::GetFlag(FLAGS_call_timeout_ms);
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    std::ifstream in(path);
    std::getline(in, options.bearer_token);
    if (options.bearer_token.empty()) {
      std::fprintf(stderr, "--token_file: no token in '%s'\n", path.c_str());
      return 2;
    }
  }
  options.on_problem = [](const std::string& problem) {
    std::fprintf(stderr, "PROBLEM %s\n", problem.c_str());
  };
  std::fprintf(stderr, "entrokv_loadgen: seed %llu (rerun with --seed=%llu)\n",
               static_cast<unsigned long long>(options.seed),
               static_cast<unsigned long long>(options.seed));
  absl::StatusOr<entrokv::bench::LoadReport> report = entrokv::bench::RunLoad(options);
  if (!report.ok()) {
    std::fprintf(stderr, "entrokv_loadgen: %s\n", std::string(report.status().message()).c_str());
    return 2;
  }
  std::fputs(entrokv::bench::FormatTable(*report).c_str(), stdout);
  if (const std::string path = absl::GetFlag(FLAGS_json_out); !path.empty()) {
    std::ofstream(path) << entrokv::bench::FormatJson(*report) << "\n";
  }
  const bool clean = report->wrong_answers == 0 && report->crashes == 0 &&
                     report->unavailable == 0 && report->leaked_frames == 0;
  return clean ? 0 : 1;
}
