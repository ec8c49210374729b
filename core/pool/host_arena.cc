// The host backend: a POSIX shared-memory object, mapped MAP_SHARED. The name stays linked for
// the arena's life so a worker can shm_open it (and, with keep_name, after it, so a restarted
// daemon can attach it again); the descriptor can be passed instead.
//
// The object is the frames, then a trailer whose last kTrailerRecordBytes say "this is an
// arena" (magic, the frames' bytes, a checksum), so any process can tell an arena from a
// worker's segment by what it holds. Its memory is reserved with posix_fallocate when the arena
// is made: tmpfs commits pages only when they are touched, and a page touched after the
// filesystem filled would kill the process with SIGBUS. And the arena takes an exclusive flock
// on the object for as long as it lives, so no second process attaches the same frames.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
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

// The trailer's record, at the very end of the object.
constexpr int64_t kTrailerRecordBytes = 64;
constexpr char kTrailerMagic[16] = "entrokv-arena-1";  // 15 characters, zero-padded

uint64_t TrailerChecksum(const unsigned char* record) {  // FNV-1a over magic and size
  uint64_t hash = 14695981039346656037ull;
  for (int i = 0; i < 24; ++i) {
    hash ^= record[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

void EncodeTrailer(int64_t bytes, unsigned char* record) {
  std::memset(record, 0, kTrailerRecordBytes);
  std::memcpy(record, kTrailerMagic, sizeof(kTrailerMagic));
  for (int i = 0; i < 8; ++i) record[16 + i] = static_cast<unsigned char>(bytes >> (8 * i));
  const uint64_t checksum = TrailerChecksum(record);
  for (int i = 0; i < 8; ++i) record[24 + i] = static_cast<unsigned char>(checksum >> (8 * i));
}

// What an object of `bytes` bytes of frames occupies, trailer included.
int64_t FileBytes(int64_t bytes) { return bytes + kHostArenaTrailerBytes; }

// Reserves the object's pages. RESOURCE_EXHAUSTED naming the shortfall when its filesystem
// (/dev/shm) cannot hold them; nothing stays reserved then (tmpfs undoes a failed fallocate).
absl::Status Reserve(int fd, const std::string& shm_name, int64_t file_bytes) {
  const int error = posix_fallocate(fd, 0, static_cast<off_t>(file_bytes));
  if (error == 0) return absl::OkStatus();
  if (error == ENOSPC) {
    struct statvfs fs {};
    const bool known = fstatvfs(fd, &fs) == 0;
    const int64_t free_bytes = known ? static_cast<int64_t>(fs.f_bavail) * fs.f_frsize : 0;
    const int64_t size_bytes = known ? static_cast<int64_t>(fs.f_blocks) * fs.f_frsize : 0;
    return absl::ResourceExhaustedError(absl::StrCat(
        "host arena ", shm_name, ": the shared-memory filesystem (/dev/shm) cannot hold ",
        file_bytes, " bytes: ", free_bytes, " of its ", size_bytes, " bytes are free, ",
        file_bytes - free_bytes, " short; a larger /dev/shm or a smaller pool is needed"));
  }
  return absl::InternalError(absl::StrCat("host arena ", shm_name, ": posix_fallocate(", file_bytes,
                                          " bytes): ", ErrnoText(error)));
}

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
    if (!keep_name_) shm_unlink(name_.c_str());
    close(fd_);  // drops the lock: a kept arena may be attached again from here on
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

// Maps an existing arena of exactly `bytes` bytes of frames. O_NOFOLLOW, O_NONBLOCK and the
// regular-file check keep a link or a FIFO planted under the name from being trusted; the
// owner, size and trailer checks keep anything but this user's arena of this pool out; the lock
// keeps a second process from owning frames another one hands out.
absl::StatusOr<std::unique_ptr<MemoryArena>> AttachHostArena(const std::string& shm_name,
                                                             int64_t bytes, bool keep_name) {
  const int fd = shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
  if (fd < 0) {
    const int error = errno;
    const std::string message =
        absl::StrCat("host arena: attach ", shm_name, ": shm_open: ", ErrnoText(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  const auto refuse = [&](absl::Status status) {
    close(fd);
    return status;
  };
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != FileBytes(bytes) ||
      HostArenaBytes(fd, st.st_size) != bytes) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("host arena: attach ", shm_name, ": not an arena of ", bytes,
                     " bytes (a regular object of ", FileBytes(bytes),
                     " bytes ending with an arena's trailer; found ", st.st_size, " bytes, mode ",
                     absl::Hex(st.st_mode), ")")));
  }
  if (st.st_uid != geteuid()) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("host arena: attach ", shm_name, ": owned by uid ", st.st_uid,
                     ", not by this process's uid ", geteuid(), "; someone changed it")));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    return refuse(error == EWOULDBLOCK
                      ? absl::UnavailableError(
                            absl::StrCat("host arena: attach ", shm_name,
                                         ": another running process holds it (its owner's lock)"))
                      : absl::InternalError(absl::StrCat("host arena: attach ", shm_name,
                                                         ": flock: ", ErrnoText(error))));
  }
  if (absl::Status reserved = Reserve(fd, shm_name, st.st_size); !reserved.ok()) {
    return refuse(reserved);
  }
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    return refuse(absl::InternalError(
        absl::StrCat("host arena: attach ", shm_name, ": mmap: ", ErrnoText(error))));
  }
  return std::unique_ptr<MemoryArena>(new HostArena(shm_name, fd, data, bytes, keep_name));
}

}  // namespace

