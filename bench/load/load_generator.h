// A loopback load generator for a running entrokvd (docs/reliability.md, "Load"): N worker
// threads, each with its own connection, drive random lifecycles (register and unregister a
// model, open, fork, append, decide by bytes and by shared memory, unary and streamed, close,
// list, stats, /metrics) with a share of bad requests mixed in, and check the answers:
//  - decisions on a worker's private model are recomputed in-process with the core's reference
//    scorer (DecideLayer, not the daemon's fused one), for the policy and quotas the generator
//    states itself (not the daemon's request resolution), from the block tables the daemon
//    reports (kept and evicted pages must match exactly);
//  - every bad request must get its documented code (naming the offending field first where
//    the contract names one), and on the private model change nothing;
//  - pool invariants (used + free == capacity, used == distinct frames of the block tables,
//    lengths as appended), a closed sequence is NOT_FOUND, and at the end every pool is empty.
// Each worker's choices come from its own generator seeded by (seed, worker), and depend only on
// state the worker tracks from right answers, so a seed replays the same choice sequence.
#ifndef ENTROKV_BENCH_LOAD_LOAD_GENERATOR_H_
#define ENTROKV_BENCH_LOAD_LOAD_GENERATOR_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace entrokv::bench {

struct LoadOptions {
  std::string target = "127.0.0.1:50051";  // entrokvd's gRPC address; loopback only
  pid_t daemon_pid = 0;                    // 0: the process listening on target's port
  int metrics_port = 0;                    // entrokvd's /metrics port; 0: no scrapes
  int workers = 8;                         // concurrent worker threads (one connection each)
  double duration_s = 10;                  // stop starting requests after this long
  int64_t max_requests = 0;                // and after this many; 0: no bound
  uint64_t seed = 1;
  int bad_percent = 30;                  // share of worker steps that send a bad request
  int64_t max_message_bytes = 64 << 20;  // the daemon's --max_message_bytes
  int call_timeout_ms = 30000;           // deadline of each ordinary call
  std::string bearer_token;              // sent when the daemon has --token_file
  // Called with each wrong answer, crash and leak as it is found (from worker threads, one at a
  // time). Empty: only counted.
  std::function<void(const std::string&)> on_problem;
  // Called about once a second from the thread that called RunLoad, with the requests sent so
  // far. Empty: none.
  std::function<void(int64_t requests)> on_tick;
};

// Latency of one RPC kind over the run (every call of that kind, good or bad).
struct KindLatency {
  std::string kind;
  int64_t calls = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
};

struct LoadReport {
  uint64_t seed = 0;
  int workers = 0;
  double seconds = 0;
  pid_t daemon_pid = 0;
  int64_t requests = 0;       // RPCs sent (metrics scrapes included)
  int64_t bad_requests = 0;   // of which meant to be refused (or to expire)
  int64_t checked = 0;        // answers compared with a known right answer or invariant
  int64_t wrong_answers = 0;  // answers that differed
  int64_t crashes = 0;        // 1 when the daemon died or stopped answering
  int64_t unavailable = 0;    // calls answered UNAVAILABLE
  int64_t leaked_frames = 0;  // used frames left once every sequence was closed
  int64_t rss_start_kb = -1;
  int64_t rss_end_kb = -1;
  int64_t rss_max_kb = -1;  // the highest sample (once a second)
  std::vector<KindLatency> latency;
  std::map<std::string, int64_t> bad_cases;  // bad requests sent per case
  std::vector<std::string> problems;         // the first 50 problems, as on_problem saw them
};

// Runs the load and the final checks. An error only when the run cannot start (target not on
// loopback, daemon not answering, the generator's own models refused).
[[nodiscard]] absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options);

// The report as a plain-text table, and as JSON.
[[nodiscard]] std::string FormatTable(const LoadReport& report);
[[nodiscard]] std::string FormatJson(const LoadReport& report);

}  // namespace entrokv::bench

#endif  // ENTROKV_BENCH_LOAD_LOAD_GENERATOR_H_
