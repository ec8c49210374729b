// Reads statistics a worker wrote into its own POSIX shared-memory segment.
#ifndef ENTROKV_SERVICE_SHM_READER_H_
#define ENTROKV_SERVICE_SHM_READER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace entrokv::service {

// One segment that passed ShmReader's checks, held open: what is read later is the object that
// was checked, even when its name is unlinked or reused meanwhile. Move-only; closes the
// descriptor when destroyed. Reads are thread-safe (pread has no file position).
class ShmSegment {
 public:
  ShmSegment(ShmSegment&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), name_(std::move(other.name_)), size_(other.size_) {}
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  [[nodiscard]] const std::string& name() const { return name_; }

  // INVALID_ARGUMENT naming `field` when [offset, offset + length) is outside the segment as it
  // was when it was opened.
  [[nodiscard]] absl::Status CheckRange(absl::string_view field, uint64_t offset,
                                        uint64_t length) const;
  // Copies `length` bytes at `offset` into out[0, length) with pread(2). FAILED_PRECONDITION
  // naming `field` when the segment shrank below the range while it was read.
  // REQUIRES: CheckRange(offset, length) passed; `out` holds `length` bytes.
  [[nodiscard]] absl::Status Read(absl::string_view field, uint64_t offset, uint64_t length,
                                  char* out) const;

 private:
  friend class ShmReader;
  ShmSegment(int fd, std::string name, uint64_t size)
      : fd_(fd), name_(std::move(name)), size_(size) {}

  int fd_;
  std::string name_;
  uint64_t size_;  // at the checks
};

// A segment belongs to another process, which may shrink, grow, replace or fill it at any
// moment. So the daemon never maps it: it copies the bytes with pread(2), which reports a
// shrunk segment as a short read instead of SIGBUS on a page past the end (docs/decisions.md,
// "Hardening"). The copy also freezes the values that are validated and then scored.
// Stateless but for the access rules; thread-safe.
class ShmReader {
 public:
  // Who may be read. A segment is refused when its owner is neither this process's effective
  // user nor in `allowed_uids` (a daemon running as root would otherwise read any user's 0600
  // segment for whoever names it), and when it is a pool arena: one that ends with the host
  // arena trailer (any daemon's, under any name or link; core/pool/arena.h) or that `is_arena`
  // knows by (dev, inode). Arenas hold other tenants' KV data and are never statistics.
  struct Access {
    std::vector<uid_t> allowed_uids;
    std::function<bool(dev_t, ino_t)> is_arena;
  };
  ShmReader() = default;
  explicit ShmReader(Access access) : access_(std::move(access)) {}

  // Checks segment `name` and holds it open (the range is checked with CheckRange). Errors name
  // `field`: INVALID_ARGUMENT for a name not of the form "/entrokv<chars without '/'>" or
  // anything but a regular file (a FIFO or device is refused without blocking);
  // PERMISSION_DENIED for an arena or a segment of a user not allowed (see Access); NOT_FOUND
  // when no such segment exists or it cannot be opened.
  [[nodiscard]] absl::StatusOr<ShmSegment> Open(absl::string_view field,
                                                absl::string_view name) const;

 private:
  Access access_;
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_SHM_READER_H_
