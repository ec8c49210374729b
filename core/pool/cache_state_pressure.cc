// CacheState's pool pressure: server-chosen budgets, admission, tenants and preemption.
//
// The rule that keeps it safe: a quota is a number, set on a sequence by any call that finds
// the pool short (PlanQuotas), but frames leave a sequence only inside a call of its own owner
// (AppendTokens, ApplyAutoDecision), which reports the pages it took. A worker never reads its
// sequence while its own call runs, and reads only the pages the answer leaves it, so no frame
// is handed to another sequence while its owner may still read it, with no epoch, quarantine
// or lease to track (docs/decisions.md, "Pool pressure").
//
// An admission that does not fit therefore cannot take the frames at once: it sets quotas and
// is answered RESOURCE_EXHAUSTED with how many frames are missing, how many are being
// reclaimed and when to retry (about one call interval of the owners). While it waits it holds
// back, from newer admissions of no higher priority, the frames it asked for (so a large
// request is not starved by small ones), for PressureOptions::admission_hold after its last
// try. When even every floor is not enough it names sequences to preempt (their owners learn
// it on their next call: PressureReport::preempt).
#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/pool/cache_state.h"
#include "core/pool/reclaim.h"
#include "core/util/status_macros.h"

namespace entrokv {
namespace {

// A frame unit: a (layer, page) of one group (kGroup) or of every group (kLayer).
struct Unit {
  float value = 0.0f;
  int32_t layer = 0;
  int32_t first_group = 0;
  int64_t page = 0;
  int64_t round = 0;  // its rank within its (layer, group unit): EvictableUnits gives in rounds
};

bool Protected(const SequencePressure& terms, int64_t page, int64_t pages) {
  return (terms.protect_tail && page == pages - 1) || page < terms.sink_pages ||
         page >= pages - terms.recent_pages;
}

// The share of (layer, group)'s table entry `t` for `page`, kUnscored when none was kept.
float ShareOf(const SequencePressure& terms, size_t t, int64_t page) {
  if (t >= terms.shares.size() || page >= static_cast<int64_t>(terms.shares[t].size())) {
    return kUnscored;
  }
  return terms.shares[t][static_cast<size_t>(page)];
}

}  // namespace

absl::Time CacheState::Now() const {
  return pressure_options_.clock ? pressure_options_.clock() : absl::Now();
}

int64_t CacheState::UncompressedFrames(int64_t pages) const {
  return static_cast<int64_t>(geometry_.layers) * (geometry_.kv_groups / UnitGroups()) * pages;
}

int64_t CacheState::FloorOf(const Sequence& sequence, const SequencePressure& terms) const {
  if (!terms.auto_budget) return 0;
  return FloorFrames(terms.floor_fraction, UncompressedFrames(sequence.page_count()));
}

SequencePressure& CacheState::TermsOf(absl::string_view sequence_id) {
  return terms_[std::string(sequence_id)];
}

void CacheState::JournalTerms(absl::string_view sequence_id, const SequencePressure& terms) {
  if (journal_ != nullptr) journal_->TermsSet(sequence_id, terms);
}

int64_t CacheState::SharesBytes(const SequencePressure& terms) {
  int64_t bytes = 0;
  for (const std::vector<float>& shares : terms.shares) {
    bytes += static_cast<int64_t>(shares.capacity() * sizeof(float));
  }
  return bytes;
}

// Every unit of the sequence a quota may take, with its value: live, scored, unprotected.
// `in_layers` (empty: every layer) limits them; `live_in` counts the live units of those layers,
// `live_all` of every layer.
static std::vector<Unit> EvictableUnits(const Sequence& sequence, const SequencePressure& terms,
                                        const ModelGeometry& geometry, int unit_groups,
                                        const std::vector<bool>& in_layers, int64_t* live_in,
                                        int64_t* live_all) {
  std::vector<Unit> units;
  const int64_t pages = sequence.page_count();
  *live_in = 0;
  *live_all = 0;
  for (int32_t layer = 0; layer < geometry.layers; ++layer) {
    const bool in = in_layers.empty() || in_layers[static_cast<size_t>(layer)];
    for (int32_t first = 0; first < geometry.kv_groups; first += unit_groups) {
      for (int64_t page = 0; page < pages; ++page) {
        bool live = false;
        bool scored = true;
        double value = 0.0;
        for (int32_t g = first; g < first + unit_groups; ++g) {
          live |= sequence.block_table(layer, g)[static_cast<size_t>(page)] != kNoFrame;
          const float share =
              ShareOf(terms, static_cast<size_t>(layer) * geometry.kv_groups + g, page);
          scored &= share >= 0.0f;
          value += share;
        }
        if (!live) continue;
        ++*live_all;
        if (!in) continue;
        ++*live_in;
        if (!scored || Protected(terms, page, pages)) continue;
        units.push_back(Unit{.value = static_cast<float>(value / unit_groups),
                             .layer = layer,
                             .first_group = first,
                             .page = page});
      }
    }
  }
  // Each (layer, group unit)'s own order: its pages by value, as the policy ranks them.
  std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
    return std::tie(a.layer, a.first_group, a.value, a.page) <
           std::tie(b.layer, b.first_group, b.value, b.page);
  });
  // Then in rounds: round r takes the r-th cheapest page of every (layer, group unit), so that
  // a sequence gives the same number of pages from each of them (the exact page quota per
  // (layer, group) of a fixed budget) and never strips one group while another keeps all. A
  // round's value, the one other sequences are compared by, is the mean of its units' values,
  // made non-decreasing (a round without the shortest lists may average lower).
  for (size_t i = 1; i < units.size(); ++i) {
    const bool same =
        units[i].layer == units[i - 1].layer && units[i].first_group == units[i - 1].first_group;
    units[i].round = same ? units[i - 1].round + 1 : 0;
  }
  std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
    return std::tie(a.round, a.value, a.layer, a.first_group, a.page) <
           std::tie(b.round, b.value, b.layer, b.first_group, b.page);
  });
  float value = 0.0f;
  for (size_t begin = 0, end = 0; begin < units.size(); begin = end) {
    double sum = 0.0;
    for (end = begin; end < units.size() && units[end].round == units[begin].round; ++end) {
      sum += units[end].value;
    }
    const auto mean = static_cast<float>(sum / static_cast<double>(end - begin));
    value = begin == 0 ? mean : std::max(value, mean);
    for (size_t i = begin; i < end; ++i) units[i].value = value;
  }
  return units;
}

