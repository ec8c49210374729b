// Device memory for the cuda page pool (core/pool/cuda_arena.cc): plain C++, includable without
// nvcc or the CUDA headers, so the CUDA runtime stays inside core/cuda/.
#ifndef ENTROKV_CORE_CUDA_MEMORY_H_
#define ENTROKV_CORE_CUDA_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace entrokv::cuda {

// One cudaMalloc region on a given device with its IPC handle (the bytes of a
// cudaIpcMemHandle_t), so another process can cudaIpcOpenMemHandle it.
inline constexpr int kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t), checked in memory.cc
struct SharedAllocation {
  int device = 0;
  void* data = nullptr;
  std::string ipc_handle;
};

// Allocates on `device` and restores the caller's current device. UNAVAILABLE when there is
// no driver or device; INVALID_ARGUMENT naming the device when it is not in [0, count);
// RESOURCE_EXHAUSTED when the device is full; INTERNAL for other runtime errors. Messages
// start with `who`.
[[nodiscard]] absl::StatusOr<SharedAllocation> AllocateShared(const std::string& who, int64_t bytes,
                                                              int device);

// Frees `data` on `device`, restoring the caller's current device. Errors are ignored (teardown).
void FreeShared(int device, void* data);

// cudaMemcpy within, into, and out of device memory; INTERNAL naming `who` on failure.
[[nodiscard]] absl::Status CopyOnDevice(const std::string& who, void* dst, const void* src,
                                        int64_t bytes);
[[nodiscard]] absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes);
[[nodiscard]] absl::Status CopyToHost(void* dst, const void* src, int64_t bytes);

}  // namespace entrokv::cuda

#endif  // ENTROKV_CORE_CUDA_MEMORY_H_
