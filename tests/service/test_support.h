// Helpers shared by the service integration tests: an in-process daemon on 127.0.0.1:0, a
// real entrokvd subprocess, raw health/reflection calls, and statistic builders. The start-up
// line and the HTTP GET are tests/support's (daemon_line.h, http_get.h).
#ifndef ENTROKV_TESTS_SERVICE_TEST_SUPPORT_H_
#define ENTROKV_TESTS_SERVICE_TEST_SUPPORT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "entrokv/v1/cache_manager.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "service/server.h"

namespace entrokv::service::testing {

// Options for an in-process daemon on free loopback ports.
ServerOptions LoopbackOptions();

// Channel to `address`, insecure, with large enough message limits for the tests.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           int max_message_bytes = 256 << 20);

// A RegisterModel request for a small model: layers x query_heads/kv_groups, page 16.
v1::RegisterModelRequest RegisterRequest(const std::string& model_id, int layers, int query_heads,
                                         int kv_groups, uint64_t capacity_bytes);

// A random non-negative statistic [heads, tokens] as float32 values, seeded.
std::vector<float> RandomStatistic(int heads, int64_t tokens, uint32_t seed);
// The same values encoded in `dtype` (float32 raw, or rounded to bf16/f16).
std::string Encode(const std::vector<float>& values, v1::DType dtype);
// A Statistic message carrying `values` inline.
v1::Statistic BytesStatistic(const std::vector<float>& values, int heads, int64_t tokens,
                             v1::DType dtype);
// A Statistic message naming `length_bytes` bytes at offset 0 of shared-memory segment
// `segment`.
v1::Statistic SharedMemoryStatistic(const std::string& segment, uint64_t length_bytes, int heads,
                                    int64_t tokens, v1::DType dtype);
// Creates (or empties) shared-memory segment `name` and writes `bytes` at its start; false when
// it cannot. The caller unlinks it.
[[nodiscard]] bool WriteSegment(const std::string& name, const std::string& bytes);

// grpc.health.v1.Health/Check through a generic call: 1 SERVING, 2 NOT_SERVING, 0 UNKNOWN,
// -1 when the call itself failed (code in *status when given).
int HealthCheck(grpc::Channel& channel, const std::string& service, grpc::Status* status = nullptr,
                int timeout_ms = 1000);

// One ServerReflectionInfo exchange (list_services) as a unary generic call, with the bearer
// token when one is given.
grpc::Status CallReflection(grpc::Channel& channel, const std::string& token = "");

// A real entrokvd process. Owns it: the destructor kills it (SIGKILL) if still running.
class DaemonProcess {
 public:
  // Starts `binary` with `args`; stdout is read until the start-up line
  // (tests/support/daemon_line.h) or EOF.
  DaemonProcess(const std::string& binary, const std::vector<std::string>& args);
  ~DaemonProcess();

  // True once the listening line was read; then port()/metrics_port() are set.
  [[nodiscard]] bool WaitListening(int timeout_ms);
  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] int metrics_port() const { return metrics_port_; }  // 0: metrics off
  [[nodiscard]] pid_t pid() const { return pid_; }
  void Signal(int signal_number);
  // The exit code, or -1 on timeout / death by signal.
  [[nodiscard]] int WaitExit(int timeout_ms);
  // Everything the process wrote to stderr so far (after exit: all of it).
  [[nodiscard]] std::string Stderr();

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  bool exited_ = false;
  std::string stdout_text_;
  std::string stderr_text_;
};

// A free loopback TCP port (bound, read back, closed).
int FreePort();

}  // namespace entrokv::service::testing

#endif  // ENTROKV_TESTS_SERVICE_TEST_SUPPORT_H_
