// Layer quotas that follow the scores (the "mass" layer allocator, docs/architecture.md §3.8):
// the pages a budget buys move between the layers of one decision to where they keep the most
// of each (layer, group)'s score mass, as group quotas move between the groups of a layer.
#ifndef ENTROKV_CORE_SCORING_LAYER_QUOTAS_H_
#define ENTROKV_CORE_SCORING_LAYER_QUOTAS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/scoring/decision.h"
#include "core/scoring/policy.h"

namespace entrokv {

// The default of LayerMassRequest::floor_fraction: every layer keeps at least half its
// uniform share.
inline constexpr double kDefaultLayerFloor = 0.5;

// INVALID_ARGUMENT "<field>: must be in [0, 1], got F" (NaN included) otherwise.
[[nodiscard]] absl::Status ValidateLayerFloor(absl::string_view field, double floor_fraction);

// One scored layer: its groups' page scores (I_g, one span of n per group, the scorer's
// GroupDecision::page_scores) and the pages each group still holds (as LayerRequest::live_pages:
// empty, n entries shared by every group, or G * n group-major).
struct ScoredLayer {
  std::vector<std::span<const float>> group_scores;
  std::span<const uint8_t> live_pages;
};

// Spreads `total_pages` layer-pages (K summed over the layers) over `layers`. Each (layer,
// group)'s live page scores are scaled to sum 1 (a group without mass counts 0), so a page's
// value is its share of its own group's mass. Every layer first gets its floor,
// max(1, floor(floor_fraction * total_pages / L)); then each further page goes, one at a time,
// to the layer whose next page adds the most: the sum over its groups of the group's next best
// share (ties: the layer with fewer pages, so equal layers stay even, then the lower layer). That
// maximises the summed share the layers' groups keep. A layer gets no more pages than its groups
// hold (a page beyond every group's live pages keeps nothing), so the sum is total_pages unless the
// layers hold less. Protections are not counted here: they take their pages inside each layer's
// quota, as with fixed quotas. REQUIRES: layers non-empty, total_pages >= layers.size(),
// floor_fraction in [0, 1], every group's scores finite and >= 0 and of one length per layer.
[[nodiscard]] std::vector<int64_t> PlanLayersByMass(std::span<const ScoredLayer> layers,
                                                    int64_t total_pages, double floor_fraction);

// Chooses a layer's pages again at request.quota_pages from the page scores a decision ranked
// them by (GroupDecision::page_scores, kept by LayerRequest::page_scores): the same selection
// the scorers make from those scores (protections, live pages, layer scope, group quotas that
// move), on every path. Measurements are not taken (request.measure is ignored).
// REQUIRES: the request validated for the decision's layer; every group's page_scores filled.
void SelectAtQuota(const PolicyOptions& options, const LayerRequest& request,
                   LayerDecision* decision);

// A request whose quota is chosen after scoring (the "mass" allocator, a server-chosen
// budget): every page kept and ranked (quota n = ceil(T / page_size), page scores kept),
// nothing measured (the measurements would be of every page, not of what is finally kept).
void RankEveryPage(int page_size, LayerRequest* request);

// The "mass" allocator over one decision's layers: decisions[i] decided requests[i] keeping
// every page, with its page scores (LayerRequest::page_scores). The layers share `total_pages`
// as PlanLayersByMass spreads them (requests[i]'s live pages), and each then keeps its quota's
// pages by SelectAtQuota (requests[i]'s scope and live pages; its quota_pages is not read).
// REQUIRES: as PlanLayersByMass and SelectAtQuota; requests.size() == decisions.size().
void MoveLayerQuotas(const PolicyOptions& options, std::span<const LayerRequest> requests,
                     std::span<LayerDecision* const> decisions, int64_t total_pages,
                     double floor_fraction);
// The same over decisions held together, in the requests' order.
void MoveLayerQuotas(const PolicyOptions& options, std::span<const LayerRequest> requests,
                     std::span<LayerDecision> decisions, int64_t total_pages,
                     double floor_fraction);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_LAYER_QUOTAS_H_
