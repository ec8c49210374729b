#include "core/scoring/layer_quotas.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/scoring/group_finish.h"
#include "core/util/page_count.h"

namespace entrokv {
namespace {

// A group's live page scores as shares of its mass, best first (none for a group without mass:
// every further page of it adds 0).
std::vector<double> SortedShares(std::span<const float> scores, std::span<const uint8_t> live) {
  std::vector<double> shares;
  double mass = 0.0;
  for (size_t b = 0; b < scores.size(); ++b) {
    if (!live.empty() && live[b] == 0) continue;
    shares.push_back(static_cast<double>(scores[b]));
    mass += shares.back();
  }
  if (mass > 0.0) {
    for (double& share : shares) share /= mass;
  } else {
    std::fill(shares.begin(), shares.end(), 0.0);
  }
  std::sort(shares.begin(), shares.end(), std::greater<>());
  return shares;
}

}  // namespace

absl::Status ValidateLayerFloor(absl::string_view field, double floor_fraction) {
  if (floor_fraction >= 0.0 && floor_fraction <= 1.0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be in [0, 1], got ", floor_fraction));
}

std::vector<int64_t> PlanLayersByMass(std::span<const ScoredLayer> layers, int64_t total_pages,
                                      double floor_fraction) {
  const size_t count = layers.size();
  // shares[l][g]: group g of layer l, best first; cap[l]: the most live pages a group holds.
  std::vector<std::vector<std::vector<double>>> shares(count);
  std::vector<int64_t> caps(count, 0);
  for (size_t l = 0; l < count; ++l) {
    const ScoredLayer& layer = layers[l];
    for (size_t g = 0; g < layer.group_scores.size(); ++g) {
      const std::span<const float> scores = layer.group_scores[g];
      std::span<const uint8_t> live = layer.live_pages;
      if (live.size() > scores.size()) live = live.subspan(g * scores.size(), scores.size());
      shares[l].push_back(SortedShares(scores, live));
      caps[l] = std::max(caps[l], static_cast<int64_t>(shares[l].back().size()));
    }
  }
  // What the k-th page of layer l (0-based) adds: the sum of its groups' k-th shares.
  const auto gain = [&shares](size_t l, int64_t k) {
    double sum = 0.0;
    for (const std::vector<double>& group : shares[l]) {
      if (k < static_cast<int64_t>(group.size())) sum += group[static_cast<size_t>(k)];
    }
    return sum;
  };
  const auto floor = std::max<int64_t>(
      1, static_cast<int64_t>(std::floor(floor_fraction * static_cast<double>(total_pages) /
                                         static_cast<double>(count))));
  std::vector<int64_t> quotas(count);
  int64_t left = total_pages;
  for (size_t l = 0; l < count; ++l) {
    quotas[l] = std::min(floor, std::max<int64_t>(caps[l], 1));
    left -= quotas[l];
  }
  // (gain, pages so far, layer): the largest gain first, then the layer with fewer pages (equal
  // layers stay even), then the lower layer.
  using Next = std::tuple<double, int64_t, size_t>;
  const auto after = [](const Next& a, const Next& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    return std::make_tuple(std::get<1>(a), std::get<2>(a)) >
           std::make_tuple(std::get<1>(b), std::get<2>(b));
  };
  std::priority_queue<Next, std::vector<Next>, decltype(after)> next(after);
  for (size_t l = 0; l < count; ++l) {
    if (quotas[l] < caps[l]) next.emplace(gain(l, quotas[l]), quotas[l], l);
  }
  for (; left > 0 && !next.empty(); --left) {
    const size_t l = std::get<2>(next.top());
    next.pop();
    ++quotas[l];
    if (quotas[l] < caps[l]) next.emplace(gain(l, quotas[l]), quotas[l], l);
  }
  return quotas;
}

void SelectAtQuota(const PolicyOptions& options, const LayerRequest& request,
                   LayerDecision* decision) {
  const auto pages = static_cast<size_t>(decision->page_count);
  // A copy: Finish writes each group's page_scores from the spans it reads.
  std::vector<float> layer_scores;
  layer_scores.reserve(decision->groups.size() * pages);
  for (const GroupDecision& group : decision->groups) {
    layer_scores.insert(layer_scores.end(), group.page_scores.begin(), group.page_scores.end());
  }
  LayerRequest at_quota = request;
  at_quota.measure = false;
  GroupFinisher finisher;
  for (size_t g = 0; g < decision->groups.size(); ++g) {
    GroupScores scores;
    scores.page_max = std::span<const float>(layer_scores).subspan(g * pages, pages);
    finisher.Finish(options, at_quota, static_cast<int>(g), /*r=*/0, scores, &decision->groups[g]);
  }
  decision->quota_pages = request.quota_pages;
  GroupFinisher::FinishLayer(options, at_quota, layer_scores, {}, decision);
}

void RankEveryPage(int page_size, LayerRequest* request) {
  request->quota_pages = PageCount(request->tokens, page_size);
  request->page_scores = true;
  request->measure = false;
}

void MoveLayerQuotas(const PolicyOptions& options, std::span<const LayerRequest> requests,
                     std::span<LayerDecision* const> decisions, int64_t total_pages,
                     double floor_fraction) {
  if (decisions.empty()) return;
  std::vector<ScoredLayer> scored(decisions.size());
  for (size_t i = 0; i < decisions.size(); ++i) {
    for (const GroupDecision& group : decisions[i]->groups) {
      scored[i].group_scores.emplace_back(group.page_scores);
    }
    scored[i].live_pages = requests[i].live_pages;
  }
  const std::vector<int64_t> quotas = PlanLayersByMass(scored, total_pages, floor_fraction);
  for (size_t i = 0; i < decisions.size(); ++i) {
    LayerRequest at = requests[i];
    at.quota_pages = quotas[i];
    SelectAtQuota(options, at, decisions[i]);
  }
}

void MoveLayerQuotas(const PolicyOptions& options, std::span<const LayerRequest> requests,
                     std::span<LayerDecision> decisions, int64_t total_pages,
                     double floor_fraction) {
  std::vector<LayerDecision*> pointers;
  for (LayerDecision& decision : decisions) pointers.push_back(&decision);
  MoveLayerQuotas(options, requests, pointers, total_pages, floor_fraction);
}

}  // namespace entrokv
