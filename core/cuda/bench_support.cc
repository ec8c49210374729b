#include "core/cuda/bench_support.h"

#include <cuda_runtime.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace entrokv::cuda {
namespace {

absl::Status Call(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("bench: ", what, ": ", cudaGetErrorString(error)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCopy>> DeviceCopy::Upload(int device, const void* bytes,
                                                               int64_t size) {
  if (absl::Status status = Call(cudaSetDevice(device), "cudaSetDevice"); !status.ok()) {
    return status;
  }
  void* data = nullptr;
  if (absl::Status status = Call(cudaMalloc(&data, static_cast<size_t>(size)), "cudaMalloc");
      !status.ok()) {
    return status;
  }
  std::unique_ptr<DeviceCopy> copy(new DeviceCopy(device, static_cast<char*>(data), size));
  if (absl::Status status = Call(
          cudaMemcpy(data, bytes, static_cast<size_t>(size), cudaMemcpyHostToDevice), "cudaMemcpy");
      !status.ok()) {
    return status;
  }
  return copy;
}

DeviceCopy::~DeviceCopy() { cudaFree(data_); }

absl::StatusOr<std::vector<double>> DeviceCopy::TimeCopiesMs(int runs) const {
  if (absl::Status status = Call(cudaSetDevice(device_), "cudaSetDevice"); !status.ok()) {
    return status;
  }
  void* target = nullptr;
  if (absl::Status status = Call(cudaMalloc(&target, static_cast<size_t>(size_)), "cudaMalloc");
      !status.ok()) {
    return status;
  }
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  absl::Cleanup free = [&] {
    cudaFree(target);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  };
  auto copy = [&] {
    return cudaMemcpyAsync(target, data_, static_cast<size_t>(size_), cudaMemcpyDeviceToDevice);
  };
  if (absl::Status status = Call(copy(), "cudaMemcpyAsync"); !status.ok()) return status;
  std::vector<double> times;
  for (int run = 0; run < runs; ++run) {
    cudaEventRecord(start);
    if (absl::Status status = Call(copy(), "cudaMemcpyAsync"); !status.ok()) return status;
    cudaEventRecord(stop);
    if (absl::Status status = Call(cudaEventSynchronize(stop), "cudaEventSynchronize");
        !status.ok()) {
      return status;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  return times;
}

}  // namespace entrokv::cuda