CacheState::Eviction CacheState::PlanEviction(const Sequence& sequence,
                                              const SequencePressure& terms, int64_t quota,
                                              std::span<const int32_t> layers) const {
  Eviction eviction;
  eviction.pages.assign(
      static_cast<size_t>(geometry_.layers),
      std::vector<std::vector<int32_t>>(static_cast<size_t>(geometry_.kv_groups)));
  if (!terms.auto_budget || quota <= 0) return eviction;
  std::vector<bool> in_layers;
  if (!layers.empty()) {
    in_layers.assign(static_cast<size_t>(geometry_.layers), false);
    for (const int32_t layer : layers) in_layers[static_cast<size_t>(layer)] = true;
  }
  int64_t live_in = 0;
  int64_t live_all = 0;
  const std::vector<Unit> units =
      EvictableUnits(sequence, terms, geometry_, UnitGroups(), in_layers, &live_in, &live_all);
  const int64_t keep = std::max(quota, FloorOf(sequence, terms));
  // A decision of some layers takes only their part of the quota: the rest is the other
  // layers' to give when they are decided (or at the owner's next append).
  const int64_t excess =
      layers.empty() ? live_all - keep
                     : live_in - keep * static_cast<int64_t>(layers.size()) / geometry_.layers;
  const int64_t take = std::min<int64_t>(excess, static_cast<int64_t>(units.size()));
  for (int64_t i = 0; i < take; ++i) {
    const Unit& unit = units[static_cast<size_t>(i)];
    int32_t own = 0;
    FrameId frame = kNoFrame;
    for (int32_t g = unit.first_group; g < unit.first_group + UnitGroups(); ++g) {
      const FrameId entry = sequence.block_table(unit.layer, g)[static_cast<size_t>(unit.page)];
      if (entry == kNoFrame) continue;
      frame = entry;
      ++own;
      eviction.pages[static_cast<size_t>(unit.layer)][static_cast<size_t>(g)].push_back(
          static_cast<int32_t>(unit.page));
    }
    ++eviction.units;
    if (pool_->refcount(frame) == own) ++eviction.frames_freed;
  }
  for (auto& groups : eviction.pages) {
    for (auto& pages : groups) std::sort(pages.begin(), pages.end());
  }
  return eviction;
}

