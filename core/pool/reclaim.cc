// PlanReclaim is a k-way merge of the candidates' ascending value lists under one key
// (tier, priority, value, candidate). A unit's tier depends on how much the plan has already
// taken from its tenant, and only ever rises (0 -> 1) as the plan takes more, so the heap holds
// each candidate's next unit with the tier it had when pushed; a popped entry whose tier has
// risen since goes back with its new tier before anything is taken. That keeps the merge exact
// without re-keying every candidate of a tenant when the tenant reaches its share.
#include "core/pool/reclaim.h"

#include <algorithm>
#include <queue>
#include <tuple>

namespace entrokv {

std::vector<float> PageShares(std::span<const float> scores, std::span<const uint8_t> live) {
  std::vector<float> shares(scores.size(), 0.0f);
  double total = 0.0;
  int64_t live_pages = 0;
  for (size_t page = 0; page < scores.size(); ++page) {
    if (!live.empty() && live[page] == 0) continue;
    total += static_cast<double>(scores[page]);
    ++live_pages;
  }
  if (live_pages == 0) return shares;
  for (size_t page = 0; page < scores.size(); ++page) {
    if (!live.empty() && live[page] == 0) continue;
    shares[page] = total > 0.0 ? static_cast<float>(static_cast<double>(scores[page]) / total)
                               : static_cast<float>(1.0 / static_cast<double>(live_pages));
  }
  return shares;
}

ReclaimPlan PlanReclaim(std::span<const ReclaimTenant> tenants,
                        std::span<const ReclaimCandidate> candidates, int64_t demand) {
  ReclaimPlan plan;
  plan.frames.assign(candidates.size(), 0);
  if (demand <= 0) return plan;
  std::vector<int64_t> taken_from_tenant(tenants.size(), 0);
  const auto tier = [&](int tenant) {
    const ReclaimTenant& t = tenants[static_cast<size_t>(tenant)];
    return t.used_frames - taken_from_tenant[static_cast<size_t>(tenant)] > t.guaranteed_frames ? 0
                                                                                                : 1;
  };
  // (tier, priority, value, candidate): the smallest comes first.
  using Entry = std::tuple<int, int, float, size_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (size_t c = 0; c < candidates.size(); ++c) {
    const ReclaimCandidate& candidate = candidates[c];
    if (candidate.values.empty()) continue;
    heap.emplace(tier(candidate.tenant), candidate.priority, candidate.values.front(), c);
  }
  while (plan.planned < demand && !heap.empty()) {
    const auto [pushed_tier, priority, value, c] = heap.top();
    heap.pop();
    const ReclaimCandidate& candidate = candidates[c];
    const int now = tier(candidate.tenant);
    if (now != pushed_tier) {  // its tenant reached its share: the unit waits in tier 1
      heap.emplace(now, priority, value, c);
      continue;
    }
    ++plan.frames[c];
    ++plan.planned;
    ++taken_from_tenant[static_cast<size_t>(candidate.tenant)];
    const auto next = static_cast<size_t>(plan.frames[c]);
    if (next < candidate.values.size()) {
      heap.emplace(tier(candidate.tenant), candidate.priority, candidate.values[next], c);
    }
  }
  plan.shortfall = demand - plan.planned;
  return plan;
}

}  // namespace entrokv
