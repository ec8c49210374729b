// The host backend: a POSIX shared-memory object, mapped MAP_SHARED. The name stays linked for
// the arena's life so a worker can shm_open it (and, with keep_name, after it, so a restarted
// daemon can attach it again); the descriptor can be passed instead. Pages of
// the object are committed only when touched, so a large, mostly idle pool costs little.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/pool/arena.h"

namespace entrokv {
namespace {

std::string ErrnoText(int error) { return std::strerror(error); }

constexpr int kGeneratedNameAttempts = 64;

// Shared-memory names allow one leading slash and no other; keep a readable, safe subset.
std::string ShmName(absl::string_view hint) {
  static std::atomic<int64_t> counter{0};
  std::string safe;
  for (char c : hint.substr(0, 64)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    safe.push_back(ok ? c : '_');
  }
  if (safe.empty()) safe = "pool";
  return absl::StrCat("/entrokv.", safe, ".", getpid(), ".", counter.fetch_add(1));
}

class HostArena final : public MemoryArena {
 public:
  HostArena(std::string name, int fd, void* data, int64_t bytes, bool keep_name)
      : name_(std::move(name)), fd_(fd), data_(data), bytes_(bytes), keep_name_(keep_name) {}
  ~HostArena() override {
    munmap(data_, static_cast<size_t>(bytes_));
    close(fd_);
    if (!keep_name_) shm_unlink(name_.c_str());
  }
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  ArenaInfo info() const override {
    ArenaInfo info;
    info.backend = Backend::kHost;
    info.name = name_;
    info.fd = fd_;
    info.bytes = bytes_;
    return info;
  }
  void* base() const override { return data_; }
  absl::Status Copy(int64_t dst_offset, int64_t src_offset, int64_t bytes) override {
    std::memcpy(static_cast<char*>(data_) + dst_offset, static_cast<char*>(data_) + src_offset,
                static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

 private:
  std::string name_;
  int fd_;
  void* data_;
  int64_t bytes_;
  bool keep_name_;
};

// Maps an existing object of exactly `bytes` bytes. O_NOFOLLOW, O_NONBLOCK and the
// regular-file check keep a link or a FIFO planted under the name from being trusted.
absl::StatusOr<std::unique_ptr<MemoryArena>> AttachHostArena(const std::string& shm_name,
                                                             int64_t bytes, bool keep_name) {
  const int fd = shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
  if (fd < 0) {
    const int error = errno;
    const std::string message =
        absl::StrCat("host arena: attach ", shm_name, ": shm_open: ", ErrnoText(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "host arena: attach ", shm_name, ": not a regular shared-memory object of ", bytes,
        " bytes (found ", st.st_size, " bytes, mode ", absl::Hex(st.st_mode), ")"));
  }
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return absl::InternalError(
        absl::StrCat("host arena: attach ", shm_name, ": mmap: ", ErrnoText(error)));
  }
  return std::unique_ptr<MemoryArena>(new HostArena(shm_name, fd, data, bytes, keep_name));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryArena>> CreateHostArena(absl::string_view name, int64_t bytes,
                                                             const HostArenaSource& source) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("arena bytes must be positive, got ", bytes));
  }
  if (source.attach) return AttachHostArena(source.name, bytes, source.keep_name);
  // A generated name can be taken: left by a process that died with this pid, or held by one
  // with the same pid in another pid namespace sharing /dev/shm. Take the next one, as mkstemp
  // does; an exact name the caller chose is never replaced.
  const int attempts = source.name.empty() ? kGeneratedNameAttempts : 1;
  std::string shm_name;
  int fd = -1;
  for (int attempt = 0; attempt < attempts && fd < 0; ++attempt) {
    shm_name = source.name.empty() ? ShmName(name) : source.name;
    fd = shm_open(shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    const int error = errno;
    const std::string message =
        absl::StrCat("host arena: shm_open(", shm_name, "): ", ErrnoText(error));
    return error == EEXIST ? absl::AlreadyExistsError(message) : absl::InternalError(message);
  }
  auto fail = [&](absl::string_view call) {
    const int error = errno;
    close(fd);
    shm_unlink(shm_name.c_str());
    return absl::InternalError(absl::StrCat("host arena: ", call, "(", shm_name, ", ", bytes,
                                            " bytes): ", ErrnoText(error)));
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("ftruncate");
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail("mmap");
  return std::unique_ptr<MemoryArena>(new HostArena(shm_name, fd, data, bytes, source.keep_name));
}

absl::StatusOr<std::unique_ptr<HostArenaMapping>> HostArenaMapping::OpenByName(
    absl::string_view name) {
  const std::string shm_name(name);
  const int fd = shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int error = errno;
    const std::string message =
        absl::StrCat("host arena \"", shm_name, "\": shm_open: ", ErrnoText(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  return MapFd(fd, shm_name);
}

absl::StatusOr<std::unique_ptr<HostArenaMapping>> HostArenaMapping::OpenByFd(int fd) {
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) {
    return absl::InvalidArgumentError(absl::StrCat("host arena fd ", fd, ": ", ErrnoText(errno)));
  }
  return MapFd(own, absl::StrCat("fd ", fd));
}

absl::StatusOr<std::unique_ptr<HostArenaMapping>> HostArenaMapping::MapFd(int fd,
                                                                          absl::string_view what) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    const int error = errno;
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("host arena ", what, ": empty or unreadable (", ErrnoText(error), ")"));
  }
  void* data =
      mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("host arena ", what, ": mmap: ", ErrnoText(error)));
  }
  return std::unique_ptr<HostArenaMapping>(
      new HostArenaMapping(fd, data, static_cast<int64_t>(st.st_size)));
}

HostArenaMapping::~HostArenaMapping() {
  munmap(data_, static_cast<size_t>(bytes_));
  close(fd_);
}

}  // namespace entrokv