absl::StatusOr<std::vector<ApplyResult>> CacheState::ApplyEviction(Sequence& sequence,
                                                                   SequencePressure& terms,
                                                                   const Eviction& eviction) {
  std::vector<LayerKeep> keeps;
  std::vector<ApplyResult> results;
  const int64_t pages = sequence.page_count();
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    const auto& evict = eviction.pages[static_cast<size_t>(layer)];
    if (std::all_of(evict.begin(), evict.end(), [](const auto& p) { return p.empty(); })) continue;
    LayerKeep keep;
    keep.layer = layer;
    for (int32_t g = 0; g < geometry_.kv_groups; ++g) {
      const std::vector<FrameId>& table = sequence.block_table(layer, g);
      const std::vector<int32_t>& gone = evict[static_cast<size_t>(g)];
      std::vector<int32_t> kept;
      for (int64_t page = 0; page < pages; ++page) {
        if (table[static_cast<size_t>(page)] == kNoFrame) continue;
        if (std::binary_search(gone.begin(), gone.end(), static_cast<int32_t>(page))) continue;
        kept.push_back(static_cast<int32_t>(page));
      }
      keep.kept_pages_per_group.push_back(std::move(kept));
    }
    ASSIGN_OR_RETURN(ApplyResult result, sequence.ApplyDecision(layer, sequence.length(),
                                                                keep.kept_pages_per_group, *pool_));
    for (const auto& evicted : result.evicted_pages_per_group) {
      pages_evicted_total_ += static_cast<int64_t>(evicted.size());
    }
    frames_freed_total_ += result.frames_released;
    keeps.push_back(std::move(keep));
    results.push_back(std::move(result));
  }
  if (keeps.empty()) return results;
  if (journal_ != nullptr) journal_->DecisionApplied(sequence, keeps, results);
  (terms.quota_reason == ReclaimReason::kAdmission ? counters_.frames_reclaimed_admission
                                                   : counters_.frames_reclaimed_target) +=
      eviction.units;
  return results;
}

int64_t CacheState::OwedFrames() const {
  int64_t owed = 0;
  for (const auto& [id, terms] : terms_) {
    if (terms.quota_frames <= 0) continue;
    const auto it = sequences_.find(id);
    if (it == sequences_.end()) continue;
    owed += std::max<int64_t>(0, it->second.live_frames() - terms.quota_frames);
  }
  return owed;
}

