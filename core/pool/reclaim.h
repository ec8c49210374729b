// Which sequences give up how many frames when a pool must make room: the allocator behind the
// daemon's server-chosen budgets. Pure functions over plain values (no pool, no lock, no clock):
// CacheState describes every reclaimable sequence and applies the plan.
#ifndef ENTROKV_CORE_POOL_RECLAIM_H_
#define ENTROKV_CORE_POOL_RECLAIM_H_

#include <cstdint>
#include <span>
#include <vector>

namespace entrokv {

// The comparable value of a frame unit: its page's share of its (layer, group)'s pooled page
// scores, I[b] / sum of I over the live pages. Each (layer, group) of every sequence sums to 1,
// whatever the sequence's length, so evicting a set of pages costs each sequence the share of
// its own attention it loses (docs/decisions.md, "Pool pressure"). `scores` holds I[b] for every
// page; `live` (empty: every page) marks the pages still held; evicted pages get 0. Scores that
// sum to 0 (a statistic with no mass) share evenly. REQUIRES: live empty or scores.size() long;
// scores finite and >= 0 (the scorer checked the statistic).
[[nodiscard]] std::vector<float> PageShares(std::span<const float> scores,
                                            std::span<const uint8_t> live = {});

// One tenant as the allocator sees it.
struct ReclaimTenant {
  int64_t guaranteed_frames = 0;  // its share of the pool: frames within it are reclaimed last
  int64_t used_frames = 0;        // what its sequences hold now
};

// One sequence that may give frames.
struct ReclaimCandidate {
  int tenant = 0;    // index into the tenants
  int priority = 0;  // lower gives first
  // The values of the frame units it may give now, ascending: its scored, unprotected live
  // units beyond its floor and beyond what it already owes (CacheState drops those first).
  std::vector<float> values;
};

struct ReclaimPlan {
  std::vector<int64_t> frames;  // per candidate: units to give (a prefix of its `values`)
  int64_t planned = 0;          // their sum, at most the demand
  int64_t shortfall = 0;        // demand - planned: > 0 when every candidate is at its floor
};

// Takes `demand` frame units, one at a time, from the candidate whose next unit comes first in
// the order (tier, priority, value, candidate index): tier 0 while the unit's tenant holds more
// than its guaranteed frames (counting what the plan already took from it), tier 1 otherwise.
// So a tenant above its share gives first (down to its share), lower priority gives before
// higher, and within those the least valuable unit goes first. Deterministic; O(planned log n).
// REQUIRES: every candidate's tenant indexes `tenants`; values ascending.
[[nodiscard]] ReclaimPlan PlanReclaim(std::span<const ReclaimTenant> tenants,
                                      std::span<const ReclaimCandidate> candidates, int64_t demand);

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_RECLAIM_H_
