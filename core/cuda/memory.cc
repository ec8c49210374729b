#include "core/cuda/memory.h"

#include <cuda_runtime.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace entrokv::cuda {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);

absl::Status CudaError(const std::string& who, absl::string_view call, cudaError_t error) {
  const std::string message = absl::StrCat(who, ": ", call, ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::Status Copy(const std::string& who, void* dst, const void* src, int64_t bytes,
                  cudaMemcpyKind kind) {
  const cudaError_t error = cudaMemcpy(dst, src, static_cast<size_t>(bytes), kind);
  if (error != cudaSuccess) return CudaError(who, "cudaMemcpy", error);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SharedAllocation> AllocateShared(const std::string& who, int64_t bytes, int device) {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("backend: cuda has no usable device: ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::UnavailableError("backend: cuda has no device");
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("device: CUDA device ", device,
                                                   " does not exist (this host has ", count,
                                                   " device", count == 1 ? "" : "s", ")"));
  }
  int previous = 0;
  if (const cudaError_t error = cudaGetDevice(&previous); error != cudaSuccess) {
    return CudaError(who, "cudaGetDevice", error);
  }
  if (const cudaError_t error = cudaSetDevice(device); error != cudaSuccess) {
    return CudaError(who, absl::StrCat("cudaSetDevice(", device, ")"), error);
  }
  absl::Cleanup restore = [previous] { cudaSetDevice(previous); };
  SharedAllocation allocation;
  allocation.device = device;
  if (const cudaError_t error = cudaMalloc(&allocation.data, static_cast<size_t>(bytes));
      error != cudaSuccess) {
    return CudaError(who, absl::StrCat("cudaMalloc(", bytes, " bytes on device ", device, ")"),
                     error);
  }
  cudaIpcMemHandle_t handle{};
  if (const cudaError_t error = cudaIpcGetMemHandle(&handle, allocation.data);
      error != cudaSuccess) {
    cudaFree(allocation.data);
    return CudaError(who, "cudaIpcGetMemHandle", error);
  }
  allocation.ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  return allocation;
}

void FreeShared(int device, void* data) {
  int previous = 0;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device) cudaSetDevice(device);
  cudaFree(data);
  if (previous != device) cudaSetDevice(previous);
}

absl::Status CopyOnDevice(const std::string& who, void* dst, const void* src, int64_t bytes) {
  return Copy(who, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) {
  return Copy("cuda", dst, src, bytes, cudaMemcpyHostToDevice);
}

absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) {
  return Copy("cuda", dst, src, bytes, cudaMemcpyDeviceToHost);
}

}  // namespace entrokv::cuda