int64_t CacheState::PlanQuotas(int64_t demand, ReclaimReason reason) {
  const int64_t owed = OwedFrames();
  if (demand - owed <= 0) return owed;
  // Without a scored sequence with a server-chosen budget there is nothing to plan: a pool of
  // fixed budgets pays one pass over its terms, never a walk of its block tables.
  if (std::none_of(terms_.begin(), terms_.end(), [](const auto& entry) {
        return entry.second.auto_budget && !entry.second.shares.empty();
      })) {
    return owed;
  }
  // Tenants: the configured ones in order, then the default tenant "".
  const std::vector<TenantShare>& configured = pressure_options_.tenants;
  std::vector<ReclaimTenant> tenants(configured.size() + 1);
  const auto tenant_index = [&configured](const std::string& name) {
    for (size_t i = 0; i < configured.size(); ++i) {
      if (configured[i].name == name) return static_cast<int>(i);
    }
    return static_cast<int>(configured.size());
  };
  const int64_t capacity = pool_->capacity_frames();
  for (size_t i = 0; i < configured.size(); ++i) {
    tenants[i].guaranteed_frames =
        static_cast<int64_t>(std::floor(configured[i].share * static_cast<double>(capacity)));
  }
  std::vector<std::string> ids;
  std::vector<ReclaimCandidate> candidates;
  std::vector<int64_t> effective;  // each candidate's live frames less what it already owes
  // In id order, so that a tie between sequences goes the same way on every run.
  std::vector<std::pair<std::string, const Sequence*>> resident;
  for (const auto& [id, sequence] : sequences_) resident.emplace_back(id, &sequence);
  std::sort(resident.begin(), resident.end());
  for (const auto& [id, sequence_ptr] : resident) {
    const Sequence& sequence = *sequence_ptr;
    SequencePressure& terms = TermsOf(id);
    const bool reclaimable = terms.auto_budget && !terms.shares.empty();
    if (!reclaimable && configured.empty()) continue;  // one tenant: its holding is the pool's
    const int64_t live = sequence.live_frames();
    const int tenant = tenant_index(terms.tenant);
    tenants[static_cast<size_t>(tenant)].used_frames += live;
    if (!reclaimable) continue;
    const int64_t kept = terms.quota_frames > 0 ? std::min(terms.quota_frames, live) : live;
    const int64_t room = kept - FloorOf(sequence, terms);
    if (room <= 0) continue;
    int64_t live_in = 0;
    int64_t live_all = 0;
    const std::vector<Unit> units =
        EvictableUnits(sequence, terms, geometry_, UnitGroups(), {}, &live_in, &live_all);
    const auto owes = static_cast<size_t>(std::min<int64_t>(live - kept, units.size()));
    const size_t last = std::min(units.size(), owes + static_cast<size_t>(room));
    if (last <= owes) continue;
    ReclaimCandidate candidate{.tenant = tenant, .priority = terms.priority, .values = {}};
    for (size_t i = owes; i < last; ++i) candidate.values.push_back(units[i].value);
    ids.push_back(id);
    candidates.push_back(std::move(candidate));
    effective.push_back(kept);
  }
  if (configured.empty()) tenants.back().used_frames = pool_->used_frames();
  const ReclaimPlan plan = PlanReclaim(tenants, candidates, demand - owed);
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (plan.frames[c] == 0) continue;
    SequencePressure& terms = TermsOf(ids[c]);
    terms.quota_frames = effective[c] - plan.frames[c];
    terms.quota_reason = reason;
    JournalTerms(ids[c], terms);
  }
  return owed + plan.planned;
}

int64_t CacheState::ReservedFrames(absl::string_view sequence_id, int32_t priority,
                                   int64_t order) const {
  int64_t reserved = 0;
  const absl::Time now = Now();
  for (const auto& [id, pending] : pending_) {
    if (id == sequence_id || now - pending.last_attempt > pressure_options_.admission_hold) {
      continue;
    }
    if (pending.priority > priority || (pending.priority == priority && pending.order < order)) {
      reserved += pending.need;
    }
  }
  return reserved;
}

int64_t CacheState::AdmissionOrder(absl::string_view sequence_id) {
  const auto it = pending_.find(sequence_id);
  if (it != pending_.end() && Now() - it->second.last_attempt <= pressure_options_.admission_hold) {
    return it->second.order;
  }
  return next_order_++;
}

void CacheState::NoteOwnerCall(absl::string_view sequence_id) {
  const absl::Time now = Now();
  const auto [it, inserted] = last_call_.try_emplace(std::string(sequence_id), now);
  if (inserted) return;
  const double gap_ms = absl::ToDoubleMilliseconds(now - it->second);
  it->second = now;
  call_interval_ms_ = call_interval_ms_ <= 0.0 ? gap_ms : 0.8 * call_interval_ms_ + 0.2 * gap_ms;
}

int64_t CacheState::RetryAfterMs() const {
  if (call_interval_ms_ <= 0.0) return 100;  // no owner has called twice yet
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(call_interval_ms_)), 1, 10000);
}

