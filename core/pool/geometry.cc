#include "core/pool/geometry.h"

#include <initializer_list>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/pool/geometry_bounds.h"

namespace entrokv {
namespace {

absl::Status CheckPositive(absl::string_view field, int value) {
  if (value <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry.", field, " must be positive, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckLayer(const ModelGeometry& geometry, int32_t layer) {
  if (layer < 0 || layer >= geometry.layers) {
    return absl::FailedPreconditionError(
        absl::StrCat("layer ", layer, " is outside the model's ", geometry.layers, " layers"));
  }
  return absl::OkStatus();
}

absl::Status CheckRanks(const ModelGeometry& geometry, const std::vector<int>& devices) {
  const int ranks = static_cast<int>(devices.size());
  if (ranks == 0) return absl::InvalidArgumentError("devices: a pool needs at least one device");
  for (int rank = 0; rank < ranks; ++rank) {
    if (devices[static_cast<size_t>(rank)] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", rank,
                                                     "]: a device number is >= 0, got ",
                                                     devices[static_cast<size_t>(rank)]));
    }
  }
  if (geometry.kv_groups % ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor_parallel_size: ", ranks, " ranks do not divide geometry.kv_groups ",
                     geometry.kv_groups, " (each rank holds whole KV groups)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateGeometry(const ModelGeometry& geometry) {
  for (const auto& [field, value] : {std::pair<absl::string_view, int>{"layers", geometry.layers},
                                     {"query_heads", geometry.query_heads},
                                     {"kv_groups", geometry.kv_groups},
                                     {"head_dim", geometry.head_dim},
                                     {"page_size", geometry.page_size},
                                     {"element_bytes", geometry.element_bytes}}) {
    if (absl::Status status = CheckPositive(field, value); !status.ok()) return status;
  }
  if (geometry.query_heads % geometry.kv_groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat("geometry.query_heads (", geometry.query_heads,
                                                   ") must be a multiple of geometry.kv_groups (",
                                                   geometry.kv_groups, ")"));
  }
  // A kLayer frame must fit comfortably in int64 arithmetic (capacity * frame_bytes).
  const double layer_frame_bytes =
      2.0 * geometry.page_size * geometry.head_dim * geometry.element_bytes * geometry.kv_groups;
  if (layer_frame_bytes > static_cast<double>(int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        "geometry: a frame (page_size * head_dim * element_bytes * kv_groups) exceeds 1 TiB");
  }
  return absl::OkStatus();
}

absl::Status ValidateGeometryBounds(const ModelGeometry& geometry) {
  for (const auto& [field, value, limit] :
       {std::tuple<absl::string_view, int, int>{"geometry.layers", geometry.layers, 4096},
        {"geometry.query_heads", geometry.query_heads, 4096},
        {"geometry.head_dim", geometry.head_dim, 65536},
        {"geometry.page_size", geometry.page_size, 65536},
        {"geometry.element_bytes", geometry.element_bytes, 16}}) {
    if (value > limit) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " exceeds ", limit));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateFrameBounds(const ModelGeometry& geometry, FrameLayout layout) {
  const int64_t frame_bytes = FrameBytes(geometry, layout);
  if (frame_bytes > kMaxFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "geometry: a ", FrameLayoutName(layout), "-layout frame of 2 x page_size ",
        geometry.page_size, " x head_dim ", geometry.head_dim, " x element_bytes ",
        geometry.element_bytes,
        layout == FrameLayout::kLayer ? absl::StrCat(" x kv_groups ", geometry.kv_groups) : "",
        " is ", frame_bytes, " bytes, more than ", kMaxFrameBytes,
        " (a copy-on-write append copies whole frames)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<FrameLayout> ParseFrameLayout(absl::string_view name) {
  if (name == "group") return FrameLayout::kGroup;
  if (name == "layer") return FrameLayout::kLayer;
  return absl::InvalidArgumentError(
      absl::StrCat("frame_layout: unknown \"", name, "\", expected \"group\" or \"layer\""));
}

absl::string_view FrameLayoutName(FrameLayout layout) {
  return layout == FrameLayout::kGroup ? "group" : "layer";
}

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  if (name == "host") return Backend::kHost;
  if (name == "cuda") return Backend::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("backend: unknown \"", name, "\", expected \"host\" or \"cuda\""));
}

absl::string_view BackendName(Backend backend) {
  return backend == Backend::kHost ? "host" : "cuda";
}

int64_t FrameBytes(const ModelGeometry& geometry, FrameLayout layout) {
  const int64_t group_bytes =
      int64_t{2} * geometry.page_size * geometry.head_dim * geometry.element_bytes;
  return layout == FrameLayout::kGroup ? group_bytes : group_bytes * geometry.kv_groups;
}

}  // namespace entrokv
