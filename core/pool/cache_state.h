// CacheState: everything the daemon holds for one registered model.
#ifndef ENTROKV_CORE_POOL_CACHE_STATE_H_
#define ENTROKV_CORE_POOL_CACHE_STATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/pool/arena.h"
#include "core/pool/bookkeeping_budget.h"
#include "core/pool/cache_journal.h"
#include "core/pool/geometry.h"
#include "core/pool/page_pool.h"
#include "core/pool/pressure.h"
#include "core/pool/sequence.h"
#include "core/util/dtype.h"

namespace entrokv {

// Bounds on one model's bookkeeping, the daemon memory a model costs besides its arena; 0 leaves
// a bound off. Checked under the CacheState's lock, so concurrent calls cannot pass one
// together; a call beyond one gets RESOURCE_EXHAUSTED naming it and changes nothing.
struct CacheLimits {
  int64_t max_sequences_per_model = 0;         // open sequences
  int64_t max_sequence_bookkeeping_bytes = 0;  // one sequence's (Sequence::bookkeeping_bytes)
  int64_t max_model_bookkeeping_bytes = 0;     // the pool's plus every sequence's
  // Every model's bookkeeping together: the model reserves there what it accounts, before it
  // allocates (its pool's arrays before the arena exists). Not owned; must outlive the
  // CacheState. Null: no daemon-wide bound.
  BookkeepingBudget* daemon = nullptr;
};

struct CacheOptions {
  ModelGeometry geometry;
  FrameLayout layout = FrameLayout::kGroup;
  Backend backend = Backend::kHost;
  // The pool gets capacity_bytes / frame_bytes frames (floor; in the group layout with t ranks
  // down to a multiple of t, an equal share per rank's arena).
  int64_t capacity_bytes = 0;
  std::string name;  // the pool's name (metric label, arena name hint)
  // The device of each tensor-parallel rank's arena (PagePoolOptions::devices); capacity_bytes
  // is split evenly over the ranks.
  std::vector<int> devices = {0};
  // Host backend, per rank: the arena's exact name, attach or keep it; missing: the default.
  std::vector<HostArenaSource> host_arenas;
  CacheLimits limits;
  PressureOptions pressure;  // server-chosen budgets, admission, tenants, swapping
};

// One sequence as a journal recorded it, for Restore.
struct SequenceSnapshot {
  std::string id;
  int64_t length = 0;
  std::vector<std::vector<FrameId>> tables;       // [layer * kv_groups + group][page]
  std::vector<std::vector<double>> head_weights;  // [layer]: empty or query_heads values
  std::vector<std::vector<float>> running_sums;   // empty, or [layer]: see Sequence::running_sum
  std::optional<SequencePressure> pressure;       // absent: default terms
};

struct SequenceInfo {
  std::string id;
  int64_t length = 0;
  int64_t live_frames = 0;  // distinct frames referenced, shared ones included
  // [layer][group][page]: frame id or kNoFrame; empty unless asked for.
  std::vector<std::vector<std::vector<FrameId>>> block_tables;
  std::string tenant;
  int32_t priority = 0;
  PressureReport pressure;  // reclaimed_frames 0
};

// AppendTokens' options (pool pressure).
struct AppendOptions {
  // The first tokens of a new sequence (OpenSequence's initial_tokens): an admission, which
  // waits behind older refused admissions of at least its priority. A running sequence's
  // growth does not.
  bool admission = false;
  // Filled when the call fails RESOURCE_EXHAUSTED because the pool lacks frames.
  AdmissionRefusal* refusal = nullptr;
};

// One layer of a decision with a server-chosen budget: the groups' pooled page scores
// (GroupDecision::page_scores), one per page.
struct AutoLayer {
  int32_t layer = 0;
  std::vector<std::vector<float>> page_scores;  // [group][page]
};
// The terms of such a decision.
struct AutoTerms {
  std::optional<double> floor_fraction;  // unset: the sequence's (an auto sequence's) or 1
  bool protect_tail = true;
  int64_t sink_pages = 0;
  int64_t recent_pages = 0;
};
// What it did.
struct AutoResult {
  std::vector<ApplyResult> layers;  // per decided layer, in order
  int64_t reclaimed_frames = 0;     // units the quota took (every layer)
};

struct SwapOutResult {
  int64_t freed_frames = 0;
  int64_t swapped_bytes = 0;
};

// One page of a listing (CacheState::ListSequencePage).
struct ListOptions {
  std::string after_id;       // only ids sorting after this one; empty: from the first
  int64_t max_sequences = 1;  // >= 1
  bool with_block_tables = false;
  // With block tables: entries a page may hold, counting each table once and each of its
  // pages once (so the reply built from it is bounded too); the sequence that would go past
  // it starts the next page. 0: unbounded.
  int64_t max_table_entries = 0;
};

struct SequencePage {
  std::vector<SequenceInfo> sequences;  // sorted by id
  bool more = false;                    // sequences sort after the last one listed
};

// Maps 1:1 to the daemon's metrics (docs/architecture.md §6):
// entrokv_pool_frames{state="used|free"} = used_frames / free_frames, entrokv_pool_capacity_bytes =
// capacity_bytes, entrokv_sequences_active = sequences_active, entrokv_pages_evicted_total =
// pages_evicted_total (block-table entries evicted, one per (layer, group, page));
// frames_freed_total counts frames actually returned by evictions (fewer when shared or, in kLayer,
// while another group keeps the page).
struct PoolStats {
  int64_t capacity_frames = 0;
  int64_t used_frames = 0;
  int64_t free_frames = 0;
  int64_t frame_bytes = 0;
  int64_t capacity_bytes = 0;  // capacity_frames * frame_bytes
  int64_t sequences_active = 0;
  int64_t sequences_lost = 0;  // marked lost at recovery and not yet closed by their clients
  std::vector<int64_t> used_frames_per_layer;
  int64_t pages_evicted_total = 0;
  int64_t frames_freed_total = 0;
  int64_t bytes_moved_total = 0;   // eviction moves no data: always 0
  int64_t bytes_copied_total = 0;  // copy-on-write of shared tail pages on append
  int64_t decisions_total = 0;     // layer decisions applied
  // The pool's and every sequence's accounted bookkeeping (entrokv_pool_bookkeeping_bytes):
  // PagePool::BookkeepingBytes plus Sequence::bookkeeping_bytes of each open sequence, plus the
  // page shares of sequences with server-chosen budgets and swapped-out sequences' tables.
  int64_t bookkeeping_bytes = 0;
  PressureStats pressure;
};

// Owns one PagePool and every open sequence of one model. Thread-safe: every method takes the
// internal mutex, so calls are linearizable; each call is all-or-nothing (validated first,
// then applied), so a failed call changes nothing. Frames handed out stay valid until the
// sequence evicts them or closes; the CacheState must outlive any worker use of the arena.
//
// Layout rules (see Sequence): in kLayer all groups of a layer share one frame per page,
// freed when every group evicts it; appending after the partial tail page was evicted gives
// that page a fresh frame; appending into a tail page shared by a fork copies it first.
class CacheState {
 public:
  // INVALID_ARGUMENT for a bad geometry or when capacity_bytes holds 0 frames;
  // RESOURCE_EXHAUSTED naming max_bookkeeping_bytes when limits.daemon has no room for the
  // pool's bookkeeping (checked before the arena is made); the backend's error when the arena
  // cannot be made (UNIMPLEMENTED for cuda not built in).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CacheState>> Create(
      const CacheOptions& options);

