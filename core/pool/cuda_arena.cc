// The cuda backend: one cudaMalloc region on the pool's device, exported with
// cudaIpcGetMemHandle so a worker process can cudaIpcOpenMemHandle it. Compiled only when
// ENTROKV_CUDA is on; the CUDA runtime calls live behind core/cuda/memory.h.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/cuda/memory.h"
#include "core/pool/arena.h"
#include "core/util/status_macros.h"

namespace entrokv {
namespace {

constexpr char kWho[] = "cuda arena";

class CudaArena final : public MemoryArena {
 public:
  CudaArena(int device, void* data, int64_t bytes, std::string handle)
      : device_(device), data_(data), bytes_(bytes), handle_(std::move(handle)) {}
  ~CudaArena() override { cuda::FreeShared(device_, data_); }
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
    return cuda::CopyOnDevice(kWho, base + dst_offset, base + src_offset, bytes);
  }

 private:
  int device_;
  void* data_;
  int64_t bytes_;
  std::string handle_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryArena>> CreateCudaArena(absl::string_view name, int64_t bytes,
                                                             int device) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("arena bytes must be positive, got ", bytes));
  }
  ASSIGN_OR_RETURN(cuda::SharedAllocation allocation, cuda::AllocateShared(kWho, bytes, device));
  return std::unique_ptr<MemoryArena>(
      new CudaArena(allocation.device, allocation.data, bytes, std::move(allocation.ipc_handle)));
}

}  // namespace entrokv
