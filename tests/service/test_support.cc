#include "tests/service/test_support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include "absl/synchronization/notification.h"
#include "core/util/dtype.h"
#include "grpcpp/generic/generic_stub.h"
#include "tests/support/daemon_line.h"

namespace entrokv::service::testing {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

grpc::Status GenericUnary(grpc::Channel& channel, const std::string& method,
                          const std::string& request, std::string* response, int timeout_ms,
                          const std::string& token = "") {
  grpc::GenericStub stub(std::shared_ptr<grpc::ChannelInterface>(&channel, [](auto*) {}));
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1);
  grpc::ByteBuffer out;
  grpc::Status result;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &in, &out, [&](grpc::Status status) {
    result = std::move(status);
    done.Notify();
  });
  done.WaitForNotification();
  if (result.ok() && response != nullptr) {
    std::vector<grpc::Slice> slices;
    (void)out.Dump(&slices);
    response->clear();
    for (const grpc::Slice& s : slices) {
      response->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return result;
}

}  // namespace

ServerOptions LoopbackOptions() {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  // No metrics endpoint: civetweb needs ~1.5 s to stop. Tests of /metrics turn it on.
  options.metrics_listen = "";
  options.pool_capacity_bytes = int64_t{1} << 30;
  options.worker_threads = 2;
  return options;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

v1::RegisterModelRequest RegisterRequest(const std::string& model_id, int layers, int query_heads,
                                         int kv_groups, uint64_t capacity_bytes) {
  v1::RegisterModelRequest request;
  request.set_model_id(model_id);
  v1::ModelGeometry* g = request.mutable_geometry();
  g->set_layers(layers);
  g->set_query_heads(query_heads);
  g->set_kv_groups(kv_groups);
  g->set_head_dim(8);
  g->set_page_size(16);
  g->set_element_bytes(2);
  request.set_capacity_bytes(capacity_bytes);
  return request;
}

std::vector<float> RandomStatistic(int heads, int64_t tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::exponential_distribution<float> draw(1.0f);
  std::vector<float> values(static_cast<size_t>(heads) * tokens);
  for (float& v : values) v = draw(rng) * draw(rng);
  return values;
}

std::string Encode(const std::vector<float>& values, v1::DType dtype) {
  if (dtype == v1::DTYPE_FLOAT32) {
    return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  }
  std::string out(values.size() * 2, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits =
        dtype == v1::DTYPE_BFLOAT16 ? FloatToBFloat16(values[i]) : FloatToFloat16(values[i]);
    std::memcpy(&out[i * 2], &bits, 2);
  }
  return out;
}

v1::Statistic BytesStatistic(const std::vector<float>& values, int heads, int64_t tokens,
                             v1::DType dtype) {
  v1::Statistic stat;
  stat.set_dtype(dtype);
  stat.set_query_heads(heads);
  stat.set_tokens(tokens);
  stat.set_data(Encode(values, dtype));
  return stat;
}

v1::Statistic SharedMemoryStatistic(const std::string& segment, uint64_t length_bytes, int heads,
                                    int64_t tokens, v1::DType dtype) {
  v1::Statistic stat;
  stat.set_dtype(dtype);
  stat.set_query_heads(heads);
  stat.set_tokens(tokens);
  stat.mutable_shared_memory()->set_segment(segment);
  stat.mutable_shared_memory()->set_length_bytes(length_bytes);
  return stat;
}

bool WriteSegment(const std::string& name, const std::string& bytes) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0) return false;
  const bool written =
      ::pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size());
  ::close(fd);
  return written;
}

int HealthCheck(grpc::Channel& channel, const std::string& service, grpc::Status* status,
                int timeout_ms) {
  // HealthCheckRequest{service = 1}: tag 0x0a, length, bytes.
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  std::string response;
  const grpc::Status result =
      GenericUnary(channel, "/grpc.health.v1.Health/Check", request, &response, timeout_ms);
  if (status != nullptr) *status = result;
  if (!result.ok()) return -1;
  // HealthCheckResponse{status = 1}: tag 0x08, varint; absent means UNKNOWN (0).
  if (response.size() >= 2 && response[0] == 0x08) return response[1];
  return 0;
}

grpc::Status CallReflection(grpc::Channel& channel, const std::string& token) {
  // ServerReflectionRequest{list_services = 7 (string)} = "".
  const std::string request("\x3a\x00", 2);
  std::string response;
  return GenericUnary(channel, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                      request, &response, 2000, token);
}

DaemonProcess::DaemonProcess(const std::string& binary, const std::vector<std::string>& args) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) return;
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  stdout_fd_ = out_pipe[0];
  stderr_fd_ = err_pipe[0];
  ::fcntl(stderr_fd_, F_SETFL, O_NONBLOCK);
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0 && !exited_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
  if (stderr_fd_ >= 0) ::close(stderr_fd_);
}

bool DaemonProcess::WaitListening(int timeout_ms) {
  const int64_t deadline = NowMs() + timeout_ms;
  while (NowMs() < deadline) {
    if (const std::optional<::entrokv::testing::ListeningAddresses> addresses =
            ::entrokv::testing::ParseListeningLine(stdout_text_)) {
      port_ = addresses->grpc_port;
      metrics_port_ = addresses->metrics_port;
      return true;
    }
    pollfd fd{stdout_fd_, POLLIN, 0};
    if (::poll(&fd, 1, 50) > 0) {
      char buffer[512];
      const ssize_t n = ::read(stdout_fd_, buffer, sizeof(buffer));
      if (n <= 0) return false;
      stdout_text_.append(buffer, static_cast<size_t>(n));
    }
  }
  return false;
}

void DaemonProcess::Signal(int signal_number) {
  if (pid_ > 0 && !exited_) ::kill(pid_, signal_number);
}

int DaemonProcess::WaitExit(int timeout_ms) {
  const int64_t deadline = NowMs() + timeout_ms;
  while (NowMs() < deadline) {
    int status = 0;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exited_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    ::usleep(10000);
  }
  return -1;
}

std::string DaemonProcess::Stderr() {
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(stderr_fd_, buffer, sizeof(buffer))) > 0) {
    stderr_text_.append(buffer, static_cast<size_t>(n));
  }
  return stderr_text_;
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

}  // namespace entrokv::service::testing
