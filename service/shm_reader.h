// Reads statistics a worker wrote into its own POSIX shared-memory segment.
#ifndef ENTROKV_SERVICE_SHM_READER_H_
#define ENTROKV_SERVICE_SHM_READER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace entrokv::service {

// A segment belongs to another process, which may shrink, grow, replace or fill it at any
// moment. So the daemon never maps it: it copies the bytes with pread(2), which reports a
// shrunk segment as a short read instead of SIGBUS on a page past the end (docs/decisions.md,
// "Hardening"). The copy also freezes the values that are validated and then scored.
// Stateless; thread-safe.
class ShmReader {
 public:
  // Checks that `length` bytes at `offset` of segment `name` can be read, without reading
  // them (the cheap checks of a request, before any scoring). Errors name `field`:
  // INVALID_ARGUMENT for a name not of the form "/entrokv<chars without '/'>", anything but a
  // regular file (a FIFO or device is refused without blocking) or a range outside the segment;
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
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_SHM_READER_H_