absl::Status CacheState::Refuse(absl::string_view sequence_id, int64_t need, int64_t available,
                                int32_t priority, int64_t order, bool admission,
                                AdmissionRefusal* refusal) {
  AdmissionRefusal out;
  out.missing_frames = need - std::max<int64_t>(available, 0);
  const int64_t free = pool_->even_free_frames();
  const int64_t held = free - available;
  std::string why = absl::StrCat("pool exhausted: \"", sequence_id, "\" needs ", need, " frames, ",
                                 free, " free of ", pool_->capacity_frames());
  if (held > 0) absl::StrAppend(&why, " (", held, " held for older admissions)");
  if (pool_->free_lists() > 1) {
    absl::StrAppend(&why, "; free frames count ", pool_->free_lists(),
                    " ranks x the fewest free on one rank, since growth takes as many frames "
                    "from each rank");
  }
  if (need > pool_->capacity_frames()) {
    // Nothing the pool could do would fit it: no quotas, no place kept, nobody preempted.
    out.refused = true;
    out.retry_after_ms = 0;
    counters_.admissions_refused++;
    if (refusal != nullptr) *refusal = out;
    return absl::ResourceExhaustedError(
        absl::StrCat(why, "; more than the pool holds, it can never fit"));
  }
  // What must be freed before it fits: its own missing frames and, when older admissions hold
  // more than is free, the rest of theirs (planned for once, by whichever asks).
  const int64_t shortfall = need - available;
  out.reclaiming_frames = PlanQuotas(shortfall, ReclaimReason::kAdmission);
  out.retry_after_ms = RetryAfterMs();
  const bool delayed = out.reclaiming_frames >= shortfall;
  if (admission) {
    auto [it, inserted] = pending_.try_emplace(std::string(sequence_id));
    if (inserted) it->second.order = order;
    it->second.need = delayed ? need : 0;  // only a delayed admission holds frames back
    it->second.priority = priority;
    it->second.last_attempt = Now();
  }
  if (delayed) {
    counters_.admissions_delayed++;
    absl::StrAppend(&why, "; ", out.reclaiming_frames,
                    " frames are being reclaimed from sequences with server-chosen budgets at "
                    "their owners' next calls: retry in about ",
                    out.retry_after_ms, " ms");
  } else {
    out.refused = true;
    counters_.admissions_refused++;
    std::vector<VictimCandidate> victims;
    for (const auto& [id, sequence] : sequences_) {
      if (id == sequence_id) continue;
      const SequencePressure& terms = TermsOf(id);
      // Counted exactly for sequences with server-chosen budgets (their tables may be sparse);
      // for the others, their uncompressed frames (a bound, and O(1)).
      const int64_t frees =
          terms.auto_budget ? sequence.live_frames() : UncompressedFrames(sequence.page_count());
      victims.push_back(
          {.id = id, .priority = terms.priority, .admitted = terms.admitted, .frees = frees});
    }
    out.preempt = ChooseVictims(victims, priority, order, shortfall - out.reclaiming_frames);
    std::sort(out.preempt.begin(), out.preempt.end());
    for (const std::string& id : out.preempt) {
      SequencePressure& terms = TermsOf(id);
      if (terms.preempt) continue;
      terms.preempt = true;
      counters_.preemptions++;
      JournalTerms(id, terms);
    }
    absl::StrAppend(&why, "; ", out.reclaiming_frames,
                    " frames are being reclaimed and every other sequence with a server-chosen "
                    "budget is at its floor");
    if (!out.preempt.empty()) {
      absl::StrAppend(&why, "; asked the owners of ", out.preempt.size(),
                      " sequences to preempt them (", absl::StrJoin(out.preempt, ", "),
                      "): retry in about ", out.retry_after_ms, " ms");
    } else {
      absl::StrAppend(&why, "; no sequence may be preempted for it: close sequences first");
    }
  }
  if (refusal != nullptr) *refusal = std::move(out);
  return absl::ResourceExhaustedError(why);
}

void CacheState::Rebalance() {
  const absl::Time now = Now();
  absl::erase_if(pending_, [&](const auto& entry) {
    return now - entry.second.last_attempt > pressure_options_.admission_hold;
  });
  const auto capacity = static_cast<double>(pool_->capacity_frames());
  const auto used = static_cast<double>(pool_->used_frames());
  const double target = pressure_options_.target_occupancy * capacity;
  if (used > target) {
    PlanQuotas(static_cast<int64_t>(std::ceil(used - target)), ReclaimReason::kTarget);
    return;
  }
  // An admission still waiting (delayed, or refused and waiting for its victims) keeps them.
  if (!pending_.empty() ||
      used > (pressure_options_.target_occupancy - kQuotaHysteresis) * capacity) {
    return;
  }
  for (auto& [id, terms] : terms_) {
    if (terms.quota_frames == 0 && !terms.preempt) continue;
    terms.quota_frames = 0;
    terms.quota_reason = ReclaimReason::kNone;
    terms.preempt = false;
    JournalTerms(id, terms);
  }
}

