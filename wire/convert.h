// The wire <-> core translations of the contract's enums and of the model geometry, and the
// names people read for the wire's enums. Every program that speaks the contract (entrokvd, the
// CLI, the C++ client, the load generator) converts here, so the two sides cannot drift apart.
//
// Core -> wire is total. Wire -> core refuses, with INVALID_ARGUMENT naming the field, both
// UNSPECIFIED and any value the contract does not define (a newer peer's, or garbage): never a
// silent default. Where UNSPECIFIED means "the daemon's default", resolve.h decides first.
#ifndef ENTROKV_WIRE_CONVERT_H_
#define ENTROKV_WIRE_CONVERT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/pool/geometry.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/statistic.h"
#include "core/util/dtype.h"
#include "entrokv/v1/cache_manager.pb.h"
#include "entrokv/v1/types.pb.h"

namespace entrokv::wire {

[[nodiscard]] v1::DType ToProto(DType dtype);
[[nodiscard]] v1::FrameLayout ToProto(FrameLayout layout);
[[nodiscard]] v1::Backend ToProto(Backend backend);
[[nodiscard]] v1::SelectionScope ToProto(SelectionScope scope);
[[nodiscard]] v1::StatisticKind ToProto(StatisticKind kind);
[[nodiscard]] v1::ModelGeometry ToProto(const ModelGeometry& geometry);

// A pool as a client asks for one; what it leaves unset takes the daemon's defaults.
struct PoolRequest {
  ModelGeometry geometry;
  uint64_t capacity_bytes = 0;        // 0: --pool_capacity_bytes
  std::optional<FrameLayout> layout;  // nullopt: --frame_layout
  std::optional<Backend> backend;     // nullopt: --backend
};
// The RegisterModel request for `pool` under `model_id` (ResolvePool reads it back).
[[nodiscard]] v1::RegisterModelRequest ToRegisterRequest(absl::string_view model_id,
                                                         const PoolRequest& pool);

// "<field>: must be FLOAT32, FLOAT16 or BFLOAT16, got N" otherwise.
[[nodiscard]] absl::StatusOr<DType> ToDType(absl::string_view field, v1::DType dtype);
// "<field>: unknown value N" for a value outside the contract, "<field>: unspecified" for 0.
[[nodiscard]] absl::StatusOr<FrameLayout> ToFrameLayout(absl::string_view field,
                                                        v1::FrameLayout layout);
[[nodiscard]] absl::StatusOr<Backend> ToBackend(absl::string_view field, v1::Backend backend);
// "<field>: unknown value N, expected SELECTION_SCOPE_GROUP or SELECTION_SCOPE_LAYER".
[[nodiscard]] absl::StatusOr<SelectionScope> ToSelectionScope(absl::string_view field,
                                                              v1::SelectionScope scope);
// Field by field; not checked (ValidateGeometry does that).
[[nodiscard]] ModelGeometry ToGeometry(const v1::ModelGeometry& geometry);

// The core's names ("group" | "layer", "host" | "cuda"). An unspecified layout or backend is
// "default" (the daemon's), an unspecified scope "auto" (the pool's, or the daemon's
// --selection_scope); a value outside the contract is "unknown(N)".
[[nodiscard]] std::string LayoutName(v1::FrameLayout layout);
[[nodiscard]] std::string BackendName(v1::Backend backend);
[[nodiscard]] std::string ScopeName(v1::SelectionScope scope);

}  // namespace entrokv::wire

#endif  // ENTROKV_WIRE_CONVERT_H_
