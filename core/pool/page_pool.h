// PagePool: a fixed arena of equal frames, a free list and per-frame reference counts.
#ifndef ENTROKV_CORE_POOL_PAGE_POOL_H_
#define ENTROKV_CORE_POOL_PAGE_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/pool/arena.h"
#include "core/pool/geometry.h"

namespace entrokv {

// The frames one rank's arena holds, and where: frame f in [first_frame, first_frame + frames)
// at byte (f - first_frame) * frame_bytes. kLayer: every frame, its slice; kGroup: its share.
struct RankSpan {
  int64_t first_frame = 0;
  int64_t frames = 0;
  int64_t frame_bytes = 0;
};

struct PagePoolOptions {
  ModelGeometry geometry;
  FrameLayout layout = FrameLayout::kGroup;
  Backend backend = Backend::kHost;
  int64_t capacity_frames = 0;  // in [1, 2^31 - 1]
  std::string name;             // a hint for the arenas' names
  // The device of each tensor-parallel rank's arena; one entry (the default) for a model on
  // one device; t ranks need t dividing kv_groups. Rank r holds KV groups [r G/t, (r+1) G/t).
  // kLayer: every frame is split in t slices of rank_frame_bytes(), rank r's arena holding its
  // groups' slice of each frame at the same frame id, so the ranks share one block table.
  // kGroup: a frame is one group's page, so it lives whole in its group's rank's arena: frame
  // ids [r C/t, (r+1) C/t) are rank r's, with a free list of their own (C divisible by t).
  // A host arena stands in for its device: the number is recorded, the memory is the host's.
  std::vector<int> devices = {0};
  // Host backend, per rank: the arena's exact name, attach or keep it; missing: the default.
  std::vector<HostArenaSource> host_arenas;
};

// Owns one MemoryArena per rank, of rank_frames() * rank_frame_bytes() bytes each. Frame f lives
// at byte offset (f - first_frame(r)) * rank_frame_bytes() of rank r's arena, for every rank in
// kLayer and for its own rank (FrameRank) in kGroup; frames never move. A frame is free
// (reference count 0, on its free list) or used (count >= 1, tagged with the layer it belongs
// to). Allocate and Release are O(1). Thread-compatible: CacheState serializes every call under
// its mutex.
class PagePool {
 public:
  // INVALID_ARGUMENT for a bad geometry or capacity; the arena's error when it cannot be made
  // (UNIMPLEMENTED for cuda without CUDA).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PagePool>> Create(
      const PagePoolOptions& options);

  // Bytes of bookkeeping a pool of `capacity_frames` frames over `layers` layers holds besides
  // its arena: the free list, reference counts and layer tags (one FrameId or int32 each per
  // frame) and the per-layer counts. O(1).
  [[nodiscard]] static int64_t BookkeepingBytes(int64_t capacity_frames, int layers);

  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  [[nodiscard]] const ModelGeometry& geometry() const { return geometry_; }
  [[nodiscard]] FrameLayout layout() const { return layout_; }
  [[nodiscard]] int64_t capacity_frames() const { return capacity_frames_; }
  [[nodiscard]] int64_t free_frames() const { return free_frames_; }
  [[nodiscard]] int64_t used_frames() const { return capacity_frames_ - free_frames(); }
  // Bytes of one whole frame, every rank's slice together; a rank's slice is rank_frame_bytes()
  // (kLayer), a kGroup frame is not split.
  [[nodiscard]] int64_t frame_bytes() const { return frame_bytes_; }
  [[nodiscard]] int64_t rank_frame_bytes() const {
    return layout_ == FrameLayout::kLayer ? frame_bytes_ / ranks() : frame_bytes_;
  }
  [[nodiscard]] int64_t capacity_bytes() const { return capacity_frames_ * frame_bytes_; }
  // Tensor-parallel ranks (arenas), >= 1.
  [[nodiscard]] int ranks() const { return static_cast<int>(arenas_.size()); }
  // Free lists: one per rank in kGroup (a frame lives in one rank's arena), one in kLayer (a
  // frame spans every rank).
  [[nodiscard]] int free_lists() const { return static_cast<int>(free_lists_.size()); }
  // Frames in each rank's arena, and rank r's first frame id (0 for every rank in kLayer).
  [[nodiscard]] int64_t rank_frames() const { return capacity_frames_ / free_lists(); }
  [[nodiscard]] int64_t first_frame(int rank) const {
    return layout_ == FrameLayout::kLayer ? 0 : rank * rank_frames();
  }
  // REQUIRES: rank in [0, ranks()).
  [[nodiscard]] RankSpan rank_span(int rank) const {
    return {.first_frame = first_frame(rank),
            .frames = layout_ == FrameLayout::kLayer ? capacity_frames_ : rank_frames(),
            .frame_bytes = rank_frame_bytes()};
  }
  // The free list a frame belongs to (its rank in kGroup, 0 in kLayer). REQUIRES: IsValid.
  [[nodiscard]] int FrameRank(FrameId frame) const {
    return static_cast<int>(frame / rank_frames());
  }
  // The free list KV group `group`'s frames come from.
  [[nodiscard]] int GroupRank(int group) const {
    return free_lists() == 1 ? 0 : group / (geometry_.kv_groups / free_lists());
  }
  // Free frames of one free list. REQUIRES: list in [0, free_lists()).
  [[nodiscard]] int64_t free_frames(int list) const {
    return static_cast<int64_t>(free_lists_[static_cast<size_t>(list)].size());
  }
  // What every free list can give evenly: free_lists() x the fewest free on one list. Equal to
  // free_frames() with one list. A sequence's growth takes the same number of frames from each
  // rank, so admission and pool pressure count this.
  [[nodiscard]] int64_t even_free_frames() const;
  [[nodiscard]] const std::vector<int64_t>& used_frames_per_layer() const {
    return used_per_layer_;
  }
  // Rank `rank`'s arena, its device set (a host arena's too). REQUIRES: rank in [0, ranks()).
  [[nodiscard]] ArenaInfo arena_info(int rank = 0) const;

