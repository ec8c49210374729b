// What the end-to-end tests of a --state_dir daemon share: fresh folders, a real entrokvd
// process (ENTROKVD_PATH) with a stub, and the calls they make on it.
#ifndef ENTROKV_TESTS_E2E_DAEMON_RUNNER_H_
#define ENTROKV_TESTS_E2E_DAEMON_RUNNER_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/service/test_support.h"

namespace entrokv::service::testing {

inline std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", name, ".", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// entrokvd's arguments on loopback, with `state_dir` (none when empty) and `extra` flags.
inline std::vector<std::string> Args(const std::string& state_dir,
                                     const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                   "--worker_threads=2"};
  if (!state_dir.empty()) args.push_back("--state_dir=" + state_dir);
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

inline bool ShmExists(const std::string& name) {
  struct stat info {};
  return ::stat(absl::StrCat("/dev/shm", name).c_str(), &info) == 0;
}

// A real entrokvd (ENTROKVD_PATH) started and waited for; a stub on its port once listening.
class Daemon {
 public:
  explicit Daemon(const std::string& state_dir, const std::vector<std::string>& extra = {})
      : process_(ENTROKVD_PATH, Args(state_dir, extra)) {
    listening_ = process_.WaitListening(20000);
    if (listening_) {
      address_ = absl::StrCat("127.0.0.1:", process_.port());
      stub_ = v1::CacheManager::NewStub(MakeChannel(address_));
    }
  }
  [[nodiscard]] bool listening() const { return listening_; }
  DaemonProcess& process() { return process_; }
  v1::CacheManager::Stub& stub() { return *stub_; }
  const std::string& address() const { return address_; }

 private:
  DaemonProcess process_;
  bool listening_ = false;
  std::string address_;
  std::unique_ptr<v1::CacheManager::Stub> stub_;
};

inline grpc::Status Open(v1::CacheManager::Stub& stub, const std::string& model,
                         const std::string& id, int64_t tokens, const std::string& parent = "",
                         int64_t prefix_pages = 0) {
  grpc::ClientContext context;
  v1::OpenSequenceRequest request;
  request.set_model_id(model);
  request.set_sequence_id(id);
  request.set_initial_tokens(tokens);
  request.set_parent_sequence_id(parent);
  request.set_prefix_pages(prefix_pages);
  v1::OpenSequenceResponse response;
  return stub.OpenSequence(&context, request, &response);
}

inline grpc::Status Append(v1::CacheManager::Stub& stub, const std::string& model,
                           const std::string& id, int64_t tokens) {
  grpc::ClientContext context;
  v1::AppendTokensRequest request;
  request.set_model_id(model);
  request.set_sequence_id(id);
  request.set_tokens(tokens);
  v1::AppendTokensResponse response;
  return stub.AppendTokens(&context, request, &response);
}

inline grpc::Status Close(v1::CacheManager::Stub& stub, const std::string& model,
                          const std::string& id) {
  grpc::ClientContext context;
  v1::CloseSequenceRequest request;
  request.set_model_id(model);
  request.set_sequence_id(id);
  v1::CloseSequenceResponse response;
  return stub.CloseSequence(&context, request, &response);
}

inline std::string ArenaName(Daemon& daemon, const std::string& model) {
  grpc::ClientContext context;
  v1::GetModelRequest request;
  request.set_model_id(model);
  v1::GetModelResponse response;
  EXPECT_TRUE(daemon.stub().GetModel(&context, request, &response).ok());
  return response.pool().arena_name();
}

inline void Register(Daemon& daemon, const std::string& model, v1::FrameLayout layout) {
  grpc::ClientContext context;
  v1::RegisterModelRequest request = RegisterRequest(model, 3, 8, 2, uint64_t{4} << 20);
  request.set_frame_layout(layout);
  v1::RegisterModelResponse response;
  ASSERT_TRUE(daemon.stub().RegisterModel(&context, request, &response).ok());
}

}  // namespace entrokv::service::testing

#endif  // ENTROKV_TESTS_E2E_DAEMON_RUNNER_H_
