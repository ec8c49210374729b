// The memory behind a page pool: one contiguous region a worker process can reach.
#ifndef ENTROKV_CORE_POOL_ARENA_H_
#define ENTROKV_CORE_POOL_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/pool/geometry.h"

namespace entrokv {

// What a worker needs to reach an arena from another process.
struct ArenaInfo {
  Backend backend = Backend::kHost;
  std::string name;        // host: the POSIX shared-memory name ("/entrokv.<pool>.<pid>.<n>")
  int fd = -1;             // host: the daemon's descriptor (for SCM_RIGHTS passing); cuda: -1
  int64_t bytes = 0;       // size of the region
  std::string ipc_handle;  // cuda: the cudaIpcMemHandle_t bytes (64); host: empty
  int device = -1;         // cuda: the device ordinal; host: -1
};

// One region of `bytes()` bytes. Owns the memory: destroying the arena releases it (and unlinks
// a host arena's name). Not thread-safe; the owner serializes calls. Frames never move.
class MemoryArena {
 public:
  virtual ~MemoryArena() = default;
  [[nodiscard]] virtual ArenaInfo info() const = 0;
  // The region's first byte: a host address for host, a device address for cuda.
  [[nodiscard]] virtual void* base() const = 0;
  // Copies `bytes` bytes inside the arena (copy-on-write of a shared page).
  // REQUIRES: both ranges inside the arena and not overlapping.
  [[nodiscard]] virtual absl::Status Copy(int64_t dst_offset, int64_t src_offset,
                                          int64_t bytes) = 0;
};

// A host arena's shared-memory object is its frames (bytes 0 .. bytes()) followed by a trailer of
// kHostArenaTrailerBytes whose last bytes say what the object is: a pool arena, never a worker's
// segment, so no daemon reads it as a statistic whatever its name or link. Frame f stays at byte
// f * frame_bytes; a worker maps the first bytes() bytes (HostArenaMapping does).
inline constexpr int64_t kHostArenaTrailerBytes = 4096;

// The frames' bytes when the open file `fd` of `file_bytes` bytes ends with a host arena's
// trailer, else -1. One pread of the file's last bytes; the caller checked it is a regular file.
[[nodiscard]] int64_t HostArenaBytes(int fd, int64_t file_bytes);

// Where a host arena's shared memory comes from. The default (everything empty) makes a new
// object named after the pool and unlinks it when the arena goes.
struct HostArenaSource {
  // The exact shared-memory name ("/entrokv...."); empty: "/entrokv.<hint>.<pid>.<n>", the
  // next free n when one is already taken.
  std::string name;
  // Map the existing object `name` (crash recovery re-attaches the frames' bytes) instead of
  // creating it. Only an arena of this process's user, of exactly this size, that no other
  // process holds (see CreateHostArena) is attached.
  bool attach = false;
  // Leave the name linked when the arena goes, so a restarted daemon can attach it again.
  bool keep_name = false;
};

// A new arena of `bytes` bytes (> 0). `name` is a hint folded into a host arena's name.
// `device` is the CUDA device ordinal of a cuda arena; a host arena ignores it (the caller
// records which device a host arena stands in for).
// Host: INTERNAL with errno text when shm_open/ftruncate/mmap fail. Cuda: UNIMPLEMENTED
// "backend: cuda was not built in" without CUDA; UNAVAILABLE without a device;
// INVALID_ARGUMENT naming the device when it does not exist; RESOURCE_EXHAUSTED when the
// device is out of memory.
[[nodiscard]] absl::StatusOr<std::unique_ptr<MemoryArena>> CreateArena(
    Backend backend, absl::string_view name, int64_t bytes, const HostArenaSource& host = {},
    int device = 0);
// As CreateArena for the host backend. The arena's memory is reserved (posix_fallocate) before
// it is handed out, so a full /dev/shm fails here with RESOURCE_EXHAUSTED naming the shortfall,
// never later as SIGBUS on a page first touched; and the arena holds an exclusive flock on its
// object for its whole life (the kernel drops it however the process ends).
// With source.attach: NOT_FOUND when no object has that name; FAILED_PRECONDITION when it is
// not a regular object of exactly `bytes` bytes with an arena's trailer, or belongs to another
// user; UNAVAILABLE when another process holds its lock (the arena is in use, so two owners
// would hand out the same frames). ALREADY_EXISTS when creating an exact name that exists.
[[nodiscard]] absl::StatusOr<std::unique_ptr<MemoryArena>> CreateHostArena(
    absl::string_view name, int64_t bytes, const HostArenaSource& source = {});
[[nodiscard]] absl::StatusOr<std::unique_ptr<MemoryArena>> CreateCudaArena(absl::string_view name,
                                                                           int64_t bytes,
                                                                           int device = 0);

// A worker-side mapping of a host arena, read-write and shared with the daemon. Owns the
// mapping (and the descriptor it opened); the daemon's arena may be destroyed first, the bytes
// stay valid until this mapping goes too. Not thread-safe.
class HostArenaMapping {
 public:
  // Maps the arena by its shared-memory name: NOT_FOUND when no such name exists. A host
  // arena's trailer is left out: bytes() is its frames' bytes.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HostArenaMapping>> OpenByName(
      absl::string_view name);
  // Maps the arena through a descriptor (one inherited or received); the descriptor is
  // duplicated, the caller keeps its own. INVALID_ARGUMENT for a bad descriptor.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HostArenaMapping>> OpenByFd(int fd);

  ~HostArenaMapping();
  HostArenaMapping(const HostArenaMapping&) = delete;
  HostArenaMapping& operator=(const HostArenaMapping&) = delete;

  [[nodiscard]] void* data() const { return data_; }
  [[nodiscard]] int64_t bytes() const { return bytes_; }

 private:
  HostArenaMapping(int fd, void* data, int64_t bytes) : fd_(fd), data_(data), bytes_(bytes) {}
  static absl::StatusOr<std::unique_ptr<HostArenaMapping>> MapFd(int fd, absl::string_view what);

  int fd_;
  void* data_;
  int64_t bytes_;
};

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_ARENA_H_
