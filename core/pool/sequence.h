// Sequence: the block tables of one sequence, and the operations that change them.
#ifndef ENTROKV_CORE_POOL_SEQUENCE_H_
#define ENTROKV_CORE_POOL_SEQUENCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/pool/geometry.h"
#include "core/pool/page_pool.h"
#include "core/util/page_count.h"

namespace entrokv {

// The longest sequence, in tokens (2^31 - 1): page indices and token counts stay int32 on the
// wire and in the kernels. Every token count a caller passes is checked against this one bound.
inline constexpr int64_t kMaxSequenceTokens = (int64_t{1} << 31) - 1;

// A frame the caller must (re)write: the K/V of `page` of (layer, group) lives in `frame`.
struct FrameAssignment {
  int32_t layer = 0;
  int32_t group = 0;
  int64_t page = 0;
  FrameId frame = kNoFrame;
};

struct AppendResult {
  int64_t length = 0;  // the sequence length after the append
  // Every block-table entry this append set, ordered by (layer, group, page). In the kLayer
  // layout the kv_groups entries of one (layer, page) name the same frame.
  std::vector<FrameAssignment> new_frames;
  int64_t frames_copied = 0;  // shared tail frames copied on write (each frame_bytes)
  // Pool pressure (CacheState::AppendTokens): the pages a quota took from the sequence before
  // the new frames were allocated, per (layer, group) with any, and how many frame units.
  struct Evicted {
    int32_t layer = 0;
    int32_t group = 0;
    std::vector<int32_t> pages;  // ascending
  };
  std::vector<Evicted> evicted;
  int64_t reclaimed_frames = 0;
};

// One layer's share of a decision: the pages each group keeps (see Sequence::ApplyDecision)
// and, for a chunk of a chunked prefill, the layer's new running sum (Sequence::running_sum).
struct LayerKeep {
  int32_t layer = 0;
  std::vector<std::vector<int32_t>> kept_pages_per_group;
  // query_heads x length() values, [head][token]; nullopt leaves the running sum as it is.
  std::optional<std::vector<float>> running_sum;
  // A tensor-parallel rank's share: running_sum holds only heads [first_head, first_head +
  // heads) (heads x length() values); the other heads keep their rows, zero-padded to length()
  // (CacheState::ApplyDecisions merges them). 0: every head.
  int32_t running_sum_first_head = 0;
  int32_t running_sum_heads = 0;
};

struct ApplyResult {
  std::vector<std::vector<int64_t>> evicted_pages_per_group;  // pages this call evicted
  std::vector<FrameId> freed_frames;                          // frames back on the free list
  int64_t frames_released = 0;                                // freed_frames.size()
  // kLayer: |union_g kept| / max_g |kept_g| in [1, G] (1 when nothing is kept); kGroup: 1.
  double page_union_ratio = 1.0;
  bool running_sum_set = false;  // the layer's running sum was replaced (LayerKeep)
};

struct TruncateResult {
  int64_t length = 0;                 // the sequence length after the truncation
  std::vector<FrameId> freed_frames;  // frames back on the free list
  int64_t entries_released = 0;       // block-table entries dropped (one reference each)
};

// One sequence's bookkeeping: length T and, per (layer, group), a block table mapping logical
// page b (tokens [bB, (b+1)B)) to a frame or kNoFrame (evicted). Every live entry holds one
// reference on its frame. Frames are referenced, never owned: the PagePool passed to every
// mutating call must be the one the frames came from, and must outlive the references (call
// Release before the pool goes). Thread-compatible.
//
// Frame units. In kGroup each (layer, group, page) entry has its own frame. In kLayer all
// groups of a layer share one frame per page: the frame carries one reference per group entry,
// so it returns to the pool only when every group (of every sequence) has evicted it.
//
// Rules every mutating call follows: validate everything, count the frames needed, refuse
// (RESOURCE_EXHAUSTED) if the pool has fewer free, and only then change anything; a failed
// call leaves the sequence and the pool exactly as they were.
class Sequence {
 public:
  // An empty sequence (length 0, no pages).
  Sequence(std::string id, const ModelGeometry& geometry, FrameLayout layout);

  // A sequence sharing `parent`'s first `prefix_pages` pages (each live entry gains a
  // reference; evicted entries stay evicted); its length is min(parent length, prefix_pages*B).
  // INVALID_ARGUMENT for prefix_pages < 0, OUT_OF_RANGE above the parent's page count.
  [[nodiscard]] static absl::StatusOr<Sequence> Fork(std::string id, const Sequence& parent,
                                                     int64_t prefix_pages, PagePool& pool);