  // Takes a free frame of free list `list` (GroupRank of the frame's group) for `layer` with
  // reference count `refs` (>= 1). RESOURCE_EXHAUSTED when none is free; callers that need
  // several frames check free_frames(list) first (all-or-nothing).
  [[nodiscard]] absl::StatusOr<FrameId> Allocate(int32_t layer, int32_t refs, int list = 0);
  // One more reference to a used frame. FAILED_PRECONDITION for a free or unknown frame.
  [[nodiscard]] absl::Status AddRef(FrameId frame);
  // Drops one reference; at zero the frame returns to the free list and true comes back.
  // FAILED_PRECONDITION for a free or unknown frame: a double release is an error, never a
  // double free.
  [[nodiscard]] absl::StatusOr<bool> Release(FrameId frame);
  // Sets every frame's reference count and layer at once (crash recovery: the counts follow
  // from the block tables a journal kept); frames with count 0 go on the free list. DATA_LOSS
  // naming the frame for a negative count or a used frame's layer outside the geometry, and
  // FAILED_PRECONDITION unless every frame is free now; nothing changes then.
  [[nodiscard]] absl::Status Restore(const std::vector<int32_t>& refcounts,
                                     const std::vector<int32_t>& layers);
  // Copies a whole frame's bytes, in every rank's arena (copy-on-write). FAILED_PRECONDITION
  // unless both are used and of one free list.
  [[nodiscard]] absl::Status CopyFrame(FrameId source, FrameId destination);

  // REQUIRES: IsValid(frame).
  [[nodiscard]] int32_t refcount(FrameId frame) const { return refcount_[frame]; }
  // The layer a used frame belongs to; -1 for a free one. REQUIRES: IsValid(frame).
  [[nodiscard]] int32_t frame_layer(FrameId frame) const { return frame_layer_[frame]; }
  [[nodiscard]] bool IsValid(FrameId frame) const { return frame >= 0 && frame < capacity_frames_; }
  // The first byte of the frame's slice in rank `rank`'s arena, in that arena's address space
  // (host or device). REQUIRES: rank in [0, ranks()); in kGroup with several ranks, rank ==
  // FrameRank(frame).
  [[nodiscard]] void* FrameAddress(FrameId frame, int rank = 0) const;
  // The first byte of KV group `group`'s part of frame `frame` ([K: B x head_dim][V: B x
  // head_dim] elements), in the arena of the rank that holds the group. REQUIRES: IsValid(frame),
  // group in [0, kv_groups), and in kGroup the frame is one of that group's.
  [[nodiscard]] const void* GroupAddress(FrameId frame, int group) const;
  // Copies a whole frame (frame_bytes() bytes; in kLayer every rank's slice in rank order) out
  // of the arenas into `out`, or from `in` into them (swapping). REQUIRES: host arenas,
  // IsValid(frame).
  void ReadFrame(FrameId frame, char* out) const;
  void WriteFrame(FrameId frame, const char* in);

  // used + free == capacity; the free lists hold distinct frames of their own rank, all with
  // count 0; every other frame has count >= 1 and a valid layer; per-layer counts sum to used.
  // INTERNAL naming the first violation.
  [[nodiscard]] absl::Status CheckInvariants() const;

 private:
  PagePool(const PagePoolOptions& options, int64_t frame_bytes,
           std::vector<std::unique_ptr<MemoryArena>> arenas);

  const ModelGeometry geometry_;
  const FrameLayout layout_;
  const int64_t capacity_frames_;
  const int64_t frame_bytes_;
  const std::vector<int> devices_;
  std::vector<std::unique_ptr<MemoryArena>> arenas_;  // one per rank
  // Stacks, one per free list: the most recently freed frame goes out first.
  std::vector<std::vector<FrameId>> free_lists_;
  int64_t free_frames_ = 0;           // on every list together
  std::vector<int32_t> refcount_;     // per frame; 0 means free
  std::vector<int32_t> frame_layer_;  // per used frame; -1 when free
  std::vector<int64_t> used_per_layer_;
};

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_PAGE_POOL_H_
