#include "service/validation.h"

#include <cmath>
#include <limits>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/pool/geometry_bounds.h"
#include "core/util/status_macros.h"

namespace entrokv::service {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

std::string EchoInput(absl::string_view input) {
  if (input.size() <= kMaxEchoedChars) return std::string(input);
  return absl::StrCat(input.substr(0, kMaxEchoedChars), "...");
}

absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

absl::Status ValidateId(absl::string_view field, absl::string_view id) {
  if (id.empty()) return Invalid(field, "must not be empty");
  if (id.size() > kMaxIdLength) {
    return Invalid(field, absl::StrCat("longer than ", kMaxIdLength, " characters"));
  }
  for (const char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '/' && c != '-') {
      return Invalid(field, "may hold only [A-Za-z0-9._:/-]");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTokenCount(absl::string_view field, int64_t tokens, int64_t min_tokens) {
  if (tokens < min_tokens || tokens > kMaxSequenceTokens) {
    return Invalid(field, absl::StrCat("must be in [", min_tokens, ", ", kMaxSequenceTokens,
                                       "], got ", tokens));
  }
  return absl::OkStatus();
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
      return Invalid(field, absl::StrCat("must be FLOAT32, FLOAT16 or BFLOAT16, got ",
                                         static_cast<int>(dtype)));
  }
}

v1::FrameLayout ToProto(FrameLayout layout) {
  return layout == FrameLayout::kGroup ? v1::FRAME_LAYOUT_GROUP : v1::FRAME_LAYOUT_LAYER;
}

v1::Backend ToProto(Backend backend) {
  return backend == Backend::kHost ? v1::BACKEND_HOST : v1::BACKEND_CUDA;
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

CacheLimits ToCacheLimits(const ServerOptions& options) {
  return CacheLimits{.max_sequences_per_model = options.max_sequences_per_model,
                     .max_sequence_bookkeeping_bytes = options.max_sequence_bookkeeping_bytes,
                     .max_model_bookkeeping_bytes = options.max_model_bookkeeping_bytes};
}

absl::StatusOr<CacheOptions> ToCacheOptions(const v1::RegisterModelRequest& request,
                                            const ServerOptions& defaults) {
  RETURN_IF_ERROR(ValidateId("model_id", request.model_id()));
  if (!request.has_geometry()) return Invalid("geometry", "must be set");
  CacheOptions options;
  options.limits = ToCacheLimits(defaults);
  const v1::ModelGeometry& g = request.geometry();
  options.geometry.layers = g.layers();
  options.geometry.query_heads = g.query_heads();
  options.geometry.kv_groups = g.kv_groups();
  options.geometry.head_dim = g.head_dim();
  options.geometry.page_size = g.page_size();
  options.geometry.element_bytes = g.element_bytes();
  RETURN_IF_ERROR(ValidateGeometry(options.geometry));
  RETURN_IF_ERROR(ValidateGeometryBounds(options.geometry));
  switch (request.frame_layout()) {
    case v1::FRAME_LAYOUT_UNSPECIFIED:
      options.layout = defaults.frame_layout;
      break;
    case v1::FRAME_LAYOUT_GROUP:
      options.layout = FrameLayout::kGroup;
      break;
    case v1::FRAME_LAYOUT_LAYER:
      options.layout = FrameLayout::kLayer;
      break;
    default:
      return Invalid("frame_layout", absl::StrCat("unknown value ", request.frame_layout()));
  }
  switch (request.backend()) {
    case v1::BACKEND_UNSPECIFIED:
      options.backend = defaults.backend;
      break;
    case v1::BACKEND_HOST:
      options.backend = Backend::kHost;
      break;
    case v1::BACKEND_CUDA:
      options.backend = Backend::kCuda;
      break;
    default:
      return Invalid("backend", absl::StrCat("unknown value ", request.backend()));
  }
  const uint64_t asked = request.capacity_bytes() == 0
                             ? static_cast<uint64_t>(defaults.pool_capacity_bytes)
                             : request.capacity_bytes();
  if (asked > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Invalid("capacity_bytes", "too large");
  }
  const int64_t frame_bytes = FrameBytes(options.geometry, options.layout);
  // Reserve whole frames only, so the daemon's capacity accounting matches the arena.
  options.capacity_bytes = static_cast<int64_t>(asked) / frame_bytes * frame_bytes;
  if (options.capacity_bytes == 0) {
    return Invalid("capacity_bytes",
                   absl::StrCat(asked, " bytes hold no frame of ", frame_bytes, " bytes"));
  }
  options.name = request.model_id();
  return options;
}

absl::StatusOr<ResolvedPolicy> ResolvePolicy(const v1::PolicyParams& params,
                                             const ServerOptions& defaults, int page_size) {
  ResolvedPolicy resolved;
  const std::string& name = params.name().empty() ? defaults.policy : params.name();
  absl::StatusOr<const Policy*> policy = FindPolicy(name);
  if (!policy.ok()) {
    return Invalid("policy.name", absl::StrCat("'", EchoInput(name), "' is not one of ",
                                               absl::StrJoin(PolicyNames(), ", ")));
  }
  resolved.policy = *policy;
  resolved.options = DefaultPolicyOptions(defaults);
  resolved.options.page_size = page_size;
  if (params.has_tau()) {
    if (!(params.tau() > 0) || !std::isfinite(params.tau())) {
      return Invalid("policy.tau", absl::StrCat("must be finite and > 0, got ", params.tau()));
    }
    resolved.options.tau = params.tau();
  }
  if (params.has_alpha()) {
    if (!(params.alpha() > 0)) {
      return Invalid("policy.alpha", absl::StrCat("must be > 0, got ", params.alpha()));
    }
    resolved.options.alpha = params.alpha();
  }
  if (params.has_sink_tokens()) {
    if (params.sink_tokens() < 0) {
      return Invalid("policy.sink_tokens",
                     absl::StrCat("must be >= 0, got ", params.sink_tokens()));
    }
    resolved.options.sink_tokens = params.sink_tokens();
  }
  if (params.has_protect_tail_page()) {
    resolved.options.protections.tail_page = params.protect_tail_page();
  }
  if (params.has_protect_sink_pages()) {
    resolved.options.protections.sink_pages = params.protect_sink_pages();
  }
  if (params.has_protect_recent_pages()) {
    if (params.protect_recent_pages() < 0) {
      return Invalid("policy.protect_recent_pages",
                     absl::StrCat("must be >= 0, got ", params.protect_recent_pages()));
    }
    resolved.options.protections.recent_pages = params.protect_recent_pages();
  }
  RETURN_IF_ERROR(Annotate(ValidatePolicyOptions(resolved.options), "policy"));
  return resolved;
}

absl::StatusOr<SelectionScope> ResolveScope(v1::SelectionScope scope, const ServerOptions& defaults,
                                            FrameLayout layout) {
  switch (scope) {
    case v1::SELECTION_SCOPE_GROUP:
      return SelectionScope::kGroup;
    case v1::SELECTION_SCOPE_LAYER:
      return SelectionScope::kLayer;
    case v1::SELECTION_SCOPE_UNSPECIFIED:
      switch (defaults.selection_scope) {
        case ScopeSetting::kGroup:
          return SelectionScope::kGroup;
        case ScopeSetting::kLayer:
          return SelectionScope::kLayer;
        case ScopeSetting::kAuto:
          break;
      }
      return layout == FrameLayout::kLayer ? SelectionScope::kLayer : SelectionScope::kGroup;
    default:
      return Invalid("policy.scope",
                     absl::StrCat("unknown value ", static_cast<int>(scope),
                                  ", expected SELECTION_SCOPE_GROUP or SELECTION_SCOPE_LAYER"));
  }
}

v1::SelectionScope ToProto(SelectionScope scope) {
  return scope == SelectionScope::kLayer ? v1::SELECTION_SCOPE_LAYER : v1::SELECTION_SCOPE_GROUP;
}

absl::StatusOr<ResolvedBudget> ResolveBudget(const v1::Budget& budget, bool has_budget,
                                             const ModelGeometry& geometry, int64_t tokens) {
  if (!has_budget || budget.kind_case() == v1::Budget::KIND_NOT_SET) {
    return Invalid("budget", "one of pages_per_group, fraction, token_slots must be set");
  }
  ResolvedBudget resolved;
  if (budget.kind_case() == v1::Budget::kPagesPerGroup) {
    if (budget.pages_per_group() < 1) {
      return Invalid("budget.pages_per_group",
                     absl::StrCat("must be >= 1, got ", budget.pages_per_group()));
    }
    resolved.pages_per_layer.assign(geometry.layers, budget.pages_per_group());
    return resolved;
  }
  BudgetRequest request;
  request.layers = geometry.layers;
  request.kv_groups = geometry.kv_groups;
  request.page_size = geometry.page_size;
  request.tokens = tokens;
  if (!budget.allocator().empty()) {
    // Parsed as echoed: a name cut by EchoInput is never an allocator's, and the message then
    // repeats at most kMaxEchoedChars of it.
    absl::StatusOr<LayerAllocator> allocator = ParseLayerAllocator(EchoInput(budget.allocator()));
    if (!allocator.ok()) return Invalid("budget.allocator", allocator.status().message());
    request.allocator = *allocator;
  }
  if (budget.kind_case() == v1::Budget::kFraction) {
    if (!(budget.fraction() > 0) || budget.fraction() > 1) {
      return Invalid("budget.fraction", absl::StrCat("must be in (0, 1], got ", budget.fraction()));
    }
    request.fraction = budget.fraction();
  } else {
    if (budget.token_slots() < 1) {
      return Invalid("budget.token_slots",
                     absl::StrCat("must be >= 1, got ", budget.token_slots()));
    }
    request.token_slots = budget.token_slots();
  }
  absl::StatusOr<BudgetPlan> plan = PlanBudget(request);
  if (!plan.ok()) return Annotate(plan.status(), "budget");
  resolved.pages_per_layer = std::move(plan->pages_per_layer);
  return resolved;
}

}  // namespace entrokv::service