  // RESOURCE_EXHAUSTED naming the limit when options.limits leave no room for one sequence:
  // an empty sequence of the geometry beyond max_sequence_bookkeeping_bytes, or the pool's
  // bookkeeping with it beyond max_model_bookkeeping_bytes. O(1), before any arena exists.
  // REQUIRES: ValidateGeometry(options.geometry).ok().
  [[nodiscard]] static absl::Status CheckLimits(const CacheOptions& options);

  CacheState(const CacheState&) = delete;
  CacheState& operator=(const CacheState&) = delete;
  ~CacheState();

  // A new sequence holding frames for `initial_tokens`. INVALID_ARGUMENT for an empty id or
  // negative tokens, ALREADY_EXISTS when open, RESOURCE_EXHAUSTED (and no sequence) when the
  // frames are not there or a CacheLimits bound would be passed (naming it).
  [[nodiscard]] absl::Status OpenSequence(absl::string_view sequence_id, int64_t initial_tokens);
  // A new sequence sharing parent's first prefix_pages pages; see Sequence::Fork. NOT_FOUND
  // parent, ALREADY_EXISTS id, INVALID_ARGUMENT empty id or prefix_pages < 0, OUT_OF_RANGE
  // prefix_pages > the parent's pages; RESOURCE_EXHAUSTED naming a CacheLimits bound.
  [[nodiscard]] absl::Status ForkSequence(absl::string_view sequence_id,
                                          absl::string_view parent_id, int64_t prefix_pages);
  // See Sequence::Append. NOT_FOUND unknown id; RESOURCE_EXHAUSTED naming the bound when the
  // sequence's or the model's bookkeeping would pass its CacheLimits bound.
  [[nodiscard]] absl::StatusOr<AppendResult> AppendTokens(absl::string_view sequence_id,
                                                          int64_t tokens);
  // See Sequence::Truncate; page shares past the new end go too. NOT_FOUND unknown id.
  [[nodiscard]] absl::StatusOr<TruncateResult> TruncateSequence(absl::string_view sequence_id,
                                                                int64_t tokens);
  // See Sequence::ApplyDecision. NOT_FOUND unknown id.
  [[nodiscard]] absl::StatusOr<ApplyResult> ApplyDecision(
      absl::string_view sequence_id, int32_t layer, int64_t decided_tokens,
      const std::vector<std::vector<int32_t>>& kept_pages_per_group);
  // Every layer of one decision, all or nothing under one lock: each layer is checked
  // (Sequence::CheckDecision) before the first is applied, so a concurrent AppendTokens or
  // CloseSequence lands wholly before (the call fails, nothing applied) or wholly after (every
  // layer applied, every freed frame reported). Running sums (LayerKeep::running_sum) are moved
  // into the sequence with the decision. Results in `layers` order. INVALID_ARGUMENT when a
  // layer appears twice or `layers` is empty; RESOURCE_EXHAUSTED naming the bound when the new
  // running sums pass a CacheLimits bound; otherwise ApplyDecision's errors, the message
  // prefixed with the layer.
  [[nodiscard]] absl::StatusOr<std::vector<ApplyResult>> ApplyDecisions(
      absl::string_view sequence_id, int64_t decided_tokens, std::vector<LayerKeep> layers);
  // Test hook: runs on the calling thread after every successful ApplyDecision(s), once the
  // lock is released, so a test can place a racing call exactly between two decisions.
  // Empty: none.
  void SetDecisionHookForTest(std::function<void()> hook);
  // Caches the prefill head weights of one layer (see Sequence::SetHeadWeights), so a later
  // decode-time decision reuses them. NOT_FOUND unknown id.
  [[nodiscard]] absl::Status SetHeadWeights(absl::string_view sequence_id, int32_t layer,
                                            std::vector<double> weights);
  // A tensor-parallel rank's rows of the cached weights: heads [first_head, first_head +
  // weights.size()) of `layer`; the other heads keep theirs, NaN (none) until their rank sets
  // them. NOT_FOUND unknown id; INVALID_ARGUMENT rows outside the heads, FAILED_PRECONDITION bad
  // layer.
  [[nodiscard]] absl::Status SetHeadWeightRows(absl::string_view sequence_id, int32_t layer,
                                               int32_t first_head, std::vector<double> weights);
  // The cached weights, empty when none. NOT_FOUND unknown id; FAILED_PRECONDITION bad layer.
  [[nodiscard]] absl::StatusOr<std::vector<double>> GetHeadWeights(absl::string_view sequence_id,
                                                                   int32_t layer) const;
  // A copy of the layer's running sum (Sequence::running_sum): query_heads rows of the tokens
  // it covers, empty when none. NOT_FOUND unknown id; FAILED_PRECONDITION bad layer.
  [[nodiscard]] absl::StatusOr<std::vector<float>> RunningSum(absl::string_view sequence_id,
                                                              int32_t layer) const;
  // Which pages of `layer` each group still holds, group-major, one entry per page of the
  // current length: 1 while the block table names a frame, 0 once evicted. Empty when every
  // page is held (nothing evicted yet), so a prefill decision pays nothing. A decode-time
  // decision passes it as LayerRequest::live_pages. NOT_FOUND unknown id; FAILED_PRECONDITION
  // bad layer.
  [[nodiscard]] absl::StatusOr<std::vector<uint8_t>> LivePages(absl::string_view sequence_id,
                                                               int32_t layer) const;
  // The keys of KV group `group` of `layer` as the worker wrote them into the sequence's
  // frames, stored as `dtype`: keys [length][head_dim] as floats and present [length], 1 where
  // the token's page still has a frame (0: its key is gone, zeros in keys). For query-agnostic
  // scores the daemon computes itself. INVALID_ARGUMENT naming `dtype` when its size is not the
  // geometry's element_bytes; FAILED_PRECONDITION for a pool whose arena is not host memory or
  // a bad layer or group; NOT_FOUND unknown id.
  struct KeyRows {
    std::vector<float> keys;
    std::vector<uint8_t> present;
  };
  [[nodiscard]] absl::StatusOr<KeyRows> ReadKeys(absl::string_view sequence_id, int32_t layer,
                                                 int group, DType dtype) const;
  // Releases every frame reference of the sequence. NOT_FOUND when unknown or already closed.
  // Closing a sequence marked lost succeeds and forgets it; closing a swapped-out one drops its
  // swapped bytes.
  [[nodiscard]] absl::Status CloseSequence(absl::string_view sequence_id);

