#include "core/pool/arena.h"

namespace entrokv {

absl::StatusOr<std::unique_ptr<MemoryArena>> CreateArena(Backend backend, absl::string_view name,
                                                         int64_t bytes, const HostArenaSource& host,
                                                         int device) {
  switch (backend) {
    case Backend::kHost:
      return CreateHostArena(name, bytes, host);
    case Backend::kCuda:
      return CreateCudaArena(name, bytes, device);
  }
  return absl::InvalidArgumentError("backend: unknown value");
}

#ifndef ENTROKV_POOL_HAVE_CUDA
// Without CUDA at build time the backend exists in the API but not in the binary.
absl::StatusOr<std::unique_ptr<MemoryArena>> CreateCudaArena(absl::string_view, int64_t, int) {
  return absl::UnimplementedError("backend: cuda was not built in");
}
#endif

}  // namespace entrokv