PressureReport CacheState::ReportOf(const Sequence* sequence, const SequencePressure& terms) const {
  PressureReport report;
  report.quota_frames = terms.quota_frames;
  // Counting live frames walks the block tables: done for sequences with a server-chosen
  // budget only, so a decode step of a long fixed-budget sequence stays O(1) here.
  if (sequence != nullptr && terms.auto_budget) {
    report.live_frames = sequence->live_frames();
    report.floor_frames = FloorOf(*sequence, terms);
  }
  report.occupancy =
      static_cast<double>(pool_->used_frames()) / static_cast<double>(pool_->capacity_frames());
  report.target_occupancy = pressure_options_.target_occupancy;
  report.preempt = terms.preempt;
  return report;
}

absl::StatusOr<PressureReport> CacheState::Pressure(absl::string_view sequence_id) const {
  absl::MutexLock lock(&mu_);
  const auto terms = terms_.find(sequence_id);
  const auto it = sequences_.find(sequence_id);
  if (terms == terms_.end() || (it == sequences_.end() && !swapped_.contains(sequence_id))) {
    return Missing("sequence", sequence_id);
  }
  return ReportOf(it == sequences_.end() ? nullptr : &it->second, terms->second);
}

void CacheState::AdoptTerms(absl::string_view sequence_id, const SequenceTerms& terms) {
  SequencePressure& pressure = TermsOf(sequence_id);
  pressure = SequencePressure();
  pressure.tenant = terms.tenant;
  pressure.priority = terms.priority;
  pressure.auto_budget = terms.auto_floor.has_value();
  if (terms.auto_floor.has_value()) pressure.floor_fraction = *terms.auto_floor;
  pressure.admitted = AdmissionOrder(sequence_id);
  // Default terms need no record: a sequence recovered without one gets them back.
  if (!terms.tenant.empty() || terms.priority != kMinPriority || terms.auto_floor.has_value()) {
    JournalTerms(sequence_id, pressure);
  }
}

absl::StatusOr<AppendResult> CacheState::AppendTokens(absl::string_view sequence_id, int64_t tokens,
                                                      const AppendOptions& options) {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  Sequence& sequence = it->second;
  SequencePressure& terms = TermsOf(sequence_id);
  NoteOwnerCall(sequence_id);
  const int64_t old_bytes = sequence.bookkeeping_bytes();
  const absl::Cleanup settle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { SettleDaemon(); };
  if (tokens >= 0 && tokens <= kMaxSequenceTokens - sequence.length()) {
    RETURN_IF_ERROR(
        ReserveGrowth(sequence_id, old_bytes,
                      sequence.BookkeepingBytesWithCapacity(sequence.TableCapacityAfter(tokens))));
  }
  ASSIGN_OR_RETURN(const int64_t need, sequence.FramesNeeded(tokens, *pool_));
  const int64_t order = terms.admitted;
  const int64_t reserved =
      options.admission ? ReservedFrames(sequence_id, terms.priority, order) : 0;
  Eviction own = PlanEviction(sequence, terms, terms.quota_frames, {});
  int64_t available = pool_->even_free_frames() + own.frames_freed - reserved;
  if (need > available) {
    // Quotas for the others (and perhaps a lower one for this sequence, taken now: its owner
    // is the caller).
    PlanQuotas(need - available, ReclaimReason::kAdmission);
    own = PlanEviction(sequence, terms, terms.quota_frames, {});
    available = pool_->even_free_frames() + own.frames_freed - reserved;
    if (need > available) {
      return Refuse(sequence_id, need, available, terms.priority, order, options.admission,
                    options.refusal);
    }
  }
  AppendResult result;
  if (own.units > 0) {
    ASSIGN_OR_RETURN(const std::vector<ApplyResult> applied, ApplyEviction(sequence, terms, own));
    (void)applied;
    for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
      for (int32_t g = 0; g < geometry_.kv_groups; ++g) {
        const auto& pages = own.pages[static_cast<size_t>(layer)][static_cast<size_t>(g)];
        if (!pages.empty()) result.evicted.push_back({layer, g, pages});
      }
    }
    result.reclaimed_frames = own.units;
  }
  ASSIGN_OR_RETURN(AppendResult appended, sequence.Append(tokens, *pool_));
  appended.evicted = std::move(result.evicted);
  appended.reclaimed_frames = result.reclaimed_frames;
  sequence_bookkeeping_bytes_ += sequence.bookkeeping_bytes() - old_bytes;
  bytes_copied_total_ += appended.frames_copied * pool_->frame_bytes();
  if (journal_ != nullptr) {
    int64_t first_changed = sequence.page_count();
    for (const FrameAssignment& frame : appended.new_frames) {
      first_changed = std::min(first_changed, frame.page);
    }
    journal_->TokensAppended(sequence, first_changed);
  }
  if (options.admission) pending_.erase(sequence_id);
  Rebalance();
  return appended;
}