  // ---- Pool pressure (cache_state_pressure.cc, cache_state_swap.cc) ----------------------
  // A sequence with server-chosen budget (terms.auto_floor, or an AutoDecision) gets a quota
  // when the pool is over its target occupancy or an admission does not fit; the quota is
  // applied at the sequence's own next AppendTokens or AutoDecision, never by another call, so
  // no frame leaves a sequence while its owner may still read it. Quotas never take the
  // sequence's floor, its protected pages or pages no decision scored.

  // OpenSequence / ForkSequence with pool-pressure terms (tenant, priority, auto budget);
  // INVALID_ARGUMENT naming the term (ValidateSequenceTerms) before anything changes.
  [[nodiscard]] absl::Status OpenSequence(absl::string_view sequence_id, int64_t initial_tokens,
                                          const SequenceTerms& terms);
  [[nodiscard]] absl::Status ForkSequence(absl::string_view sequence_id,
                                          absl::string_view parent_id, int64_t prefix_pages,
                                          const SequenceTerms& terms);
  // AppendTokens as an admission or a running sequence's growth. A sequence with a quota first
  // evicts down to it (AppendResult::evicted; only when the call succeeds). When the frames are
  // not there the daemon plans quotas for the others (PlanReclaim) and, if that is not enough,
  // names sequences to preempt; the call then fails RESOURCE_EXHAUSTED with nothing allocated
  // or evicted and options.refusal says why.
  [[nodiscard]] absl::StatusOr<AppendResult> AppendTokens(absl::string_view sequence_id,
                                                          int64_t tokens,
                                                          const AppendOptions& options);
  // A decision with a server-chosen budget over `layers` (each at most once): keeps each
  // layer's page shares, makes the sequence's budget the daemon's (terms.floor_fraction), and
  // evicts down to its quota among the decided layers (each taking its layers' part of the
  // quota). All or nothing, as ApplyDecisions; the same errors, plus FAILED_PRECONDITION when
  // a layer's scores do not match its groups or pages, INVALID_ARGUMENT for a bad floor.
  [[nodiscard]] absl::StatusOr<AutoResult> ApplyAutoDecision(absl::string_view sequence_id,
                                                             int64_t decided_tokens,
                                                             std::span<const AutoLayer> layers,
                                                             const AutoTerms& terms);
  // The sequence's quota and the pool's occupancy now. NOT_FOUND unknown id.
  [[nodiscard]] absl::StatusOr<PressureReport> Pressure(absl::string_view sequence_id) const;

