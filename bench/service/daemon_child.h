// A real entrokvd started as a child process, for the service benchmarks: what a worker talks
// to, with nothing of service/ linked into the benchmark.
#ifndef ENTROKV_BENCH_SERVICE_DAEMON_CHILD_H_
#define ENTROKV_BENCH_SERVICE_DAEMON_CHILD_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace entrokv::bench {

// Owns the process: Stop() (or the destructor) sends SIGTERM and waits for it. Not thread-safe.
class DaemonChild {
 public:
  // Starts `binary` with `args` (its stderr is the caller's) and waits up to `timeout_ms` for
  // its start-up line. UNAVAILABLE when it cannot be started or exits or stays silent first.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DaemonChild>> Start(
      const std::string& binary, const std::vector<std::string>& args, int timeout_ms);
  ~DaemonChild();
  DaemonChild(const DaemonChild&) = delete;
  DaemonChild& operator=(const DaemonChild&) = delete;

  // HOST:PORT of its gRPC listener, from the start-up line.
  [[nodiscard]] const std::string& address() const { return address_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  // The CPU time (user + system, every thread) it has used so far, in seconds, from
  // /proc/PID/stat (clock-tick resolution); -1 when it cannot be read.
  [[nodiscard]] double CpuSeconds() const;

  // SIGTERM, then waits up to `timeout_ms` (SIGKILL after). Returns the exit status, -1 when it
  // was killed or did not exit normally. Idempotent.
  int Stop(int timeout_ms);

 private:
  DaemonChild(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}

  pid_t pid_;
  int stdout_fd_;
  std::string address_;
  bool stopped_ = false;
  int exit_status_ = -1;
};

}  // namespace entrokv::bench

#endif  // ENTROKV_BENCH_SERVICE_DAEMON_CHILD_H_
