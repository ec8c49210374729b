// Layer scope (docs/architecture.md §3.9): one page set per layer, shared by every KV group, for
// the frame layout in which a page holds every KV head of a layer (vLLM, SGLang). Per-group
// selection there keeps the union of the groups' pages; layer scope combines the groups' page
// scores into one score per page and keeps exactly min(K_l, n) pages for the whole layer.
#ifndef ENTROKV_CORE_SCORING_LAYER_SCOPE_H_
#define ENTROKV_CORE_SCORING_LAYER_SCOPE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/scoring/policy.h"

namespace entrokv {

struct LayerDecision;

// Which pages one decision selects: one set per (layer, group), or one per layer.
enum class SelectionScope : uint8_t { kGroup, kLayer };

// How the groups' page scores I_g[b] become one layer score C[b]. Each group's scores are first
// normalised to its own mass (I_g / sum_b I_g), so a group whose statistic is large in absolute
// terms does not outvote the others. Then:
//  - kMassMax: C[b] = max_g of the normalised scores: no group loses its most important page
//    to another group's many moderately important ones.
//  - kEntropyWeighted: C[b] = sum_g v_g * normalised score, v = softmax(-(H_g - min H) / tau)
//    of the Renyi entropies of the groups' normalised page scores (sink pages left out), the
//    head weights (docs/architecture.md §3.4) one level up: concentrated groups speak louder.
//  - kMassMean: the same sum with v_g = 1 / G (the baseline of the weighted sum).
enum class LayerCombine : uint8_t { kMassMax, kEntropyWeighted, kMassMean };

// The default combine: the one that kept the most needle targets at low budgets, within about one
// point of retained mass of the others (docs/decisions.md, "Layer scope").
inline constexpr LayerCombine kDefaultLayerCombine = LayerCombine::kEntropyWeighted;

[[nodiscard]] absl::string_view SelectionScopeName(SelectionScope scope);  // "group" | "layer"
// INVALID_ARGUMENT naming `field` for any other name.
[[nodiscard]] absl::StatusOr<SelectionScope> ParseSelectionScope(absl::string_view field,
                                                                 absl::string_view name);
// "mass_max" | "entropy_weighted" | "mass_mean"
[[nodiscard]] absl::string_view LayerCombineName(LayerCombine combine);
[[nodiscard]] absl::StatusOr<LayerCombine> ParseLayerCombine(absl::string_view field,
                                                             absl::string_view name);

// C[b] from the groups' page scores; group_weights gets v_g (empty for kMassMax). A group whose
// scores sum to 0 contributes 0. REQUIRES: group_scores non-empty, every span of the same
// length n, entries finite and >= 0; options valid.
void CombineGroupScores(std::span<const std::span<const float>> group_scores, LayerCombine combine,
                        const PolicyOptions& options, std::vector<float>* combined,
                        std::vector<double>* group_weights);

// The distinct pages of the sets, ascending. Sets hold ascending, distinct indices.
[[nodiscard]] std::vector<int32_t> UnionOfPages(std::span<const std::vector<int32_t>> sets);

// Records the union of the decision's per-group pages (decision->union_pages) and the group
// scope's union (decision->group_scope_union_pages: the same, as this is what group scope
// keeps). Every decision goes through this or ApplyLayerScope.
void FinishGroupScope(LayerDecision* decision);

// Turns a group-scope decision (one selection per group, as the policy made it) into the layer
// scope's: the per-group union is kept as group_scope_union_pages (the shadow operators compare
// against), then every group's kept_pages becomes one layer set. With the groups' page scores
// (`group_scores`, one span per group) the set is the min(K, n) pages of the highest combined
// score (ties to the lower page, protections as SelectTopPages applies them); a policy without page
// scores (group_scores empty: head_independent, streaming) keeps the union of its groups' pages,
// which for head_independent is the union over every head of the layer. `layer_live` (empty: every
// page) marks the pages every group still holds: only those can be kept or protected, so after
// earlier evictions the layer keeps exactly min(K, live pages) (`tokens` is the layer's T, for
// the protections). Weights and measurements of the groups are left as they are (the caller
// re-measures retained mass against the new set).
void ApplyLayerScope(std::span<const std::span<const float>> group_scores, LayerCombine combine,
                     const PolicyOptions& options, int64_t tokens,
                     std::span<const uint8_t> layer_live, LayerDecision* decision);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_LAYER_SCOPE_H_