int64_t HostArenaBytes(int fd, int64_t file_bytes) {
  if (file_bytes < kHostArenaTrailerBytes + 1) return -1;
  unsigned char record[kTrailerRecordBytes];
  if (pread(fd, record, sizeof(record), static_cast<off_t>(file_bytes - kTrailerRecordBytes)) !=
      static_cast<ssize_t>(sizeof(record))) {
    return -1;
  }
  unsigned char expected[kTrailerRecordBytes];
  EncodeTrailer(file_bytes - kHostArenaTrailerBytes, expected);
  return std::memcmp(record, expected, sizeof(record)) == 0 ? file_bytes - kHostArenaTrailerBytes
                                                            : -1;
}

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
  const auto undo = [&](absl::Status status) {
    close(fd);
    shm_unlink(shm_name.c_str());
    return status;
  };
  auto fail = [&](absl::string_view call) {
    const int error = errno;
    return undo(absl::InternalError(absl::StrCat("host arena: ", call, "(", shm_name, ", ", bytes,
                                                 " bytes): ", ErrnoText(error))));
  };
  // Locked before anyone can know the name is an arena (the trailer is not written yet).
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) return fail("flock");
  const int64_t file_bytes = FileBytes(bytes);
  if (ftruncate(fd, static_cast<off_t>(file_bytes)) != 0) return fail("ftruncate");
  if (absl::Status reserved = Reserve(fd, shm_name, file_bytes); !reserved.ok()) {
    return undo(reserved);
  }
  unsigned char record[kTrailerRecordBytes];
  EncodeTrailer(bytes, record);
  if (pwrite(fd, record, sizeof(record), static_cast<off_t>(file_bytes - kTrailerRecordBytes)) !=
      static_cast<ssize_t>(sizeof(record))) {
    return fail("pwrite");
  }
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
  // An arena's frames without its trailer; any other object whole.
  const int64_t frames_bytes = HostArenaBytes(fd, st.st_size);
  const int64_t bytes = frames_bytes > 0 ? frames_bytes : static_cast<int64_t>(st.st_size);
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("host arena ", what, ": mmap: ", ErrnoText(error)));
  }
  return std::unique_ptr<HostArenaMapping>(new HostArenaMapping(fd, data, bytes));
}

HostArenaMapping::~HostArenaMapping() {
  munmap(data_, static_cast<size_t>(bytes_));
  close(fd_);
}

}  // namespace entrokv
