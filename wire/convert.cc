#include "wire/convert.h"

#include "absl/strings/str_cat.h"
#include "wire/checks.h"

namespace entrokv::wire {
namespace {

absl::Status Unknown(absl::string_view field, int value) {
  return InvalidField(field, absl::StrCat("unknown value ", value));
}

std::string UnknownName(int value) { return absl::StrCat("unknown(", value, ")"); }

}  // namespace

v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;  // unreachable: the switch names every DType
}

v1::FrameLayout ToProto(FrameLayout layout) {
  return layout == FrameLayout::kLayer ? v1::FRAME_LAYOUT_LAYER : v1::FRAME_LAYOUT_GROUP;
}

v1::Backend ToProto(Backend backend) {
  return backend == Backend::kCuda ? v1::BACKEND_CUDA : v1::BACKEND_HOST;
}

v1::SelectionScope ToProto(SelectionScope scope) {
  return scope == SelectionScope::kLayer ? v1::SELECTION_SCOPE_LAYER : v1::SELECTION_SCOPE_GROUP;
}

v1::StatisticKind ToProto(StatisticKind kind) {
  switch (kind) {
    case StatisticKind::kLastRow:
      return v1::STATISTIC_KIND_LAST_ROW;
    case StatisticKind::kWindowMean:
      return v1::STATISTIC_KIND_WINDOW_MEAN;
    case StatisticKind::kAccumulated:
      return v1::STATISTIC_KIND_ACCUMULATED;
  }
  return v1::STATISTIC_KIND_UNSPECIFIED;  // unreachable: the switch names every kind
}

v1::ModelGeometry ToProto(const ModelGeometry& geometry) {
  v1::ModelGeometry out;
  out.set_layers(geometry.layers);
  out.set_query_heads(geometry.query_heads);
  out.set_kv_groups(geometry.kv_groups);
  out.set_head_dim(geometry.head_dim);
  out.set_page_size(geometry.page_size);
  out.set_element_bytes(geometry.element_bytes);
  return out;
}

v1::RegisterModelRequest ToRegisterRequest(absl::string_view model_id, const PoolRequest& pool) {
  v1::RegisterModelRequest request;
  request.set_model_id(std::string(model_id));
  *request.mutable_geometry() = ToProto(pool.geometry);
  request.set_capacity_bytes(pool.capacity_bytes);
  if (pool.layout.has_value()) request.set_frame_layout(ToProto(*pool.layout));
  if (pool.backend.has_value()) request.set_backend(ToProto(*pool.backend));
  return request;
}

absl::StatusOr<DType> ToDType(absl::string_view field, v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_FLOAT16:
      return DType::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    default:
      return InvalidField(field, absl::StrCat("must be FLOAT32, FLOAT16 or BFLOAT16, got ",
                                              static_cast<int>(dtype)));
  }
}

absl::StatusOr<FrameLayout> ToFrameLayout(absl::string_view field, v1::FrameLayout layout) {
  switch (layout) {
    case v1::FRAME_LAYOUT_GROUP:
      return FrameLayout::kGroup;
    case v1::FRAME_LAYOUT_LAYER:
      return FrameLayout::kLayer;
    case v1::FRAME_LAYOUT_UNSPECIFIED:
      return InvalidField(field, "unspecified");
    default:
      return Unknown(field, layout);
  }
}

absl::StatusOr<Backend> ToBackend(absl::string_view field, v1::Backend backend) {
  switch (backend) {
    case v1::BACKEND_HOST:
      return Backend::kHost;
    case v1::BACKEND_CUDA:
      return Backend::kCuda;
    case v1::BACKEND_UNSPECIFIED:
      return InvalidField(field, "unspecified");
    default:
      return Unknown(field, backend);
  }
}

absl::StatusOr<SelectionScope> ToSelectionScope(absl::string_view field, v1::SelectionScope scope) {
  switch (scope) {
    case v1::SELECTION_SCOPE_GROUP:
      return SelectionScope::kGroup;
    case v1::SELECTION_SCOPE_LAYER:
      return SelectionScope::kLayer;
    default:
      return InvalidField(
          field, absl::StrCat("unknown value ", static_cast<int>(scope),
                              ", expected SELECTION_SCOPE_GROUP or SELECTION_SCOPE_LAYER"));
  }
}

ModelGeometry ToGeometry(const v1::ModelGeometry& geometry) {
  ModelGeometry out;
  out.layers = geometry.layers();
  out.query_heads = geometry.query_heads();
  out.kv_groups = geometry.kv_groups();
  out.head_dim = geometry.head_dim();
  out.page_size = geometry.page_size();
  out.element_bytes = geometry.element_bytes();
  return out;
}

std::string LayoutName(v1::FrameLayout layout) {
  if (layout == v1::FRAME_LAYOUT_UNSPECIFIED) return "default";
  const absl::StatusOr<FrameLayout> core = ToFrameLayout("frame_layout", layout);
  return core.ok() ? std::string(FrameLayoutName(*core)) : UnknownName(layout);
}

std::string BackendName(v1::Backend backend) {
  if (backend == v1::BACKEND_UNSPECIFIED) return "default";
  const absl::StatusOr<Backend> core = ToBackend("backend", backend);
  return core.ok() ? std::string(entrokv::BackendName(*core)) : UnknownName(backend);
}

std::string ScopeName(v1::SelectionScope scope) {
  if (scope == v1::SELECTION_SCOPE_UNSPECIFIED) return "auto";
  const absl::StatusOr<SelectionScope> core = ToSelectionScope("scope", scope);
  return core.ok() ? std::string(SelectionScopeName(*core)) : UnknownName(scope);
}

}  // namespace entrokv::wire
