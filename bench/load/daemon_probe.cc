#include "bench/load/daemon_probe.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/support/http_get.h"

namespace entrokv::bench {
namespace {

// Inodes of the sockets listening on `port` in one /proc/net/tcp-format table.
void ListeningInodes(const std::string& table, int port, std::vector<std::string>* inodes) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    if (fields.size() < 10) continue;
    const size_t colon = fields[1].rfind(':');
    if (colon == std::string::npos) continue;
    const long local_port = std::strtol(fields[1].c_str() + colon + 1, nullptr, 16);
    if (local_port == port && fields[3] == "0A") inodes->push_back(fields[9]);  // 0A: LISTEN
  }
}

}  // namespace

pid_t FindListeningPid(int port) {
  std::vector<std::string> inodes;
  ListeningInodes("/proc/net/tcp", port, &inodes);
  ListeningInodes("/proc/net/tcp6", port, &inodes);
  if (inodes.empty()) return 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return 0;
  pid_t found = 0;
  while (const dirent* entry = ::readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid) || pid <= 0) continue;
    const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
    DIR* fds = ::opendir(fd_dir.c_str());
    if (fds == nullptr) continue;
    while (const dirent* fd = ::readdir(fds)) {
      char target[128];
      const std::string link = absl::StrCat(fd_dir, "/", fd->d_name);
      const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      for (const std::string& inode : inodes) {
        if (std::string(target) == absl::StrCat("socket:[", inode, "]")) found = pid;
      }
      if (found != 0) break;
    }
    ::closedir(fds);
    if (found != 0) break;
  }
  ::closedir(proc);
  return found;
}

int64_t ReadStatusKb(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  const std::string prefix = field + ":";
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, prefix)) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    int64_t kb = 0;
    return absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kb) ? kb : -1;
  }
  return -1;
}

bool ProcessAlive(pid_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH)) return false;
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (stat.empty()) return false;
  // "pid (comm) S ...": the state follows the last ')', since comm may hold anything.
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ||
         (stat[paren + 2] != 'Z' && stat[paren + 2] != 'X');
}

std::string HttpGet(int port, const std::string& path, int timeout_ms) {
  return ::entrokv::testing::HttpGet(port, path, timeout_ms).value_or("");
}

}  // namespace entrokv::bench