  // Copies the sequence's live frames into a host swap arena and frees them; the sequence stays
  // open, swapped out (calls naming it get FAILED_PRECONDITION until Resume or Close).
  // FAILED_PRECONDITION for a cuda pool or with swapping off (max_swap_bytes 0);
  // RESOURCE_EXHAUSTED naming max_swap_bytes when the swapped bytes would pass it.
  [[nodiscard]] absl::StatusOr<SwapOutResult> SwapOut(absl::string_view sequence_id);
  // Copies a swapped-out sequence back into new frames (an admission, as AppendTokens with
  // options.admission) and returns every live entry of its new block tables. NOT_FOUND unknown;
  // FAILED_PRECONDITION for a resident sequence.
  [[nodiscard]] absl::StatusOr<AppendResult> Resume(absl::string_view sequence_id,
                                                    AdmissionRefusal* refusal);
  // The swapped-out sequences, sorted.
  [[nodiscard]] std::vector<std::string> SwappedIds() const;
  // Host arenas of swapped-out sequences (their names), for the daemon's arena bookkeeping.
  [[nodiscard]] std::vector<std::string> SwapArenaNames() const;

  // Crash recovery. Every later change is reported to `journal` (not owned; must outlive this,
  // or be reset to nullptr first). Destroying the CacheState reports nothing: a shutdown keeps
  // the journaled state for the next start.
  void SetJournal(CacheJournal* journal);
  // Rebuilds the sequences a journal recorded, and the pool from their block tables: every
  // frame's reference count is the number of entries naming it, the rest are free. DATA_LOSS
  // naming the first inconsistency (a bad shape, a frame outside the pool or named by two
  // layers, a kLayer page naming two frames, a duplicate id); FAILED_PRECONDITION unless no
  // sequence is open. All or nothing. Reports nothing to the journal.
  // Swapped-out sequences come back swapped out, their arenas attached by name; one whose arena
  // is gone is marked lost.
  [[nodiscard]] absl::Status Restore(std::vector<SequenceSnapshot> sequences,
                                     std::vector<SwappedSnapshot> swapped = {});
  // Sequences whose frames did not survive a restart (a cuda arena dies with its process):
  // calls naming them get FAILED_PRECONDITION "... was lost ...: <reason>" until the client
  // closes or reopens them.
  void MarkLost(const std::vector<std::string>& sequence_ids, const std::string& reason);

