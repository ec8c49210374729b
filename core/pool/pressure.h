// Pool pressure: the terms a pool keeps per sequence for the daemon's server-chosen budgets,
// admission, tenants and preemption, and the pure rules over them. CacheState holds the state
// (cache_state_pressure.cc applies it); PlanReclaim (reclaim.h) is the allocator.
#ifndef ENTROKV_CORE_POOL_PRESSURE_H_
#define ENTROKV_CORE_POOL_PRESSURE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/pool/arena.h"

namespace entrokv {

// Tenants a daemon may name (--tenant_share), besides the default tenant "": the tenant label
// of the metrics is bounded by it.
inline constexpr int kMaxTenants = 16;
// The default tenant "" as a metric label; no configured tenant may take the name.
inline constexpr char kDefaultTenantLabel[] = "default";
// OpenSequenceRequest.priority: higher keeps its frames longer.
inline constexpr int32_t kMinPriority = 0;
inline constexpr int32_t kMaxPriority = 9;

// One configured tenant and its guaranteed share of every pool, in [0, 1].
struct TenantShare {
  std::string name;
  double share = 0.0;
};

// A pool's pressure settings (the daemon's flags).
struct PressureOptions {
  // Occupancy (used / capacity frames) the pool keeps under by reclaiming from sequences with
  // server-chosen budgets, in (0, 1]. Quotas are lifted again once no admission waits and the
  // occupancy is below it by kQuotaHysteresis.
  double target_occupancy = 0.9;
  // The configured tenants, at most kMaxTenants, shares summing to at most 1. The default
  // tenant "" always exists, with no guarantee.
  std::vector<TenantShare> tenants;
  // How long a refused admission keeps its place (its age for preemption and the frames
  // reclaimed for it) without being retried.
  absl::Duration admission_hold = absl::Seconds(5);
  // Host bytes swapped-out sequences may hold together; 0: SwapOut is refused.
  int64_t max_swap_bytes = 0;
  // Where a swapped-out sequence's bytes go (a host arena per sequence); empty: a fresh
  // "/entrokv.<pool>.swap.<pid>.<n>" unlinked with the arena. Called under the pool's lock.
  std::function<HostArenaSource()> swap_arena;
  // The clock of pending admissions and call intervals; empty: absl::Now.
  std::function<absl::Time()> clock;
};
inline constexpr double kQuotaHysteresis = 0.05;

// INVALID_ARGUMENT naming target_occupancy or tenant_share (a name that is empty, repeated or
// not an id, a share outside [0, 1], shares summing above 1, more than kMaxTenants).
[[nodiscard]] absl::Status ValidatePressureOptions(const PressureOptions& options);

// What OpenSequence asks for a new sequence.
struct SequenceTerms {
  std::string tenant;                // a configured tenant or "" (the default)
  int32_t priority = kMinPriority;   // [kMinPriority, kMaxPriority]
  std::optional<double> auto_floor;  // set: a server-chosen budget with this floor, (0, 1]
};

// INVALID_ARGUMENT naming "tenant" (not configured: the message lists the tenants),
// "priority" or "auto_budget.floor_fraction".
[[nodiscard]] absl::Status ValidateSequenceTerms(const SequenceTerms& terms,
                                                 std::span<const TenantShare> tenants);
// INVALID_ARGUMENT "<field>: must be in (0, 1], got F".
[[nodiscard]] absl::Status ValidateFloor(absl::string_view field, double floor_fraction);

// Why a quota was set (entrokv_frames_reclaimed_total{reason}).
enum class ReclaimReason : uint8_t { kNone = 0, kAdmission = 1, kTarget = 2 };

// What a pool keeps per sequence (resident or swapped out). Journaled with the sequence.
struct SequencePressure {
  std::string tenant;
  int32_t priority = kMinPriority;
  bool auto_budget = false;
  double floor_fraction = 1.0;  // with auto_budget
  int64_t quota_frames = 0;     // 0: no quota
  ReclaimReason quota_reason = ReclaimReason::kNone;
  int64_t admitted = 0;  // the pool's admission order: smaller is older
  bool preempt = false;  // the daemon asked the owner to preempt it
  // The protections of its last auto decision: a quota never takes these pages.
  bool protect_tail = true;
  int64_t sink_pages = 0;
  int64_t recent_pages = 0;
  // [layer * kv_groups + group][page]: the page's share (PageShares) at its last auto decision,
  // kUnscored for a page no decision scored (appended since): a quota never takes those. Empty
  // until the first auto decision.
  std::vector<std::vector<float>> shares;
};
inline constexpr float kUnscored = -1.0f;

// Frames a quota never goes below: ceil(floor_fraction x the sequence's uncompressed frames).
[[nodiscard]] int64_t FloorFrames(double floor_fraction, int64_t uncompressed_frames);

// One sequence that could be preempted.
struct VictimCandidate {
  std::string id;
  int32_t priority = 0;
  int64_t admitted = 0;
  int64_t frees = 0;  // frames its preemption returns (those it does not share)
};
// The sequences to ask their owners to preempt so that an admission of `priority` and order
// `order` (its first attempt; a running sequence's own admission) gets `missing` frames: those
// of lower priority, or of the same priority admitted after it, lowest priority first, then the
// youngest, until their frames cover `missing` (all eligible ones when they cannot).
[[nodiscard]] std::vector<std::string> ChooseVictims(std::span<const VictimCandidate> candidates,
                                                     int32_t priority, int64_t order,
                                                     int64_t missing);

// Why an admission that did not fit was answered RESOURCE_EXHAUSTED (nothing allocated).
struct AdmissionRefusal {
  bool refused = false;  // false: delayed (the frames are being reclaimed)
  int64_t missing_frames = 0;
  int64_t reclaiming_frames = 0;
  int64_t retry_after_ms = 0;
  std::vector<std::string> preempt;  // asked of their owners for this admission
};

// What a call reports about its sequence and the pool (PressureInfo on the wire).
struct PressureReport {
  int64_t quota_frames = 0;
  int64_t live_frames = 0;
  int64_t floor_frames = 0;
  double occupancy = 0.0;
  double target_occupancy = 0.0;
  int64_t reclaimed_frames = 0;  // by this call
  bool preempt = false;
};

// One tenant of a pool (PoolStats.tenants).
struct TenantUsageStats {
  std::string tenant;
  int64_t used_frames = 0;
  double share = 0.0;
  int64_t guaranteed_frames = 0;
};

// A swapped-out sequence as a journal recorded it, for Restore.
struct SwappedSnapshot {
  std::string id;
  int64_t length = 0;
  // [layer * kv_groups + group][page]: the slot of the page's bytes in the swap arena, or -1
  // for an evicted page; every slot in [0, slots) is named at least once.
  std::vector<std::vector<int32_t>> slots;
  int64_t slot_count = 0;
  std::vector<std::vector<double>> head_weights;  // [layer]
  std::vector<std::vector<float>> running_sums;   // empty, or [layer]: Sequence::running_sum
  std::string arena_name;                         // the host arena holding slot_count frames
  std::optional<SequencePressure> pressure;
};

// The pool's pressure counters (PoolStats; metrics).
struct PressureStats {
  double target_occupancy = 0.0;
  int64_t frames_reclaimed_admission = 0;
  int64_t frames_reclaimed_target = 0;
  int64_t admissions_delayed = 0;
  int64_t admissions_refused = 0;
  int64_t preemptions = 0;
  int64_t swaps_out = 0;
  int64_t swaps_in = 0;
  int64_t sequences_swapped = 0;
  int64_t swapped_bytes = 0;
  std::vector<TenantUsageStats> tenants;  // configured ones in order, then ""
};

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_PRESSURE_H_
