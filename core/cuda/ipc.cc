#include "core/cuda/ipc.h"

#include <cuda.h>  // the driver's types only: its one call is reached through the runtime
#include <cuda_runtime.h>

#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace entrokv::cuda {
namespace {

// cuMemGetAddressRange, reached through cudaGetDriverEntryPointByVersion so that nothing links
// libcuda itself (binaries then load on machines without a driver and say so at run time).
using AddressRangeFn = CUresult (*)(CUdeviceptr* base, size_t* size, CUdeviceptr pointer);

absl::Status Failed(absl::string_view who, absl::string_view call, cudaError_t error) {
  cudaGetLastError();  // a failed call leaves the error for the next query: clear it
  const std::string message = absl::StrCat(who, ": ", call, ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::UnavailableError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorMapBufferObjectFailed:
    case cudaErrorDeviceUninitialized:
    case cudaErrorAlreadyMapped:
    case cudaErrorIllegalAddress:
    case cudaErrorPeerAccessUnsupported:
    case cudaErrorNotSupported:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

// The size of the allocation `pointer` is in, from the driver.
absl::StatusOr<uint64_t> AllocationBytes(absl::string_view who, void* pointer) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &entry, 12000,
                                                             cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || entry == nullptr) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrCat(who,
                     ": the driver offers no cuMemGetAddressRange, so the mapped "
                     "allocation's size cannot be checked"));
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult result =
      reinterpret_cast<AddressRangeFn>(entry)(&base, &size, reinterpret_cast<CUdeviceptr>(pointer));
  if (result != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": cuMemGetAddressRange on the mapped allocation failed (CUresult ",
                     static_cast<int>(result), ")"));
  }
  // Bytes from the mapped pointer to the allocation's end (the pointer is the base for a
  // cudaMalloc allocation; this stays right if a driver maps inside a larger range).
  const uint64_t offset = reinterpret_cast<CUdeviceptr>(pointer) - base;
  return offset <= size ? size - offset : 0;
}

}  // namespace

absl::StatusOr<IpcMapping> OpenIpcHandle(absl::string_view who, absl::string_view handle,
                                         int device) {
  if (handle.size() != static_cast<size_t>(kIpcHandleBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": an IPC handle is ", kIpcHandleBytes, " bytes, got ", handle.size()));
  }
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat(who, ": no usable CUDA device here: ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::UnavailableError(absl::StrCat(who, ": no CUDA device here"));
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": CUDA device ", device,
                                                   " does not exist (this host has ", count,
                                                   " device", count == 1 ? "" : "s", ")"));
  }
  int previous = 0;
  if (const cudaError_t error = cudaGetDevice(&previous); error != cudaSuccess) {
    return Failed(who, "cudaGetDevice", error);
  }
  if (const cudaError_t error = cudaSetDevice(device); error != cudaSuccess) {
    return Failed(who, absl::StrCat("cudaSetDevice(", device, ")"), error);
  }
  absl::Cleanup restore = [previous] { cudaSetDevice(previous); };
  cudaIpcMemHandle_t ipc{};
  std::memcpy(&ipc, handle.data(), sizeof(ipc));
  IpcMapping mapping;
  mapping.device = device;
  if (const cudaError_t error =
          cudaIpcOpenMemHandle(&mapping.base, ipc, cudaIpcMemLazyEnablePeerAccess);
      error != cudaSuccess) {
    return Failed(who,
                  "cudaIpcOpenMemHandle (the handle names no allocation this daemon can map: "
                  "freed, its process gone, or not an IPC handle)",
                  error);
  }
  absl::StatusOr<uint64_t> bytes = AllocationBytes(who, mapping.base);
  if (!bytes.ok()) {
    cudaIpcCloseMemHandle(mapping.base);
    return bytes.status();
  }
  mapping.bytes = *bytes;
  return mapping;
}

void CloseIpcHandle(const IpcMapping& mapping) {
  if (mapping.base == nullptr) return;
  int previous = 0;
  const bool known = cudaGetDevice(&previous) == cudaSuccess;
  if (known && previous != mapping.device) cudaSetDevice(mapping.device);
  cudaIpcCloseMemHandle(mapping.base);
  cudaGetLastError();
  if (known && previous != mapping.device) cudaSetDevice(previous);
}

absl::Status CopyDeviceToHost(absl::string_view who, int device, void* dst, const void* src,
                              uint64_t bytes) {
  int previous = 0;
  if (const cudaError_t error = cudaGetDevice(&previous); error != cudaSuccess) {
    return Failed(who, "cudaGetDevice", error);
  }
  if (previous != device) {
    if (const cudaError_t error = cudaSetDevice(device); error != cudaSuccess) {
      return Failed(who, absl::StrCat("cudaSetDevice(", device, ")"), error);
    }
  }
  absl::Cleanup restore = [previous, device] {
    if (previous != device) cudaSetDevice(previous);
  };
  if (const cudaError_t error =
          cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost);
      error != cudaSuccess) {
    return Failed(who, "cudaMemcpy (device to host)", error);
  }
  return absl::OkStatus();
}

}  // namespace entrokv::cuda
