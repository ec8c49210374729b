// Host-side view of the CUDA runtime: plain C++, includable without nvcc.
#ifndef ENTROKV_CORE_CUDA_DEVICE_H_
#define ENTROKV_CORE_CUDA_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"

namespace entrokv::cuda {

// The number of usable CUDA devices; UNAVAILABLE (with the runtime's reason) when there is no
// driver or no device, which is the normal case on CPU-only machines.
[[nodiscard]] absl::StatusOr<int> DeviceCount();

// "NVIDIA H200, 139 GiB, sm_90" for device `index`.
[[nodiscard]] absl::StatusOr<std::string> DescribeDevice(int index);

}  // namespace entrokv::cuda

#endif  // ENTROKV_CORE_CUDA_DEVICE_H_
