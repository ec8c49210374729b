// What `entrokv bench core --scorer cuda` needs beside the scorer: the statistic in device
// memory, and the bandwidth floor it is compared with (a device-to-device copy of the same
// bytes, timed with CUDA events). Plain C++: includable without nvcc.
#ifndef ENTROKV_CORE_CUDA_BENCH_SUPPORT_H_
#define ENTROKV_CORE_CUDA_BENCH_SUPPORT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace entrokv::cuda {

// Bytes copied to device memory on `device`; freed when it goes.
class DeviceCopy {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceCopy>> Upload(int device,
                                                                          const void* bytes,
                                                                          int64_t size);
  ~DeviceCopy();
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  [[nodiscard]] const char* data() const { return data_; }

  // Milliseconds of `runs` device-to-device copies of the whole buffer, one each, timed with
  // CUDA events (after one untimed copy).
  [[nodiscard]] absl::StatusOr<std::vector<double>> TimeCopiesMs(int runs) const;

 private:
  DeviceCopy(int device, char* data, int64_t size) : device_(device), data_(data), size_(size) {}
  int device_;
  char* data_;
  int64_t size_;
};

}  // namespace entrokv::cuda

#endif  // ENTROKV_CORE_CUDA_BENCH_SUPPORT_H_
