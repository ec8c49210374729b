// Another process's device memory, mapped by its CUDA IPC handle: plain C++, includable without
// nvcc or the CUDA headers (the daemon reads statistics that stay on a worker's GPU through it).
#ifndef ENTROKV_CORE_CUDA_IPC_H_
#define ENTROKV_CORE_CUDA_IPC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/cuda/memory.h"  // kIpcHandleBytes

namespace entrokv::cuda {

// An allocation of another process mapped into this one.
struct IpcMapping {
  int device = 0;
  void* base = nullptr;  // the allocation's base in this process
  uint64_t bytes = 0;    // the allocation's size, as the driver reports it
};

// Maps the allocation `handle` (the bytes of a cudaIpcMemHandle_t) names on `device`
// (cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess) and learns its size; restores the
// caller's current device. Messages start with `who`. INVALID_ARGUMENT for a handle that is not
// kIpcHandleBytes long or a device not in [0, count); UNAVAILABLE when there is no driver or
// device; FAILED_PRECONDITION when the handle names no allocation this process can map (freed,
// its process gone, this process's own, or not a handle at all); INTERNAL otherwise.
[[nodiscard]] absl::StatusOr<IpcMapping> OpenIpcHandle(absl::string_view who,
                                                       absl::string_view handle, int device);

// Unmaps (cudaIpcCloseMemHandle), restoring the caller's current device. Errors are ignored
// (teardown: the exporting process may be gone).
void CloseIpcHandle(const IpcMapping& mapping);

// Copies `bytes` from `src` (device memory on `device`) to host memory `dst` and waits for the
// copy; FAILED_PRECONDITION naming `who` when the runtime refuses it (the memory behind a
// mapping of an exited process), INTERNAL for other errors.
[[nodiscard]] absl::Status CopyDeviceToHost(absl::string_view who, int device, void* dst,
                                            const void* src, uint64_t bytes);

}  // namespace entrokv::cuda

#endif  // ENTROKV_CORE_CUDA_IPC_H_