  // The sequence's length in tokens, O(1): what the decision path needs. NOT_FOUND unknown id.
  [[nodiscard]] absl::StatusOr<int64_t> SequenceLength(absl::string_view sequence_id) const;
  // The sequence's length and live frames (O(layers x groups x pages) to count); its block
  // tables only when asked (they are large:
  // layers x groups x pages entries).
  [[nodiscard]] absl::StatusOr<SequenceInfo> GetSequence(absl::string_view sequence_id,
                                                         bool with_block_tables = true) const;
  // Every sequence, sorted by id; unbounded (tests, and closing them all): clients list by page.
  [[nodiscard]] std::vector<SequenceInfo> ListSequences(bool with_block_tables) const;
  // Up to options.max_sequences sequences whose ids sort after options.after_id, in id order;
  // only the page's sequences are described, so its memory is bounded by the page, whatever
  // the model holds. Resuming after the last id listed is stable under concurrent opens and
  // closes: every sequence open throughout the walk is listed exactly once. RESOURCE_EXHAUSTED
  // when the first sequence's block tables alone exceed options.max_table_entries;
  // INVALID_ARGUMENT for max_sequences < 1.
  [[nodiscard]] absl::StatusOr<SequencePage> ListSequencePage(const ListOptions& options) const;
  [[nodiscard]] PoolStats Stats() const;

  // The pool's invariant plus: every frame's refcount equals the number of block-table
  // entries naming it, every entry names a used frame of its own layer, in kLayer a
  // (layer, page) names at most one frame. INTERNAL naming the first violation. O(capacity +
  // entries): for tests and debug checks.
  [[nodiscard]] absl::Status CheckInvariants() const;

  [[nodiscard]] const ModelGeometry& geometry() const { return geometry_; }
  [[nodiscard]] FrameLayout layout() const { return layout_; }
  [[nodiscard]] const std::string& name() const { return name_; }
  // Tensor-parallel ranks (one arena each) and rank `rank`'s arena, its device set.
  [[nodiscard]] int ranks() const { return ranks_; }
  [[nodiscard]] ArenaInfo arena(int rank = 0) const;
  // Which frames rank `rank`'s arena holds (PagePool::rank_span). REQUIRES: rank in [0, ranks()).
  [[nodiscard]] RankSpan rank_span(int rank) const;
  // The first byte of the frame's slice in rank `rank`'s arena (host address or device
  // address); for tests and local workers.
  [[nodiscard]] void* FrameAddress(FrameId frame, int rank = 0) const;

