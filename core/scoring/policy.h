// Eviction policies: one small interface, one registry of names (docs/architecture.md §3.10).
// Adding a policy touches policies.cc and policies_test.cc only.
#ifndef ENTROKV_CORE_SCORING_POLICY_H_
#define ENTROKV_CORE_SCORING_POLICY_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/scoring/selection.h"
#include "core/scoring/statistic.h"
#include "core/scoring/weights.h"

namespace entrokv {

// Parameters of the scoring pipeline, validated once by ValidatePolicyOptions.
struct PolicyOptions {
  int page_size = 16;     // B, tokens per page
  int sink_tokens = 4;    // s, left out of the entropy (and the sink pages of `streaming`)
  double alpha = 2.0;     // Renyi order, > 0; +inf allowed
  double tau = 0.5;       // softmax temperature of the head weights, > 0
  int snapkv_kernel = 7;  // width of snapkv's 1-D max-pool along tokens, odd, >= 1
  // Neighbourhood pooling of the fused kinds (entropy-weighted, mean, max): each head's row is
  // pooled along tokens over a centred window this wide (weights.h, NeighbourhoodPool) before
  // the group's rows are pooled; the entropies and the measurements keep the raw rows. Odd, in
  // [1, kMaxNeighbourhoodKernel]; 1 is off. (snapkv has its own, snapkv_kernel.)
  int neighbourhood_kernel = 1;
  NeighbourhoodKind neighbourhood = NeighbourhoodKind::kMax;
  // Group quotas that move (group_quotas.h): each group of a layer keeps at least this share of
  // its quota, and the layer's other pages go to the groups whose mass-normalised page scores
  // are highest, so the layer keeps exactly what fixed quotas keep. In [0, 1]; 1 is fixed quotas.
  // Group scope and a policy that ranks pages only.
  double group_floor = 1.0;
  Protections protections;
};

// INVALID_ARGUMENT naming the option: page_size <= 0, tau <= 0, alpha <= 0, ...
[[nodiscard]] absl::Status ValidatePolicyOptions(const PolicyOptions& options);

// The neighbourhood options as every interface takes them, errors naming `field` (a flag, a
// wire field): an odd kernel in [1, kMaxNeighbourhoodKernel], and "max" or "mean".
[[nodiscard]] absl::Status ValidateNeighbourhoodKernel(absl::string_view field, int64_t kernel);
[[nodiscard]] absl::StatusOr<NeighbourhoodKind> ParseNeighbourhoodKind(absl::string_view field,
                                                                       absl::string_view name);

// A group floor as every interface takes it, errors naming `field`: finite and in [0, 1].
[[nodiscard]] absl::Status ValidateGroupFloor(absl::string_view field, double floor);

// The pages holding the first min(sink_tokens, T) tokens: ceil(min(s, T) / B), no overflow for
// any s. REQUIRES: options valid, tokens >= 0.
[[nodiscard]] int64_t SinkPageCount(const PolicyOptions& options, int64_t tokens);

// The protected pages of one (layer, group) of `tokens` tokens under options.protections
// (selection.h's ProtectedPages, the one statement of the rules), at most `quota`, none evicted.
[[nodiscard]] std::vector<int32_t> ProtectedPagesOf(const PolicyOptions& options, int64_t tokens,
                                                    int64_t quota,
                                                    std::span<const uint8_t> live = {});

// One (layer, group): the r rows of the group's query heads.
struct GroupInput {
  std::span<const std::span<const float>> rows;  // r rows of `tokens` entries; empty when the
                                                 // policy needs no statistic and none came
  int64_t tokens = 0;
  int64_t quota_pages = 0;                 // K, >= 1
  std::span<const double> cached_weights;  // r weights from an earlier call, or empty
  // Per page, 1 while the group still holds it; empty when every page is held. An evicted
  // page scores as absent: it is never kept, and the group keeps min(K, live pages).
  std::span<const uint8_t> live;
};

struct GroupSelection {
  std::vector<int32_t> kept_pages;  // ascending
  std::vector<double> weights;      // per head, for pooling policies (empty otherwise)
  std::vector<double> entropies;    // per head, when computed in this call
  // I_g[b], the page scores the pages were selected by (pooling policies; empty for those that
  // select otherwise: head_independent, streaming). Layer scope combines them (layer_scope.h).
  std::vector<float> page_scores;
};

// How a policy turns a group's rows into page scores (docs/architecture.md §3.4-3.6). The fused
// scorer (fused_scorer.h) computes the first three kinds itself from this description alone and
// sends the others to SelectGroup, so a new policy touches policies.cc only.
enum class PoolingKind : uint8_t {
  kEntropyWeighted,  // softmax(-H / tau) weights (or cached ones), PoolRows, page maxima
  kMean,             // MeanRows, page maxima
  kMax,              // the max over the heads, page maxima
  kMaxPoolThenMean,  // each row max-pooled along tokens (snapkv_kernel), then MeanRows
  kUnion,            // each head's own top-K pages, the group keeps their union
  kPosition,         // no statistic: the sink pages and the newest pages
};

struct Pooling {
  PoolingKind kind = PoolingKind::kMean;
  bool isolate_sinks = false;  // kEntropyWeighted: the entropy leaves out the sink tokens
};

// Stateless and thread-safe: one instance serves every caller.
class Policy {
 public:
  virtual ~Policy() = default;
  [[nodiscard]] virtual absl::string_view name() const = 0;
  [[nodiscard]] virtual Pooling pooling() const = 0;
  // False only for policies that select by position (streaming).
  [[nodiscard]] bool needs_statistic() const { return pooling().kind != PoolingKind::kPosition; }
  // The statistic the policy is meant to score, which a worker should measure for it: LAST_ROW
  // unless the policy says otherwise (h2o ACCUMULATED column sums, snapkv the WINDOW_MEAN of
  // its observation window); none when it needs no statistic. Scoring treats every kind alike;
  // this is the one statement of which kind each policy wants, for the tools that produce
  // statistics (`entrokv eval`, `entrokv replay`, `entrokv policies` for the Python tools).
  [[nodiscard]] virtual std::optional<StatisticKind> statistic() const {
    if (!needs_statistic()) return std::nullopt;
    return StatisticKind::kLastRow;
  }
  // False only for the union (head_independent), which keeps up to r * K pages.
  [[nodiscard]] bool exact_budget() const { return pooling().kind != PoolingKind::kUnion; }
  // True when SelectGroup ranks the group's pages by one score each (GroupSelection's
  // page_scores): every kind but the union and the positional one.
  [[nodiscard]] bool ranks_pages() const {
    return pooling().kind != PoolingKind::kUnion && pooling().kind != PoolingKind::kPosition;
  }
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
