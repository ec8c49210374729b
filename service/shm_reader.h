// Read-only access to statistics a worker wrote into its own POSIX shared-memory segment.
#ifndef ENTROKV_SERVICE_SHM_READER_H_
#define ENTROKV_SERVICE_SHM_READER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace entrokv::service {

// One read-only mapping of a whole segment. Owns it: unmapped when the last holder lets go.
class ShmMapping {
 public:
  ShmMapping(const void* data, int64_t bytes, ino_t inode)
      : data_(data), bytes_(bytes), inode_(inode) {}
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  [[nodiscard]] const void* data() const { return data_; }
  [[nodiscard]] int64_t bytes() const { return bytes_; }
  [[nodiscard]] ino_t inode() const { return inode_; }

 private:
  const void* data_;
  int64_t bytes_;
  ino_t inode_;
};

// A region of a mapped segment; `mapping` keeps `data` valid.
struct ShmRegion {
  std::shared_ptr<const ShmMapping> mapping;
  const void* data = nullptr;
};

// Maps segments by name and keeps up to `max_segments` mappings so repeated statistics from
// the same worker segment cost no mmap and no page faults. A segment re-created under the same
// name (new inode) or grown is mapped again. Thread-safe.
//
// The worker must not shrink a segment while a call that names it is in flight (the daemon
// would fault reading past the end); the size is checked on every call.
class ShmReader {
 public:
  explicit ShmReader(int max_segments = 64) : max_segments_(max_segments) {}

  // The `length` bytes at `offset` of segment `name`. INVALID_ARGUMENT naming
  // `field` for a name not of the form "/entrokv<chars without '/'>" or a range outside the
  // segment; NOT_FOUND when no such segment exists or it cannot be opened.
  [[nodiscard]] absl::StatusOr<ShmRegion> Read(absl::string_view field, absl::string_view name,
                                               uint64_t offset, uint64_t length);

 private:
  const int max_segments_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const ShmMapping>> mappings_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_SHM_READER_H_
