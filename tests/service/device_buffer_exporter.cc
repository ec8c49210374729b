// A worker's side of a device_buffer statistic, for device_buffer_gpu_test: cudaMallocs BYTES
// on DEVICE, fills them with the float32 values ExporterValue(i), prints
//   handle <128 hex digits> bytes <BYTES>
// and then obeys one command a line on stdin: "free" frees the allocation (prints "freed"),
// "exit" or the end of stdin exits without freeing (the process's exit frees it).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "tests/service/device_buffer_values.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: device_buffer_exporter BYTES [DEVICE]\n");
    return 2;
  }
  const size_t bytes = std::strtoull(argv[1], nullptr, 10);
  const int device = argc > 2 ? std::atoi(argv[2]) : 0;
  if (cudaSetDevice(device) != cudaSuccess) return 3;
  void* data = nullptr;
  if (cudaMalloc(&data, bytes) != cudaSuccess) return 4;
  std::vector<float> values(bytes / sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) values[i] = entrokv::testing::ExporterValue(i);
  if (cudaMemcpy(data, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice) !=
      cudaSuccess) {
    return 5;
  }
  cudaIpcMemHandle_t handle{};
  if (cudaIpcGetMemHandle(&handle, data) != cudaSuccess) return 6;
  std::printf("handle ");
  for (size_t i = 0; i < sizeof(handle); ++i) {
    std::printf("%02x", static_cast<unsigned char>(handle.reserved[i]));
  }
  std::printf(" bytes %zu\n", bytes);
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "free") {
      cudaFree(data);
      std::printf("freed\n");
      std::fflush(stdout);
    } else if (line == "exit") {
      break;
    }
  }
  return 0;
}
