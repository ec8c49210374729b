// The largest model geometry a pool is made for, checked where a geometry comes from outside:
// RegisterModel refuses a larger one, and recovery refuses a journal that records one (per-layer
// tables are allocated up front, sized by the geometry).
#ifndef ENTROKV_CORE_POOL_GEOMETRY_BOUNDS_H_
#define ENTROKV_CORE_POOL_GEOMETRY_BOUNDS_H_

#include "absl/status/status.h"
#include "core/pool/geometry.h"

namespace entrokv {

// INVALID_ARGUMENT naming the field ("geometry.layers: 5000 exceeds 4096"): layers and
// query_heads (so kv_groups too) at most 4096, head_dim and page_size at most 65536,
// element_bytes at most 16.
[[nodiscard]] absl::Status ValidateGeometryBounds(const ModelGeometry& geometry);

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_GEOMETRY_BOUNDS_H_
