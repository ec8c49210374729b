// The cuda backend: one cudaMalloc region on the current device, exported with
// cudaIpcGetMemHandle so a worker process can cudaIpcOpenMemHandle it. Compiled only when
// ENTROKV_CUDA is on; plain C++ against the CUDA runtime API, no kernels.
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/pool/arena.h"

namespace entrokv {
namespace {

absl::Status CudaError(absl::string_view call, cudaError_t error) {
  const std::string message = absl::StrCat("cuda arena: ", call, ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

class CudaArena final : public MemoryArena {
 public:
  CudaArena(int device, void* data, int64_t bytes, std::string handle)
      : device_(device), data_(data), bytes_(bytes), handle_(std::move(handle)) {}
  ~CudaArena() override {
    int previous = 0;
    if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) cudaSetDevice(device_);
    cudaFree(data_);
    if (previous != device_) cudaSetDevice(previous);
  }
  CudaArena(const CudaArena&) = delete;
  CudaArena& operator=(const CudaArena&) = delete;

  ArenaInfo info() const override {
    ArenaInfo info;
    info.backend = Backend::kCuda;
    info.bytes = bytes_;
    info.ipc_handle = handle_;
    info.device = device_;
    return info;
  }
  void* base() const override { return data_; }
  absl::Status Copy(int64_t dst_offset, int64_t src_offset, int64_t bytes) override {
    char* base = static_cast<char*>(data_);
    const cudaError_t error = cudaMemcpy(base + dst_offset, base + src_offset,
                                         static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice);
    if (error != cudaSuccess) return CudaError("cudaMemcpy", error);
    return absl::OkStatus();
  }

 private:
  int device_;
  void* data_;
  int64_t bytes_;
  std::string handle_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryArena>> CreateCudaArena(absl::string_view name,
                                                             int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("arena bytes must be positive, got ", bytes));
  }
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("backend: cuda has no usable device: ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::UnavailableError("backend: cuda has no device");
  int device = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) {
    return CudaError("cudaGetDevice", error);
  }
  void* data = nullptr;
  if (const cudaError_t error = cudaMalloc(&data, static_cast<size_t>(bytes));
      error != cudaSuccess) {
    return CudaError(absl::StrCat("cudaMalloc(", bytes, " bytes)"), error);
  }
  cudaIpcMemHandle_t handle{};
  if (const cudaError_t error = cudaIpcGetMemHandle(&handle, data); error != cudaSuccess) {
    cudaFree(data);
    return CudaError("cudaIpcGetMemHandle", error);
  }
  return std::unique_ptr<MemoryArena>(new CudaArena(
      device, data, bytes, std::string(reinterpret_cast<const char*>(&handle), sizeof(handle))));
}

}  // namespace entrokv
