// Request checks and conversions from the wire types, all before any state changes. Every
// error is INVALID_ARGUMENT (or the code named below) with the offending field in the message.
#ifndef ENTROKV_SERVICE_VALIDATION_H_
#define ENTROKV_SERVICE_VALIDATION_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/pool/cache_state.h"
#include "core/scoring/budget.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/policy.h"
#include "core/util/dtype.h"
#include "entrokv/v1/cache_manager.pb.h"
#include "service/options.h"

namespace entrokv::service {

inline constexpr int kMaxIdLength = 128;

// Non-empty, at most 128 characters of [A-Za-z0-9._:/-].
[[nodiscard]] absl::Status ValidateId(absl::string_view field, absl::string_view id);

// A token count in [min_tokens, kMaxSequenceTokens] (the one bound on a sequence's length, so
// every handler agrees on it); INVALID_ARGUMENT naming `field` otherwise.
[[nodiscard]] absl::Status ValidateTokenCount(absl::string_view field, int64_t tokens,
                                              int64_t min_tokens);

// The bookkeeping bounds of every model (--max_sequences_per_model and the
// --max_*_bookkeeping_bytes flags).
[[nodiscard]] CacheLimits ToCacheLimits(const ServerOptions& options);

// The pool a RegisterModel asks for, with the daemon's defaults and limits filled in.
[[nodiscard]] absl::StatusOr<CacheOptions> ToCacheOptions(const v1::RegisterModelRequest& request,
                                                          const ServerOptions& defaults);

[[nodiscard]] absl::StatusOr<DType> ToDType(absl::string_view field, v1::DType dtype);
[[nodiscard]] v1::FrameLayout ToProto(FrameLayout layout);
[[nodiscard]] v1::Backend ToProto(Backend backend);
[[nodiscard]] v1::ModelGeometry ToProto(const ModelGeometry& geometry);

// The policy and its options for one request: the daemon's defaults overridden by `params`.
struct ResolvedPolicy {
  const Policy* policy = nullptr;
  PolicyOptions options;
};
[[nodiscard]] absl::StatusOr<ResolvedPolicy> ResolvePolicy(const v1::PolicyParams& params,
                                                           const ServerOptions& defaults,
                                                           int page_size);

// The scope of one decision: `scope` when set, else the daemon's --selection_scope, else the
// pool's own (layer for the LAYER layout, group otherwise). INVALID_ARGUMENT naming
// policy.scope for a value the contract does not define.
[[nodiscard]] absl::StatusOr<SelectionScope> ResolveScope(v1::SelectionScope scope,
                                                          const ServerOptions& defaults,
                                                          FrameLayout layout);
[[nodiscard]] v1::SelectionScope ToProto(SelectionScope scope);

// Page quotas for every layer of a model, for a sequence of `tokens` tokens.
struct ResolvedBudget {
  std::vector<int64_t> pages_per_layer;  // K_l, indexed by layer
};
[[nodiscard]] absl::StatusOr<ResolvedBudget> ResolveBudget(const v1::Budget& budget,
                                                           bool has_budget,
                                                           const ModelGeometry& geometry,
                                                           int64_t tokens);

// At most the first 200 characters of client input, with "..." when cut: error messages echo
// what they refuse, and an unbounded echo would turn the error into an oversized trailer.
inline constexpr size_t kMaxEchoedChars = 200;
[[nodiscard]] std::string EchoInput(absl::string_view input);

// Same code, message prefixed with "<prefix>: ".
[[nodiscard]] absl::Status Annotate(const absl::Status& status, absl::string_view prefix);

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_VALIDATION_H_
