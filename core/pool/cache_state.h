// CacheState: everything the daemon holds for one registered model.
#ifndef ENTROKV_CORE_POOL_CACHE_STATE_H_
#define ENTROKV_CORE_POOL_CACHE_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/pool/arena.h"
#include "core/pool/geometry.h"
#include "core/pool/page_pool.h"
#include "core/pool/sequence.h"

namespace entrokv {

struct CacheOptions {
  ModelGeometry geometry;
  FrameLayout layout = FrameLayout::kGroup;
  Backend backend = Backend::kHost;
  int64_t capacity_bytes = 0;  // the pool gets capacity_bytes / frame_bytes frames (floor)
  std::string name;            // the pool's name (metric label, arena name hint)
};

struct SequenceInfo {
  std::string id;
  int64_t length = 0;
  int64_t live_frames = 0;  // distinct frames referenced, shared ones included
  // [layer][group][page]: frame id or kNoFrame; empty unless asked for.
  std::vector<std::vector<std::vector<FrameId>>> block_tables;
};

// Maps 1:1 to ARCHITECTURE §6: entrokv_pool_frames{state="used|free"} = used_frames /
// free_frames, entrokv_pool_capacity_bytes = capacity_bytes, entrokv_sequences_active =
// sequences_active, entrokv_pages_evicted_total = pages_evicted_total (block-table entries
// evicted, one per (layer, group, page)); frames_freed_total counts frames actually returned
// by evictions (fewer when shared or, in kLayer, while another group keeps the page).
struct PoolStats {
  int64_t capacity_frames = 0;
  int64_t used_frames = 0;
  int64_t free_frames = 0;
  int64_t frame_bytes = 0;
  int64_t capacity_bytes = 0;  // capacity_frames * frame_bytes
  int64_t sequences_active = 0;
  std::vector<int64_t> used_frames_per_layer;
  int64_t pages_evicted_total = 0;
  int64_t frames_freed_total = 0;
  int64_t bytes_moved_total = 0;   // eviction moves no data: always 0
  int64_t bytes_copied_total = 0;  // copy-on-write of shared tail pages on append
  int64_t decisions_total = 0;     // successful ApplyDecision calls
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
  // INVALID_ARGUMENT for a bad geometry or when capacity_bytes holds 0 frames; the backend's
  // error when the arena cannot be made (UNIMPLEMENTED for cuda not built in).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CacheState>> Create(
      const CacheOptions& options);

  CacheState(const CacheState&) = delete;
  CacheState& operator=(const CacheState&) = delete;
  ~CacheState();

  // A new sequence holding frames for `initial_tokens`. INVALID_ARGUMENT for an empty id or
  // negative tokens, ALREADY_EXISTS when open, RESOURCE_EXHAUSTED (and no sequence) when the
  // frames are not there.
  [[nodiscard]] absl::Status OpenSequence(absl::string_view sequence_id, int64_t initial_tokens);
  // A new sequence sharing parent's first prefix_pages pages; see Sequence::Fork. NOT_FOUND
  // parent, ALREADY_EXISTS id, INVALID_ARGUMENT empty id or prefix_pages < 0, OUT_OF_RANGE
  // prefix_pages > the parent's pages.
  [[nodiscard]] absl::Status ForkSequence(absl::string_view sequence_id,
                                          absl::string_view parent_id, int64_t prefix_pages);
  // See Sequence::Append. NOT_FOUND unknown id.
  [[nodiscard]] absl::StatusOr<AppendResult> AppendTokens(absl::string_view sequence_id,
                                                          int64_t tokens);
  // See Sequence::ApplyDecision. NOT_FOUND unknown id.
  [[nodiscard]] absl::StatusOr<ApplyResult> ApplyDecision(
      absl::string_view sequence_id, int32_t layer, int64_t decided_tokens,
      const std::vector<std::vector<int32_t>>& kept_pages_per_group);
  // Caches the prefill head weights of one layer (see Sequence::SetHeadWeights), so a later
  // decode-time decision reuses them. NOT_FOUND unknown id.
  [[nodiscard]] absl::Status SetHeadWeights(absl::string_view sequence_id, int32_t layer,
                                            std::vector<double> weights);
  // The cached weights, empty when none. NOT_FOUND unknown id; FAILED_PRECONDITION bad layer.
  [[nodiscard]] absl::StatusOr<std::vector<double>> GetHeadWeights(absl::string_view sequence_id,
                                                                   int32_t layer) const;
  // Which pages of `layer` each group still holds, group-major, one entry per page of the
  // current length: 1 while the block table names a frame, 0 once evicted. Empty when every
  // page is held (nothing evicted yet), so a prefill decision pays nothing. A decode-time
  // decision passes it as LayerRequest::live_pages. NOT_FOUND unknown id; FAILED_PRECONDITION
  // bad layer.
  [[nodiscard]] absl::StatusOr<std::vector<uint8_t>> LivePages(absl::string_view sequence_id,
                                                               int32_t layer) const;
  // Releases every frame reference of the sequence. NOT_FOUND when unknown or already closed.
  [[nodiscard]] absl::Status CloseSequence(absl::string_view sequence_id);

  // The sequence's length in tokens, O(1): what the decision path needs. NOT_FOUND unknown id.
  [[nodiscard]] absl::StatusOr<int64_t> SequenceLength(absl::string_view sequence_id) const;
  // The sequence's length and live frames (O(layers x groups x pages) to count); its block
  // tables only when asked (they are large:
  // layers x groups x pages entries).
  [[nodiscard]] absl::StatusOr<SequenceInfo> GetSequence(absl::string_view sequence_id,
                                                         bool with_block_tables = true) const;
  // Sorted by id.
  [[nodiscard]] std::vector<SequenceInfo> ListSequences(bool with_block_tables) const;
  [[nodiscard]] PoolStats Stats() const;

  // The pool's invariant plus: every frame's refcount equals the number of block-table
  // entries naming it, every entry names a used frame of its own layer, in kLayer a
  // (layer, page) names at most one frame. INTERNAL naming the first violation. O(capacity +
  // entries): for tests and debug checks.
  [[nodiscard]] absl::Status CheckInvariants() const;

  [[nodiscard]] const ModelGeometry& geometry() const { return geometry_; }
  [[nodiscard]] FrameLayout layout() const { return layout_; }
  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] ArenaInfo arena() const;
  // The frame's first byte (host address or device address); for tests and local workers.
  [[nodiscard]] void* FrameAddress(FrameId frame) const;

 private:
  CacheState(const CacheOptions& options, std::unique_ptr<PagePool> pool);
  static SequenceInfo Describe(const Sequence& sequence, bool with_block_tables);

  const ModelGeometry geometry_;
  const FrameLayout layout_;
  const std::string name_;
  mutable absl::Mutex mu_;
  std::unique_ptr<PagePool> pool_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Sequence> sequences_ ABSL_GUARDED_BY(mu_);
  int64_t pages_evicted_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t frames_freed_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_copied_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t decisions_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_CACHE_STATE_H_