absl::StatusOr<AutoResult> CacheState::ApplyAutoDecision(absl::string_view sequence_id,
                                                         int64_t decided_tokens,
                                                         std::span<const AutoLayer> layers,
                                                         const AutoTerms& auto_terms) {
  if (layers.empty()) return absl::InvalidArgumentError("a decision needs at least one layer");
  if (auto_terms.floor_fraction.has_value()) {
    RETURN_IF_ERROR(ValidateFloor("budget.auto_budget.floor_fraction", *auto_terms.floor_fraction));
  }
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  Sequence& sequence = it->second;
  const int64_t pages = sequence.page_count();
  std::vector<bool> seen(static_cast<size_t>(geometry_.layers), false);
  const std::vector<std::vector<int32_t>> nothing(static_cast<size_t>(geometry_.kv_groups));
  for (const AutoLayer& layer : layers) {
    if (absl::Status checked = sequence.CheckDecision(layer.layer, decided_tokens, nothing);
        !checked.ok()) {
      return absl::Status(checked.code(),
                          absl::StrCat("layer ", layer.layer, ": ", checked.message()));
    }
    if (seen[static_cast<size_t>(layer.layer)]) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", layer.layer, " appears twice"));
    }
    seen[static_cast<size_t>(layer.layer)] = true;
    if (layer.page_scores.size() != static_cast<size_t>(geometry_.kv_groups)) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer.layer, ": page scores of ", layer.page_scores.size(),
                       " groups, the model has ", geometry_.kv_groups,
                       " (the policy must rank pages: a pooling policy)"));
    }
    for (const std::vector<float>& scores : layer.page_scores) {
      if (static_cast<int64_t>(scores.size()) != pages) {
        return absl::FailedPreconditionError(absl::StrCat(
            "layer ", layer.layer, ": ", scores.size(), " page scores for ", pages, " pages"));
      }
    }
  }
  SequencePressure& terms = TermsOf(sequence_id);
  NoteOwnerCall(sequence_id);
  // The shares' bookkeeping, reserved before they grow.
  const absl::Cleanup settle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { SettleDaemon(); };
  const int64_t old_bytes = SharesBytes(terms);
  const int64_t new_bytes =
      std::max(old_bytes, static_cast<int64_t>(geometry_.layers) * geometry_.kv_groups * pages *
                              static_cast<int64_t>(sizeof(float)));
  if (limits_.daemon != nullptr && new_bytes > old_bytes) {
    RETURN_IF_ERROR(limits_.daemon->Reserve(new_bytes - old_bytes,
                                            absl::StrCat("sequence \"", sequence_id, "\"")));
    daemon_reserved_bytes_ += new_bytes - old_bytes;
  }
  terms.auto_budget = true;
  if (auto_terms.floor_fraction.has_value()) terms.floor_fraction = *auto_terms.floor_fraction;
  terms.protect_tail = auto_terms.protect_tail;
  terms.sink_pages = auto_terms.sink_pages;
  terms.recent_pages = auto_terms.recent_pages;
  terms.shares.resize(static_cast<size_t>(geometry_.layers) * geometry_.kv_groups);
  std::vector<int32_t> decided;
  for (const AutoLayer& layer : layers) {
    decided.push_back(layer.layer);
    for (int32_t g = 0; g < geometry_.kv_groups; ++g) {
      const std::vector<FrameId>& table = sequence.block_table(layer.layer, g);
      std::vector<uint8_t> live(table.size());
      for (size_t page = 0; page < table.size(); ++page) live[page] = table[page] != kNoFrame;
      std::vector<float>& shares =
          terms.shares[static_cast<size_t>(layer.layer) * geometry_.kv_groups + g];
      shares = PageShares(layer.page_scores[static_cast<size_t>(g)], live);
      shares.reserve(static_cast<size_t>(sequence.table_capacity()));
    }
  }
  shares_bookkeeping_bytes_ += SharesBytes(terms) - old_bytes;
  if (journal_ != nullptr) {
    for (const int32_t layer : decided) journal_->SharesSet(sequence_id, terms, layer);
  }
  // Scored now, the sequence may give toward the target: plan before fitting it.
  const double target =
      pressure_options_.target_occupancy * static_cast<double>(pool_->capacity_frames());
  if (static_cast<double>(pool_->used_frames()) > target) {
    PlanQuotas(static_cast<int64_t>(std::ceil(pool_->used_frames() - target)),
               ReclaimReason::kTarget);
  }
  const Eviction eviction = PlanEviction(sequence, terms, terms.quota_frames, decided);
  ASSIGN_OR_RETURN(std::vector<ApplyResult> applied, ApplyEviction(sequence, terms, eviction));
  AutoResult result;
  result.reclaimed_frames = eviction.units;
  size_t next = 0;  // applied holds the touched layers in ascending order
  std::vector<std::pair<int32_t, ApplyResult>> by_layer;
  for (int32_t layer = 0; layer < geometry_.layers && next < applied.size(); ++layer) {
    const auto& evict = eviction.pages[static_cast<size_t>(layer)];
    if (std::all_of(evict.begin(), evict.end(), [](const auto& p) { return p.empty(); })) continue;
    by_layer.emplace_back(layer, std::move(applied[next++]));
  }
  for (const int32_t layer : decided) {
    ApplyResult none;
    none.evicted_pages_per_group.resize(static_cast<size_t>(geometry_.kv_groups));
    const auto found = std::find_if(by_layer.begin(), by_layer.end(),
                                    [layer](const auto& entry) { return entry.first == layer; });
    result.layers.push_back(found != by_layer.end() ? std::move(found->second) : std::move(none));
  }
  decisions_total_ += static_cast<int64_t>(layers.size());
  JournalTerms(sequence_id, terms);
  Rebalance();
  return result;
}

