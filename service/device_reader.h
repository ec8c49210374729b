// Reads statistics a worker left in its own GPU memory (Statistic.device_buffer): the worker's
// allocation is mapped once through its CUDA IPC handle and kept mapped for the sequences that
// use it, so a decision costs one device-to-host copy (or none, with a device scorer).
#ifndef ENTROKV_SERVICE_DEVICE_READER_H_
#define ENTROKV_SERVICE_DEVICE_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "entrokv/v1/types.pb.h"

namespace entrokv::service {

// The device calls the reader makes, behind an interface so that its cache is tested without a
// GPU. CudaDeviceMemory() is the real one.
class DeviceMemory {
 public:
  struct Mapping {
    int device = 0;
    const void* base = nullptr;  // in this process
    uint64_t bytes = 0;          // the allocation's size
  };
  virtual ~DeviceMemory() = default;
  // Maps the allocation `handle` names on `device`; errors name `field` (see
  // cuda::OpenIpcHandle for the codes).
  virtual absl::StatusOr<Mapping> Open(absl::string_view field, absl::string_view handle,
                                       int device) = 0;
  virtual void Close(const Mapping& mapping) = 0;
  // Copies [offset, offset + length) of the mapping into out[0, length).
  virtual absl::Status CopyToHost(absl::string_view field, const Mapping& mapping, uint64_t offset,
                                  uint64_t length, char* out) = 0;
};

// The CUDA runtime's (core/cuda/ipc.h); in a daemon built without CUDA every Open is
// FAILED_PRECONDITION saying so.
std::unique_ptr<DeviceMemory> CudaDeviceMemory();

// One mapped allocation; unmapped when the last holder lets go (the reader's cache, or a
// decision still reading it after the cache dropped it).
class DeviceMapping {
 public:
  DeviceMapping(std::shared_ptr<DeviceMemory> memory, DeviceMemory::Mapping mapping)
      : memory_(std::move(memory)), mapping_(mapping) {}
  ~DeviceMapping() { memory_->Close(mapping_); }
  DeviceMapping(const DeviceMapping&) = delete;
  DeviceMapping& operator=(const DeviceMapping&) = delete;
  [[nodiscard]] const DeviceMemory::Mapping& mapping() const { return mapping_; }
  [[nodiscard]] DeviceMemory& memory() const { return *memory_; }

 private:
  const std::shared_ptr<DeviceMemory> memory_;  // outlives every mapping it made
  const DeviceMemory::Mapping mapping_;
};

// One layer's statistic in a mapped allocation, range-checked. Holding it keeps the mapping.
class DeviceStatistic {
 public:
  DeviceStatistic(std::shared_ptr<const DeviceMapping> mapping, std::string field, uint64_t offset,
                  uint64_t length)
      : mapping_(std::move(mapping)), field_(std::move(field)), offset_(offset), length_(length) {}

  [[nodiscard]] uint64_t length() const { return length_; }
  [[nodiscard]] int device() const { return mapping_->mapping().device; }
  // The first element, in device memory: what a device scorer reads in place.
  [[nodiscard]] const void* device_data() const {
    return static_cast<const char*>(mapping_->mapping().base) + offset_;
  }
  // The statistic's bytes into out[0, length()) with one device-to-host copy: the host scorer's
  // input. Errors name the field.
  [[nodiscard]] absl::Status CopyToHost(char* out) const {
    return mapping_->memory().CopyToHost(field_, mapping_->mapping(), offset_, length_, out);
  }

 private:
  std::shared_ptr<const DeviceMapping> mapping_;
  std::string field_;
  uint64_t offset_;
  uint64_t length_;
};

// Checks what can be checked of a region without a device: the handle's length, length_bytes
// against `expected` (query_heads * tokens * element size), offset_bytes's alignment to
// `element_bytes` and the range's arithmetic, the device's sign. INVALID_ARGUMENT naming the
// field under `field` (e.g. "layers[3].statistic.device_buffer.length_bytes").
[[nodiscard]] absl::Status CheckDeviceRegion(absl::string_view field,
                                             const v1::DeviceBufferRegion& region,
                                             uint64_t expected, int element_bytes);

// The daemon's mapped allocations, keyed by IPC handle bytes, each with the generation it was
// mapped at and the (model, sequence) pairs whose statistics came from it. Maps once per
// allocation; a larger generation for a known handle maps it again, a smaller one is refused.
// A mapping is released when every sequence that used it is closed (ReleaseSequence), when
// its model goes (ReleaseModel), when more than `max_mappings` are held (the least recently
// used first) and when the reader is destroyed. Thread-safe.
class DeviceReader {
 public:
  explicit DeviceReader(std::unique_ptr<DeviceMemory> memory, int max_mappings = 64)
      : memory_(std::move(memory)), max_mappings_(max_mappings < 1 ? 1 : max_mappings) {}
  DeviceReader(const DeviceReader&) = delete;
  DeviceReader& operator=(const DeviceReader&) = delete;

  // The statistic `region` names, for `sequence_id` of `model_id`: the region is checked
  // (CheckDeviceRegion), the allocation mapped (or found mapped) and the range checked against
  // its size. Errors name `field` (".cuda_ipc_handle", ".generation", ".offset_bytes", ...):
  // INVALID_ARGUMENT for a bad region or a range outside the allocation; FAILED_PRECONDITION
  // for a stale generation or a handle naming no mappable allocation, or a daemon without
  // CUDA; UNAVAILABLE when the daemon has no device.
  [[nodiscard]] absl::StatusOr<DeviceStatistic> Acquire(absl::string_view field,
                                                        const v1::DeviceBufferRegion& region,
                                                        uint64_t expected, int element_bytes,
                                                        absl::string_view model_id,
                                                        absl::string_view sequence_id);

  // The sequence no longer holds its mappings; one no other sequence holds is released.
  void ReleaseSequence(absl::string_view model_id, absl::string_view sequence_id);
  // Every sequence of the model lets go.
  void ReleaseModel(absl::string_view model_id);
  // Mappings held (for tests and the metrics).
  [[nodiscard]] int mapped() const;

 private:
  struct Entry {
    uint64_t generation = 0;
    std::shared_ptr<const DeviceMapping> mapping;
    std::vector<std::pair<std::string, std::string>> owners;  // (model, sequence)
    uint64_t last_used = 0;
  };
  // Drops entries no sequence holds and, past max_mappings_, the least recently used.
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<DeviceMemory> memory_;
  const int max_mappings_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_DEVICE_READER_H_
