#include "core/cuda/device.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"

namespace entrokv::cuda {

absl::StatusOr<int> DeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cuda: ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::UnavailableError("cuda: no device");
  return count;
}

absl::StatusOr<std::string> DescribeDevice(int index) {
  cudaDeviceProp properties{};
  const cudaError_t error = cudaGetDeviceProperties(&properties, index);
  if (error != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cuda: ", cudaGetErrorString(error)));
  }
  return absl::StrCat(properties.name, ", ", properties.totalGlobalMem >> 30, " GiB, sm_",
                      properties.major, properties.minor);
}

}  // namespace entrokv::cuda
