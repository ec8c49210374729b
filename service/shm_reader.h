// Reads statistics a worker wrote into its own POSIX shared-memory segment.
#ifndef ENTROKV_SERVICE_SHM_READER_H_
#define ENTROKV_SERVICE_SHM_READER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace entrokv::service {

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

  // Checks that `length` bytes at `offset` of segment `name` can be read, without reading
  // them (the cheap checks of a request, before any scoring). Errors name `field`:
  // INVALID_ARGUMENT for a name not of the form "/entrokv<chars without '/'>", anything but a
  // regular file (a FIFO or device is refused without blocking) or a range outside the segment;
  // PERMISSION_DENIED for an arena or a segment of a user not allowed (see Access);
  // NOT_FOUND when no such segment exists or it cannot be opened.
  [[nodiscard]] absl::Status Check(absl::string_view field, absl::string_view name, uint64_t offset,
                                   uint64_t length) const;

  // The same checks, then copies the bytes into *out (resized to `length`; its storage is
  // suitably aligned for any statistic element type). FAILED_PRECONDITION when the segment
  // shrank below the range while it was being read.
  [[nodiscard]] absl::Status Copy(absl::string_view field, absl::string_view name, uint64_t offset,
                                  uint64_t length, std::vector<char>* out) const;

 private:
  // An open descriptor of the checked segment, or the error; the caller closes it.
  [[nodiscard]] absl::Status Open(absl::string_view field, absl::string_view name, uint64_t offset,
                                  uint64_t length, int* fd) const;

  Access access_;
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_SHM_READER_H_
