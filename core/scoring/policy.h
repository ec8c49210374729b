// Eviction policies: one small interface, one registry of names (ARCHITECTURE §3.10).
// Adding a policy touches policies.cc and policies_test.cc only.
#ifndef ENTROKV_CORE_SCORING_POLICY_H_
#define ENTROKV_CORE_SCORING_POLICY_H_

#include <cstdint>
#include <span>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/scoring/selection.h"

namespace entrokv {

// Parameters of the scoring pipeline, validated once by ValidatePolicyOptions.
struct PolicyOptions {
  int page_size = 16;       // B, tokens per page
  int sink_tokens = 4;      // s, left out of the entropy (and the sink pages of `streaming`)
  double alpha = 2.0;       // Renyi order, > 0; +inf allowed
  double tau = 0.5;         // softmax temperature of the head weights, > 0
  int snapkv_kernel = 7;    // width of snapkv's 1-D max-pool along tokens, odd, >= 1
  Protections protections;  // page_size and sink_tokens here are overwritten from above
};

// INVALID_ARGUMENT naming the option: page_size <= 0, tau <= 0, alpha <= 0, ...
[[nodiscard]] absl::Status ValidatePolicyOptions(const PolicyOptions& options);

// options.protections with page_size and sink_tokens taken from the options themselves.
[[nodiscard]] Protections EffectiveProtections(const PolicyOptions& options);

// One (layer, group): the r rows of the group's query heads.
struct GroupInput {
  std::span<const std::span<const float>> rows;  // r rows of `tokens` entries; empty when the
                                                 // policy needs no statistic and none came
  int64_t tokens = 0;
  int64_t quota_pages = 0;                 // K, >= 1
  std::span<const double> cached_weights;  // r weights from an earlier call, or empty
};

struct GroupSelection {
  std::vector<int32_t> kept_pages;  // ascending
  std::vector<double> weights;      // per head, for pooling policies (empty otherwise)
  std::vector<double> entropies;    // per head, when computed in this call
  // I_g[b], the page scores the pages were selected by (pooling policies; empty for those that
  // select otherwise: head_independent, streaming). Layer scope combines them (layer_scope.h).
  std::vector<float> page_scores;
};

// Stateless and thread-safe: one instance serves every caller.
class Policy {
 public:
  virtual ~Policy() = default;
  [[nodiscard]] virtual absl::string_view name() const = 0;
  // False only for policies that select by position (streaming).
  [[nodiscard]] virtual bool needs_statistic() const { return true; }
  // False only for head_independent, which keeps a union of up to r * K pages.
  [[nodiscard]] virtual bool exact_budget() const { return true; }
  // REQUIRES: options valid; input consistent (DecideLayer checks both).
  [[nodiscard]] virtual GroupSelection SelectGroup(const GroupInput& input,
                                                   const PolicyOptions& options) const = 0;
};

// The policy of that name, or NOT_FOUND listing the known names. Never returns nullptr.
[[nodiscard]] absl::StatusOr<const Policy*> FindPolicy(absl::string_view name);
// Every registered name, in registry order.
[[nodiscard]] std::vector<absl::string_view> PolicyNames();

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_POLICY_H_
