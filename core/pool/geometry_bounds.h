// The largest model geometry a pool is made for, checked where a geometry comes from outside:
// RegisterModel refuses a larger one, and recovery refuses a journal that records one (per-layer
// tables are allocated up front, sized by the geometry).
#ifndef ENTROKV_CORE_POOL_GEOMETRY_BOUNDS_H_
#define ENTROKV_CORE_POOL_GEOMETRY_BOUNDS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/pool/geometry.h"

namespace entrokv {

// INVALID_ARGUMENT naming the field ("geometry.layers: 5000 exceeds 4096"): layers and
// query_heads (so kv_groups too) at most 4096, head_dim and page_size at most 65536,
// element_bytes at most 16.
[[nodiscard]] absl::Status ValidateGeometryBounds(const ModelGeometry& geometry);

// The largest frame a pool is made of. Copy-on-write copies a frame inside one AppendTokens call
// (a shared tail page, for every unit of every layer), so a frame's size bounds what one call
// may copy; real engines' frames are KiB to a few MiB (a layer-layout frame of 64 KV heads of
// 256 dims, 64-token pages, float32: 16 MiB).
inline constexpr int64_t kMaxFrameBytes = int64_t{64} << 20;

// INVALID_ARGUMENT naming the geometry when one frame of `layout` exceeds kMaxFrameBytes.
// REQUIRES: ValidateGeometry(geometry).ok().
[[nodiscard]] absl::Status ValidateFrameBounds(const ModelGeometry& geometry, FrameLayout layout);

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_GEOMETRY_BOUNDS_H_