  // A sequence as a journal recorded it (crash recovery): `tables` is [layer * kv_groups +
  // group][page] with page_count() entries each, `head_weights` [layer] (empty or query_heads
  // values), `running_sums` empty or [layer] (empty or query_heads x at most `length` values).
  // Checks the shape only (DATA_LOSS naming what is wrong); the references are the caller's
  // (CacheState::Restore) to rebuild.
  [[nodiscard]] static absl::StatusOr<Sequence> FromSnapshot(
      std::string id, const ModelGeometry& geometry, FrameLayout layout, int64_t length,
      std::vector<std::vector<FrameId>> tables, std::vector<std::vector<double>> head_weights,
      std::vector<std::vector<float>> running_sums = {});

  Sequence(Sequence&&) = default;
  Sequence& operator=(Sequence&&) = default;

  [[nodiscard]] const std::string& id() const { return id_; }
  [[nodiscard]] int64_t length() const { return length_; }
  [[nodiscard]] int64_t page_count() const { return PagesFor(length_); }
  [[nodiscard]] const std::vector<FrameId>& block_table(int layer, int group) const {
    return tables_[static_cast<size_t>(layer) * geometry_.kv_groups + group];
  }
  // Distinct frames this sequence references (shared ones included).
  [[nodiscard]] int64_t live_frames() const;
  // [layer][group][page] copy of the block tables.
  [[nodiscard]] std::vector<std::vector<std::vector<FrameId>>> BlockTables() const;

  // Bytes of bookkeeping a sequence holds (accounted, an upper bound of what it allocates): the
  // object and its id, L x G block-table headers and `table_capacity` entries in each, and L
  // head-weight vectors counted full (H_Q doubles each) from the start, so caching weights later
  // never grows what was accounted. O(1). The running sums come on top (running_sum_bytes).
  [[nodiscard]] static int64_t BookkeepingBytes(const ModelGeometry& geometry, size_t id_bytes,
                                                int64_t table_capacity);
  [[nodiscard]] int64_t bookkeeping_bytes() const {
    return BookkeepingBytes(geometry_, id_.size(), table_capacity_) + running_sum_bytes();
  }
  // bookkeeping_bytes() once the tables reserve `table_capacity` entries (an Append's growth).
  [[nodiscard]] int64_t BookkeepingBytesWithCapacity(int64_t table_capacity) const {
    return BookkeepingBytes(geometry_, id_.size(), table_capacity) + running_sum_bytes();
  }
  // Bytes the running sums hold: their L vector headers once any layer has one, and 4 bytes per
  // value. What a sequence's sums would hold cut to the first `tokens` tokens (a fork's share):
  // RunningSumBytesUpTo.
  [[nodiscard]] int64_t running_sum_bytes() const { return RunningSumBytesUpTo(length_); }
  [[nodiscard]] int64_t RunningSumBytesUpTo(int64_t tokens) const;
  // Entries every block table has room for (the tables grow together, by half at a time, so the
  // bytes they hold are known without asking the allocator).
  [[nodiscard]] int64_t table_capacity() const { return table_capacity_; }
  // table_capacity() after an Append(tokens) that succeeds. REQUIRES: tokens >= 0.
  [[nodiscard]] int64_t TableCapacityAfter(int64_t tokens) const;
  // Growth never takes the tables beyond `entries` per table (unless the pages need it: the
  // caller refuses such appends). Default: unbounded.
  void set_table_capacity_limit(int64_t entries) { table_capacity_limit_ = entries; }

  // Frames Append(tokens) would take from each of the pool's free lists (one per rank in the
  // group layout, PagePool::GroupRank). INVALID_ARGUMENT for tokens < 0 or a length beyond
  // kMaxSequenceTokens.
  [[nodiscard]] absl::StatusOr<std::vector<int64_t>> FramesNeededPerList(
      int64_t tokens, const PagePool& pool) const;
  // The same counted as PagePool::even_free_frames counts: free_lists() x the most taken from
  // one list; with one list, the frames Append(tokens) would take.
  [[nodiscard]] absl::StatusOr<int64_t> FramesNeeded(int64_t tokens, const PagePool& pool) const;

  // Grows the sequence by `tokens`, allocating exactly the frames the new tokens land in:
  // one per frame unit for every new page, and for the partial tail page that receives tokens:
  //  - evicted in every group of its unit: a fresh frame (the evicted tokens' slots in it are
  //    undefined; the engine rewrites the page);
  //  - evicted in some groups of a kLayer unit, frame still held: those groups re-reference it;
  //  - shared with another sequence (after a fork): copy-on-write, a private frame with the
  //    page's bytes copied in, so the other sequence's page is never written.
  // RESOURCE_EXHAUSTED with nothing allocated when the pool lacks frames.
  [[nodiscard]] absl::StatusOr<AppendResult> Append(int64_t tokens, PagePool& pool);

