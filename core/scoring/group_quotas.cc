#include "core/scoring/group_quotas.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"

namespace entrokv {
namespace {

// One live page of one group, ranked by its group-normalised score.
struct Candidate {
  double score = 0.0;  // s_g[b] / sum of g's live scores (0 for a group without mass)
  int32_t group = 0;
  int32_t page = 0;
};

// Higher score first, then the lower group, then the lower page: a total order, so the
// selection is the same whatever order the candidates arrive in.
bool Before(const Candidate& a, const Candidate& b) {
  if (a.score != b.score) return a.score > b.score;
  if (a.group != b.group) return a.group < b.group;
  return a.page < b.page;
}

}  // namespace

bool MovesGroupQuotas(const PolicyOptions& options) { return options.group_floor < 1.0; }

absl::Status ValidateGroupQuotas(absl::string_view field, const Policy& policy,
                                 const PolicyOptions& options, SelectionScope scope) {
  if (!MovesGroupQuotas(options)) return absl::OkStatus();
  if (scope != SelectionScope::kGroup) {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ": quotas move between the groups of a layer in group scope only (layer "
                     "scope keeps one set for every group); leave it at 1"));
  }
  if (!policy.ranks_pages()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": policy ", policy.name(), " ranks no pages to move quotas by; leave it at 1"));
  }
  return absl::OkStatus();
}

void ApplyGroupQuotas(std::span<const std::span<const float>> group_scores,
                      const PolicyOptions& options, const LayerRequest& request,
                      LayerDecision* decision) {
  const int64_t pages = decision->page_count;
  const auto groups = static_cast<int32_t>(decision->groups.size());
  std::vector<Candidate> rest;  // every group's live pages beyond its floor
  int64_t layer_total = 0;      // sum_g q_g
  int64_t floors = 0;           // sum_g f_g
  std::vector<uint8_t> kept(static_cast<size_t>(pages));
  std::vector<Candidate> ranked;
  for (int32_t g = 0; g < groups; ++g) {
    const std::span<const uint8_t> live = GroupLivePages(request, pages, g);
    const std::span<const float> scores = group_scores[static_cast<size_t>(g)];
    auto is_live = [&](int64_t b) { return live.empty() || live[static_cast<size_t>(b)] != 0; };
    double mass = 0.0;
    int64_t live_count = 0;
    for (int64_t b = 0; b < pages; ++b) {
      if (!is_live(b)) continue;
      mass += scores[static_cast<size_t>(b)];
      ++live_count;
    }
    const double inverse = mass > 0.0 ? 1.0 / mass : 0.0;
    const int64_t quota = std::min(request.quota_pages, live_count);
    layer_total += quota;
    // The floor: the protected pages, then the group's best, up to ceil(floor * q_g) and at
    // least one page (as a fixed quota keeps at least one).
    std::fill(kept.begin(), kept.end(), 0);
    const std::vector<int32_t> protected_pages =
        ProtectedPagesOf(options, request.tokens, quota, live);
    for (const int32_t page : protected_pages) kept[static_cast<size_t>(page)] = 1;
    ranked.clear();
    for (int64_t b = 0; b < pages; ++b) {
      if (!is_live(b) || kept[static_cast<size_t>(b)] != 0) continue;
      ranked.push_back({static_cast<double>(scores[static_cast<size_t>(b)]) * inverse, g,
                        static_cast<int32_t>(b)});
    }
    const auto share =
        static_cast<int64_t>(std::ceil(options.group_floor * static_cast<double>(quota)));
    const int64_t floor = std::max({static_cast<int64_t>(protected_pages.size()),
                                    std::min(share, quota), std::min<int64_t>(1, quota)});
    const auto best = static_cast<ptrdiff_t>(floor - static_cast<int64_t>(protected_pages.size()));
    std::partial_sort(ranked.begin(), ranked.begin() + best, ranked.end(), Before);
    for (ptrdiff_t i = 0; i < best; ++i) kept[static_cast<size_t>(ranked[i].page)] = 1;
    rest.insert(rest.end(), ranked.begin() + best, ranked.end());
    floors += floor;
    std::vector<int32_t>& group_kept = decision->groups[static_cast<size_t>(g)].kept_pages;
    group_kept.clear();
    for (int64_t b = 0; b < pages; ++b) {
      if (kept[static_cast<size_t>(b)] != 0) group_kept.push_back(static_cast<int32_t>(b));
    }
  }
  // The layer's other pages go to the best of the rest, wherever they are.
  const auto more = static_cast<ptrdiff_t>(layer_total - floors);
  std::nth_element(rest.begin(), rest.begin() + more, rest.end(), Before);
  for (ptrdiff_t i = 0; i < more; ++i) {
    decision->groups[static_cast<size_t>(rest[i].group)].kept_pages.push_back(rest[i].page);
  }
  for (GroupDecision& group : decision->groups) {
    std::sort(group.kept_pages.begin(), group.kept_pages.end());
  }
}

}  // namespace entrokv
