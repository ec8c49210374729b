#include "bench/service/daemon_child.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/support/daemon_line.h"

namespace entrokv::bench {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonChild>> DaemonChild::Start(
    const std::string& binary, const std::vector<std::string>& args, int timeout_ms) {
  int out[2];
  if (::pipe(out) != 0) return absl::UnavailableError("entrokvd: cannot make a pipe");
  // Everything the child needs is built before fork: it only redirects and execs.
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::UnavailableError("entrokvd: fork failed");
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::close(out[1]);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::unique_ptr<DaemonChild> child(new DaemonChild(pid, out[0]));
  std::string printed;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline) {
    if (const std::optional<testing::ListeningAddresses> line =
            testing::ParseListeningLine(printed)) {
      child->address_ = line->grpc;
      return child;
    }
    pollfd fd{child->stdout_fd_, POLLIN, 0};
    if (::poll(&fd, 1, 50) <= 0) continue;
    char buffer[512];
    const ssize_t n = ::read(child->stdout_fd_, buffer, sizeof(buffer));
    if (n <= 0) break;  // it exited (or closed stdout) before serving
    printed.append(buffer, static_cast<size_t>(n));
  }
  child->Stop(1000);
  return absl::UnavailableError(absl::StrCat(binary, ": no start-up line within ", timeout_ms,
                                             " ms (printed: '", printed, "')"));
}

DaemonChild::~DaemonChild() { Stop(10000); }

int DaemonChild::Stop(int timeout_ms) {
  if (stopped_) return exit_status_;
  stopped_ = true;
  ::kill(pid_, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
  } else if (done == pid_ && WIFEXITED(status)) {
    exit_status_ = WEXITSTATUS(status);
  }
  ::close(stdout_fd_);
  return exit_status_;
}

double DaemonChild::CpuSeconds() const {
  std::ifstream file(absl::StrCat("/proc/", pid_, "/stat"));
  const std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  // The command name (field 2) is in parentheses and may hold spaces: count from after it.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(close + 2), ' ');
  // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
  int64_t user = 0;
  int64_t system = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &user) ||
      !absl::SimpleAtoi(fields[12], &system)) {
    return -1;
  }
  return static_cast<double>(user + system) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace entrokv::bench
