#include "service/arena_names.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace entrokv::service {
namespace {

constexpr char kPrefix[] = "entrokv.";
constexpr char kLockSuffix[] = ".lock";
constexpr char kNewLockSuffix[] = ".lock-new";  // before the rename that publishes a lock

std::string Path(absl::string_view file) { return absl::StrCat(kShmDirectory, "/", file); }

std::vector<std::string> ListShm() {
  std::vector<std::string> names;
  DIR* dir = opendir(kShmDirectory);
  if (dir == nullptr) return names;
  while (const dirent* entry = readdir(dir)) {
    if (absl::StartsWith(entry->d_name, kPrefix)) names.emplace_back(entry->d_name);
  }
  closedir(dir);
  return names;
}

// The descriptor of a lock object or arena when it is a regular file of ours, else -1.
int OpenOwnLock(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) || info.st_uid != geteuid()) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string SafeModel(absl::string_view model_id) {
  std::string safe;
  for (const char c : model_id.substr(0, 64)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    safe.push_back(ok ? c : '_');
  }
  return safe.empty() ? "model" : safe;
}

int64_t NowNanos() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec * int64_t{1000000000} + now.tv_nsec;
}

}  // namespace

ArenaNamer::ArenaNamer(std::string stem, int lock_fd, bool durable)
    : stem_(std::move(stem)),
      start_(absl::StrCat(absl::Hex(NowNanos()))),
      lock_fd_(lock_fd),
      durable_(durable) {}

absl::StatusOr<std::unique_ptr<ArenaNamer>> ArenaNamer::ForState(absl::string_view instance) {
  const std::string stem = absl::StrCat("d", instance);
  const std::string path = Path(absl::StrCat(kPrefix, stem, kLockSuffix));
  // A lock taken on an object the path no longer names (its daemon removed it on the way out,
  // and another made a new one) means nothing: the inode check sends us round again.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (fd < 0) {
      return absl::InternalError(
          absl::StrCat("arena lock ", path, ": open: ", std::strerror(errno)));
    }
    struct stat held {};
    if (fstat(fd, &held) != 0 || !S_ISREG(held.st_mode) || held.st_uid != geteuid()) {
      close(fd);
      return absl::InternalError(
          absl::StrCat("arena lock ", path, ": not a regular file of this user"));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      close(fd);
      if (error != EWOULDBLOCK) {
        return absl::InternalError(
            absl::StrCat("arena lock ", path, ": flock: ", std::strerror(error)));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "another running entrokvd holds this state's instance ", instance, " (lock ", path,
          "): the directory is in use, or is a copy of a running daemon's state (a restored "
          "backup, a volume snapshot); two daemons on one instance would hand out the same "
          "frames. Stop the other daemon, or start this one on an empty directory"));
    }
    struct stat named {};
    if (stat(path.c_str(), &named) == 0 && named.st_dev == held.st_dev &&
        named.st_ino == held.st_ino) {
      return std::unique_ptr<ArenaNamer>(new ArenaNamer(stem, fd, /*durable=*/true));
    }
    close(fd);  // replaced under us: lock the object the path names now
  }
  return absl::InternalError(absl::StrCat("arena lock ", path, ": keeps being replaced"));
}

absl::StatusOr<std::unique_ptr<ArenaNamer>> ArenaNamer::ForProcess() {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string stem = absl::StrCat("e", getpid(), "-", absl::Hex(NowNanos() + attempt));
    // Made under a name the cleaner treats as a lock too, locked, then renamed into place, so
    // that no moment exists where a cleaner could see the published lock unheld.
    const std::string fresh = Path(absl::StrCat(kPrefix, stem, kNewLockSuffix));
    const int fd = open(fresh.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return absl::InternalError(
          absl::StrCat("arena lock ", fresh, ": open: ", std::strerror(errno)));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 ||
        rename(fresh.c_str(), Path(absl::StrCat(kPrefix, stem, kLockSuffix)).c_str()) != 0) {
      // A cleaner took (and removed) it in between: try another stem.
      close(fd);
      unlink(fresh.c_str());
      continue;
    }
    return std::unique_ptr<ArenaNamer>(new ArenaNamer(stem, fd, /*durable=*/false));
  }
  return absl::InternalError("arena lock: could not take a lock object in /dev/shm");
}

ArenaNamer::~ArenaNamer() {
  unlink(Path(absl::StrCat(kPrefix, stem_, kLockSuffix)).c_str());
  close(lock_fd_);
}

std::string ArenaNamer::Next(absl::string_view model_id) {
  return absl::StrCat("/", kPrefix, stem_, ".", SafeModel(model_id), ".", start_, "-",
                      counter_.fetch_add(1));
}

int ArenaNamer::RemoveUnused(const absl::flat_hash_set<std::string>& in_use) const {
  int removed = 0;
  const std::string mine = absl::StrCat(kPrefix, stem_, ".");
  for (const std::string& name : ListShm()) {
    if (!absl::StartsWith(name, mine) || in_use.contains(absl::StrCat("/", name))) continue;
    if (absl::EndsWith(name, kLockSuffix) || absl::EndsWith(name, kNewLockSuffix)) continue;
    // An arena some process holds (its flock) is in use whatever the journal says: kept.
    const int fd = OpenOwnLock(Path(name));
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) removed += unlink(Path(name).c_str()) == 0;
    close(fd);
  }
  return removed;
}

int RemoveDeadDaemonArenas() {
  int removed = 0;
  const std::vector<std::string> names = ListShm();
  for (const std::string& lock : names) {
    absl::string_view stem = lock;
    stem.remove_prefix(std::strlen(kPrefix));
    if (absl::StartsWith(stem, "d") && absl::EndsWith(stem, kLockSuffix) &&
        !absl::StrContains(stem.substr(0, stem.size() - std::strlen(kLockSuffix)), '.')) {
      // A --state_dir instance's lock left by a daemon that did not stop cleanly: the lock
      // object only (its arenas wait for the instance's restart). Taking it from under a daemon
      // about to lock it is harmless: that daemon finds the name gone or replaced and retries.
      const int fd = OpenOwnLock(Path(lock));
      if (fd < 0) continue;
      if (flock(fd, LOCK_EX | LOCK_NB) == 0) removed += unlink(Path(lock).c_str()) == 0;
      close(fd);
      continue;
    }
    if (!absl::StartsWith(stem, "e") ||
        !(absl::ConsumeSuffix(&stem, kLockSuffix) || absl::ConsumeSuffix(&stem, kNewLockSuffix)) ||
        absl::StrContains(stem, '.')) {
      continue;
    }
    const int fd = OpenOwnLock(Path(lock));
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {  // its daemon is alive
      close(fd);
      continue;
    }
    // Holding the dead daemon's lock: its arenas first, then the lock itself.
    const std::string arenas = absl::StrCat(kPrefix, stem, ".");
    for (const std::string& name : ListShm()) {
      if (!absl::StartsWith(name, arenas) || absl::EndsWith(name, kLockSuffix) ||
          absl::EndsWith(name, kNewLockSuffix)) {
        continue;
      }
      removed += unlink(Path(name).c_str()) == 0;
    }
    removed += unlink(Path(lock).c_str()) == 0;
    close(fd);
  }
  return removed;
}

}  // namespace entrokv::service