SequenceInfo CacheState::DescribeWithTerms(const Sequence& sequence, bool with_block_tables) const {
  SequenceInfo info = Describe(sequence, with_block_tables);
  if (const auto terms = terms_.find(sequence.id()); terms != terms_.end()) {
    info.tenant = terms->second.tenant;
    info.priority = terms->second.priority;
    info.pressure = ReportOf(nullptr, terms->second);
    info.pressure.live_frames = info.live_frames;  // counted by Describe already
    info.pressure.floor_frames = FloorOf(sequence, terms->second);
  }
  return info;
}

PressureStats CacheState::PressureStatsLocked() const {
  PressureStats stats = counters_;
  stats.target_occupancy = pressure_options_.target_occupancy;
  stats.sequences_swapped = static_cast<int64_t>(swapped_.size());
  stats.swapped_bytes = swapped_bytes_;
  const std::vector<TenantShare>& configured = pressure_options_.tenants;
  const int64_t capacity = pool_->capacity_frames();
  for (const TenantShare& tenant : configured) {
    stats.tenants.push_back({.tenant = tenant.name,
                             .used_frames = 0,
                             .share = tenant.share,
                             .guaranteed_frames = static_cast<int64_t>(
                                 std::floor(tenant.share * static_cast<double>(capacity)))});
  }
  stats.tenants.push_back({.tenant = "", .used_frames = 0, .share = 0.0, .guaranteed_frames = 0});
  if (configured.empty()) {  // one tenant: no walk over the block tables
    stats.tenants.back().used_frames = pool_->used_frames();
    return stats;
  }
  for (const auto& [id, sequence] : sequences_) {
    const auto terms = terms_.find(id);
    const std::string tenant = terms == terms_.end() ? "" : terms->second.tenant;
    for (TenantUsageStats& usage : stats.tenants) {
      if (usage.tenant == tenant) {
        usage.used_frames += sequence.live_frames();
        break;
      }
    }
  }
  return stats;
}

}  // namespace entrokv
