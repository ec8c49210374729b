// Model geometry, frame layouts and backends of a page pool (docs/architecture.md §3.9, §4).
#ifndef ENTROKV_CORE_POOL_GEOMETRY_H_
#define ENTROKV_CORE_POOL_GEOMETRY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace entrokv {

// The shape of a model's KV cache. All fields must be positive.
struct ModelGeometry {
  int layers = 0;         // L
  int query_heads = 0;    // H_Q; a multiple of kv_groups
  int kv_groups = 0;      // G = H_KV
  int head_dim = 0;       // elements per head vector
  int page_size = 16;     // B, tokens per page
  int element_bytes = 2;  // bytes per K/V element (2 for fp16/bf16)
};

// INVALID_ARGUMENT naming the field: a non-positive field, query_heads % kv_groups != 0, or a
// frame too large to address.
[[nodiscard]] absl::Status ValidateGeometry(const ModelGeometry& geometry);
// FAILED_PRECONDITION naming the layer when it is not in [0, geometry.layers).
[[nodiscard]] absl::Status CheckLayer(const ModelGeometry& geometry, int32_t layer);

// What one frame of the pool holds (docs/architecture.md §3.9).
enum class FrameLayout : uint8_t {
  kGroup,  // B tokens of K and V of one KV head of one layer; the default, exact budgets
  kLayer,  // B tokens of K and V of every KV head of one layer (the vLLM layout)
};
// "group" or "layer"; INVALID_ARGUMENT naming the value otherwise.
[[nodiscard]] absl::StatusOr<FrameLayout> ParseFrameLayout(absl::string_view name);
[[nodiscard]] absl::string_view FrameLayoutName(FrameLayout layout);

// Where the arena lives; chosen at run time.
enum class Backend : uint8_t {
  kHost,  // POSIX shared memory a worker maps by name or fd; always built
  kCuda,  // one device allocation exported by a CUDA IPC handle; built when CUDA is found
};
// "host" or "cuda"; INVALID_ARGUMENT naming the value otherwise.
[[nodiscard]] absl::StatusOr<Backend> ParseBackend(absl::string_view name);
[[nodiscard]] absl::string_view BackendName(Backend backend);

// The ranks of a pool split over devices (PagePoolOptions::devices): INVALID_ARGUMENT naming
// the field when `devices` is empty or holds a negative number, or when its size t does not
// divide kv_groups (tensor_parallel_size: each rank holds whole KV groups).
[[nodiscard]] absl::Status CheckRanks(const ModelGeometry& geometry,
                                      const std::vector<int>& devices);

// Bytes of one frame: K and V, 2 * page_size * head_dim * element_bytes, times kv_groups for
// kLayer. Byte layout of a kGroup frame: [K: B x head_dim][V: B x head_dim]; a kLayer frame is
// kv_groups such slices back to back, group g at offset g * FrameBytes(geometry, kGroup).
// REQUIRES: ValidateGeometry(geometry).ok().
[[nodiscard]] int64_t FrameBytes(const ModelGeometry& geometry, FrameLayout layout);

// A frame's index in its pool, in [0, capacity_frames).
using FrameId = int32_t;
// A block-table entry for an evicted (or never written) page.
inline constexpr FrameId kNoFrame = -1;

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_GEOMETRY_H_