  // Evicts, in `layer`, every live page not listed for its group, releasing one reference per
  // evicted entry. kept_pages_per_group: kv_groups lists of strictly ascending page indices.
  // Listing an already-evicted page is allowed: it stays evicted (eviction is final until an
  // append rewrites the tail). With `running_sum`, the layer's running sum becomes it (moved
  // from). FAILED_PRECONDITION when decided_tokens != length(), the layer or group count does
  // not match the geometry, or a page index is >= page_count(); INVALID_ARGUMENT for a negative
  // or unsorted/duplicate index, or a running sum that is not query_heads x length() values.
  [[nodiscard]] absl::StatusOr<ApplyResult> ApplyDecision(
      int32_t layer, int64_t decided_tokens,
      const std::vector<std::vector<int32_t>>& kept_pages_per_group, PagePool& pool,
      std::vector<float>* running_sum = nullptr);
  // ApplyDecision's checks alone: OK exactly when ApplyDecision with these arguments would
  // succeed now. Changes nothing (so several layers can be checked before any is applied).
  [[nodiscard]] absl::Status CheckDecision(
      int32_t layer, int64_t decided_tokens,
      const std::vector<std::vector<int32_t>>& kept_pages_per_group,
      const std::vector<float>* running_sum = nullptr) const;

  // Drops the last `tokens` tokens (speculative tokens the target model rejected). Pages past
  // the new end leave every block table, each live entry releasing its reference, so a frame
  // returns to the free list at its last one (a page a fork still shares stays with the fork).
  // The page that becomes the tail keeps what it had: its frame, so the slots past the new end
  // hold stale K/V the next append overwrites; shared with a fork, it stays shared, and the next
  // Append copies it before writing (copy-on-write, as after a fork); evicted, it stays evicted.
  // Running sums lose the dropped tokens' columns; head weights stay (they do not depend on the
  // length); the tables keep their reserved capacity. INVALID_ARGUMENT for tokens < 1,
  // OUT_OF_RANGE for more than length(); nothing changes then.
  [[nodiscard]] absl::StatusOr<TruncateResult> Truncate(int64_t tokens, PagePool& pool);

  // Releases every reference and leaves the sequence empty and closed. FAILED_PRECONDITION
  // when already released (never a double free).
  [[nodiscard]] absl::Status Release(PagePool& pool);
  [[nodiscard]] bool released() const { return released_; }

  // Head weights computed at prefill (docs/architecture.md §3.4), kept per layer for decode-time
  // decisions: query_heads values, group g's heads at [g * r, (g + 1) * r). A fork inherits the
  // parent's. FAILED_PRECONDITION for a layer outside the geometry; INVALID_ARGUMENT when the
  // count is not query_heads.
  [[nodiscard]] absl::Status SetHeadWeights(int32_t layer, std::vector<double> weights);
  // Empty when none were cached for the layer. REQUIRES: 0 <= layer < layers.
  [[nodiscard]] const std::vector<double>& head_weights(int32_t layer) const {
    return head_weights_[layer];
  }

  // Chunked prefill: the running column sums of the ACCUMULATED statistics decided on so far,
  // per layer: query_heads rows of running_sum_tokens(layer) values ([head][token]); tokens
  // appended since the last chunk count 0. Empty when the layer has none. Set by
  // ApplyDecision's LayerKeep::running_sum; a fork inherits its prefix's columns, Truncate
  // drops the truncated tokens', Release all. REQUIRES: 0 <= layer < layers.
  [[nodiscard]] const std::vector<float>& running_sum(int32_t layer) const;
  [[nodiscard]] int64_t running_sum_tokens(int32_t layer) const {
    return static_cast<int64_t>(running_sum(layer).size()) / geometry_.query_heads;
  }

 private:
  struct TailPlan;  // what Append does to one unit's tail page

  [[nodiscard]] int64_t PagesFor(int64_t tokens) const {
    return PageCount(tokens, geometry_.page_size);
  }
  [[nodiscard]] int unit_groups() const {
    return layout_ == FrameLayout::kGroup ? 1 : geometry_.kv_groups;
  }
  std::vector<FrameId>& table(int layer, int group) {
    return tables_[static_cast<size_t>(layer) * geometry_.kv_groups + group];
  }
  [[nodiscard]] absl::StatusOr<std::vector<TailPlan>> PlanTail(int64_t tokens,
                                                               const PagePool& pool) const;
  // The layer's running sum cut to its first `tokens` tokens' columns.
  [[nodiscard]] std::vector<float> RunningSumPrefix(int32_t layer, int64_t tokens) const;

  std::string id_;
  ModelGeometry geometry_;
  FrameLayout layout_;
  int64_t length_ = 0;
  std::vector<std::vector<FrameId>> tables_;       // [layer * kv_groups + group][page]
  std::vector<std::vector<double>> head_weights_;  // [layer][query head], empty if not cached
  // [layer][head * tokens + token]; empty until a layer gets one (see running_sum).
  std::vector<std::vector<float>> running_sums_;
  int64_t table_capacity_ = 0;  // reserved entries of every table
  int64_t table_capacity_limit_ = kMaxSequenceTokens;
  bool released_ = false;
};

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_SEQUENCE_H_