 private:
  CacheState(const CacheOptions& options, std::unique_ptr<PagePool> pool);
  // A rank's running-sum rows (LayerKeep::running_sum_heads > 0) made the whole layer's sum:
  // the other heads' rows from the sequence's, zero-padded to decided_tokens. INVALID_ARGUMENT
  // when the rows do not fit.
  [[nodiscard]] absl::Status MergeRunningSumRows(const Sequence& sequence, int64_t decided_tokens,
                                                 LayerKeep& keep) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static SequenceInfo Describe(const Sequence& sequence, bool with_block_tables);
  // NOT_FOUND "<what> "<id>" is not open", or FAILED_PRECONDITION when the id was lost.
  [[nodiscard]] absl::Status Missing(absl::string_view what, absl::string_view id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED naming the bound when a sequence (`sequence_id`) going from
  // `old_bytes` to `new_bytes` of bookkeeping passes a CacheLimits bound; otherwise the growth
  // is reserved in limits.daemon. Every caller settles (SettleDaemon) once it changed or failed.
  [[nodiscard]] absl::Status ReserveGrowth(absl::string_view sequence_id, int64_t old_bytes,
                                           int64_t new_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes what limits.daemon holds for this model equal to what the model accounts: gives back
  // a reservation a failed or smaller change did not use, takes what recovery restored.
  void SettleDaemon() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Caps the table growth of `sequence` at what max_sequence_bookkeeping_bytes leaves room for.
  void LimitTableGrowth(Sequence& sequence) const;
  // RESOURCE_EXHAUSTED naming max_sequences_per_model when one more sequence is one too many.
  [[nodiscard]] absl::Status CheckOneMore() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entries a listing counts for the sequence (see ListOptions::max_table_entries).
  [[nodiscard]] int64_t ListedEntries(const Sequence& sequence) const;
  // Drops a lost mark (the id is open again or its client closed it), journaled.
  void ForgetLost(absl::string_view sequence_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Pool pressure internals (cache_state_pressure.cc) ----
  // A refused admission waiting for its retry.
  struct Pending {
    int64_t order = 0;  // its first attempt's admission order
    int64_t need = 0;   // frames it asked for last
    int32_t priority = 0;
    absl::Time last_attempt;
  };
  // A swapped-out sequence: its tables as slots of `arena`, one frame's bytes per slot.
  struct Swapped {
    int64_t length = 0;
    std::vector<std::vector<int32_t>> slots;  // [layer * kv_groups + group][page], -1 evicted
    int64_t slot_count = 0;
    std::vector<std::vector<double>> head_weights;
    std::vector<std::vector<float>> running_sums;  // empty, or [layer]
    std::unique_ptr<MemoryArena> arena;
    bool keep_name = false;  // the arena's name outlives it: unlinked by hand when dropped
    int64_t bookkeeping_bytes = 0;
  };
  // Frame units a quota takes from one sequence: per unit (layer, first group, page).
  struct Eviction {
    std::vector<std::vector<std::vector<int32_t>>> pages;  // [layer][group]: pages to evict
    int64_t units = 0;
    int64_t frames_freed = 0;  // those whose frame returns to the free list
  };
  // Frame units per (layer, page): kv_groups in kGroup, 1 in kLayer.
  [[nodiscard]] int UnitGroups() const {
    return layout_ == FrameLayout::kGroup ? 1 : geometry_.kv_groups;
  }
  [[nodiscard]] int64_t UncompressedFrames(int64_t pages) const;
  [[nodiscard]] int64_t FloorOf(const Sequence& sequence, const SequencePressure& terms) const;
  // The units a quota of `quota` takes from the sequence now (limited to `layers` when not
  // empty, each layer taking its part of the quota): the least valuable scored, unprotected
  // units, never below the floor. Changes nothing.
  [[nodiscard]] Eviction PlanEviction(const Sequence& sequence, const SequencePressure& terms,
                                      int64_t quota, std::span<const int32_t> layers) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies it (journaled; counted under the quota's reason); returns one ApplyResult per
  // touched layer, in `touched` order.
  [[nodiscard]] absl::StatusOr<std::vector<ApplyResult>> ApplyEviction(Sequence& sequence,
                                                                       SequencePressure& terms,
                                                                       const Eviction& eviction)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets quotas on sequences with server-chosen budgets so that `demand` more frames come back
  // (beyond those already owed); returns the frames owed in all after planning.
  int64_t PlanQuotas(int64_t demand, ReclaimReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frames owners still owe: sum over quota'd sequences of live - quota.
  [[nodiscard]] int64_t OwedFrames() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frames older waiting admissions of at least `priority` hold back from an admission of
  // `order` (not counting `sequence_id`'s own).
  [[nodiscard]] int64_t ReservedFrames(absl::string_view sequence_id, int32_t priority,
                                       int64_t order) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The admission order of `sequence_id`: its waiting admission's, else a new one.
  int64_t AdmissionOrder(absl::string_view sequence_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `need` frames did not fit: plans quotas, remembers a waiting admission, names victims;
  // RESOURCE_EXHAUSTED naming what is missing, `refusal` filled.
  [[nodiscard]] absl::Status Refuse(absl::string_view sequence_id, int64_t need, int64_t available,
                                    int32_t priority, int64_t order, bool admission,
                                    AdmissionRefusal* refusal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a change: quotas toward the target when over it, lifted when well under it with no
  // admission waiting; expired waiting admissions dropped.
  void Rebalance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A call of the sequence's owner: the interval estimate behind retry hints.
  void NoteOwnerCall(absl::string_view sequence_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] int64_t RetryAfterMs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] PressureReport ReportOf(const Sequence* sequence,
                                        const SequencePressure& terms) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Time Now() const;
  // The terms of an open (or swapped) sequence. REQUIRES: it has them.
  SequencePressure& TermsOf(absl::string_view sequence_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void JournalTerms(absl::string_view sequence_id, const SequencePressure& terms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes of the page shares `terms` holds (accounted as bookkeeping).
  [[nodiscard]] static int64_t SharesBytes(const SequencePressure& terms);
  [[nodiscard]] PressureStats PressureStatsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives a sequence just opened (or forked) its terms, `terms` already validated.
  void AdoptTerms(absl::string_view sequence_id, const SequenceTerms& terms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes a swapped-out sequence: its bytes and terms go (journaled).
  [[nodiscard]] absl::Status CloseSwapped(absl::string_view sequence_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restore's checks of swapped-out sequences (DATA_LOSS naming the first problem: a bad shape,
  // a slot outside the arena, an id also resident or repeated), and their adoption: each arena
  // attached by name, a sequence whose arena is gone marked lost.
  [[nodiscard]] absl::Status CheckSwapped(
      const std::vector<SwappedSnapshot>& swapped,
      const absl::flat_hash_map<std::string, Sequence>& resident) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RestoreSwapped(std::vector<SwappedSnapshot> swapped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sequence's description (Describe) with its terms.
  [[nodiscard]] SequenceInfo DescribeWithTerms(const Sequence& sequence,
                                               bool with_block_tables) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ModelGeometry geometry_;
  const FrameLayout layout_;
  const int ranks_;
  const std::string name_;
  const CacheLimits limits_;
  mutable absl::Mutex mu_;
  std::unique_ptr<PagePool> pool_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Sequence> sequences_ ABSL_GUARDED_BY(mu_);
  CacheJournal* journal_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::flat_hash_map<std::string, std::string> lost_ ABSL_GUARDED_BY(mu_);  // id -> reason
  int64_t pages_evicted_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t frames_freed_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_copied_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t decisions_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pool_bookkeeping_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sequence_bookkeeping_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // sum over sequences_
  int64_t daemon_reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;       // held in limits_.daemon
  std::function<void()> decision_hook_ ABSL_GUARDED_BY(mu_);

  // Pool pressure.
  const PressureOptions pressure_options_;
  // Every open (resident or swapped-out) sequence's terms.
  absl::flat_hash_map<std::string, SequencePressure> terms_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Swapped> swapped_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Time> last_call_ ABSL_GUARDED_BY(mu_);
  int64_t next_order_ ABSL_GUARDED_BY(mu_) = 1;
  double call_interval_ms_ ABSL_GUARDED_BY(mu_) = 0.0;  // mean of owners' call intervals
  int64_t shares_bookkeeping_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t swapped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  PressureStats counters_ ABSL_GUARDED_BY(mu_);  // the counters only (tenants filled on read)
};

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_CACHE_STATE_H_
