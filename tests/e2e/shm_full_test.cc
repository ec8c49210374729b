// entrokvd in a container's /dev/shm: 64 MiB, Docker's default. The daemon must refuse a pool
// that cannot fit there when it starts (exit 2), refuse an arena the filesystem cannot hold when
// it is registered (RESOURCE_EXHAUSTED naming the shortfall), and never die of SIGBUS once a
// model is registered, however full /dev/shm gets afterwards.
//
// The outer test re-runs this binary's ShmFullInside tests in a private mount namespace
// (`unshare --mount`) with a 64 MiB tmpfs mounted on /dev/shm, so nothing outside sees it. That
// needs root (or CAP_SYS_ADMIN) and util-linux's unshare: elsewhere the test skips, saying why.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/test_support.h"

namespace entrokv::service {
namespace {

using ::entrokv::service::testing::DaemonProcess;
using ::entrokv::service::testing::MakeChannel;
using ::entrokv::service::testing::RegisterRequest;
using ::testing::HasSubstr;

constexpr char kInside[] = "ENTROKV_SHM_FULL_INSIDE";
constexpr int kCannotMount = 77;

// Runs `command` through the shell; its exit code (-1 when it died of a signal), output in *out.
int RunShell(const std::string& command, std::string* out) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  out->clear();
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out->append(buffer, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ShmFullTest, InA64MiBDevShm) {
  if (std::getenv(kInside) != nullptr) GTEST_SKIP() << "already inside the namespace";
  std::string out;
  if (RunShell("unshare --mount --propagation private true", &out) != 0) {
    GTEST_SKIP() << "cannot make a private mount namespace here (needs root or CAP_SYS_ADMIN "
                    "and util-linux's unshare), so a 64 MiB /dev/shm cannot be mounted: "
                 << out;
  }
  char self[PATH_MAX] = {};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  const std::string command = absl::StrCat(
      "unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm "
      "|| exit ",
      kCannotMount, "; ", kInside, "=1 exec \"$0\" --gtest_filter=ShmFullInside.*' ", self);
  const int code = RunShell(command, &out);
  if (code == kCannotMount) GTEST_SKIP() << "cannot mount a tmpfs on /dev/shm: " << out;
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("[  PASSED  ] 2 tests")) << out;
}

class ShmFullInside : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv(kInside) == nullptr) GTEST_SKIP() << "runs inside ShmFullTest's namespace";
  }
  void TearDown() override { ::unlink(kFiller); }

  static int64_t FreeBytes() {
    struct statvfs fs {};
    if (::statvfs("/dev/shm", &fs) != 0) return -1;
    return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  }
  // Takes all but `leave` bytes of /dev/shm's free space with a file of its own.
  static void Fill(int64_t leave) {
    ::unlink(kFiller);
    const int64_t take = FreeBytes() - leave;
    ASSERT_GT(take, 0);
    const int fd = ::open(kFiller, O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(::posix_fallocate(fd, 0, take), 0);
    ::close(fd);
  }
  // Arena objects in /dev/shm (lock objects aside).
  static std::vector<std::string> Arenas() {
    std::vector<std::string> names;
    DIR* dir = ::opendir("/dev/shm");
    if (dir == nullptr) return names;
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (absl::StartsWith(name, "entrokv.") && !absl::StrContains(name, ".lock")) {
        names.push_back(name);
      }
    }
    ::closedir(dir);
    return names;
  }

  static constexpr char kFiller[] = "/dev/shm/shm_full_test.filler";
};

TEST_F(ShmFullInside, APoolLargerThanDevShmIsRefusedAtStart) {
  DaemonProcess daemon(ENTROKVD_PATH, {"--listen=127.0.0.1:0",
                                       "--metrics_listen=", "--pool_capacity_bytes=1073741824"});
  EXPECT_EQ(daemon.WaitExit(20000), 2) << daemon.Stderr();
  EXPECT_THAT(daemon.Stderr(), HasSubstr("--pool_capacity_bytes"));
  EXPECT_THAT(daemon.Stderr(), HasSubstr("/dev/shm"));
}

TEST_F(ShmFullInside, AFullDevShmRefusesTheArenaAndNeverKillsTheDaemon) {
  DaemonProcess daemon(
      ENTROKVD_PATH,
      {"--listen=127.0.0.1:0", "--metrics_listen=", "--pool_capacity_bytes=50331648"});  // 48 MiB
  ASSERT_TRUE(daemon.WaitListening(20000)) << daemon.Stderr();
  auto stub = v1::CacheManager::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", daemon.port())));
  const v1::RegisterModelRequest model = RegisterRequest("m", 2, 8, 2, uint64_t{32} << 20);
  Fill(8 << 20);  // another process takes /dev/shm: 8 MiB left for a 32 MiB arena
  {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    const grpc::Status status = stub->RegisterModel(&context, model, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("short"));
    EXPECT_THAT(status.error_message(), HasSubstr("/dev/shm"));
  }
  EXPECT_THAT(Arenas(), ::testing::IsEmpty()) << "a refused arena was left behind";
  {
    grpc::ClientContext context;
    v1::UnregisterModelRequest request;
    request.set_model_id("m");
    request.set_force(true);
    v1::UnregisterModelResponse response;
    (void)stub->UnregisterModel(&context, request, &response);  // in case it was accepted
  }
  ::unlink(kFiller);
  {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    const grpc::Status status = stub->RegisterModel(&context, model, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  Fill(0);  // /dev/shm full after the arena was made: its pages are already the daemon's
  const auto open = [&](const std::string& id, int64_t tokens, const std::string& parent,
                        int64_t prefix_pages) {
    grpc::ClientContext context;
    v1::OpenSequenceRequest request;
    request.set_model_id("m");
    request.set_sequence_id(id);
    request.set_initial_tokens(tokens);
    request.set_parent_sequence_id(parent);
    request.set_prefix_pages(prefix_pages);
    v1::OpenSequenceResponse response;
    return stub->OpenSequence(&context, request, &response);
  };
  const auto append = [&](const std::string& id, int64_t tokens) {
    grpc::ClientContext context;
    v1::AppendTokensRequest request;
    request.set_model_id("m");
    request.set_sequence_id(id);
    request.set_tokens(tokens);
    v1::AppendTokensResponse response;
    return stub->AppendTokens(&context, request, &response);
  };
  // A fork sharing a partial tail page, then appends to both: copy-on-write writes the arena.
  EXPECT_TRUE(open("a", 100, "", 0).ok());
  EXPECT_TRUE(open("b", 0, "a", 7).ok());
  EXPECT_TRUE(append("b", 5).ok());
  EXPECT_TRUE(append("a", 4000).ok());
  EXPECT_TRUE(open("c", 20000, "", 0).ok());
  {
    grpc::ClientContext context;
    v1::ListModelsResponse response;
    EXPECT_TRUE(stub->ListModels(&context, {}, &response).ok())
        << "the daemon died: " << daemon.Stderr();
  }
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(20000), 0) << daemon.Stderr();
}

}  // namespace
}  // namespace entrokv::service
