// The pool's invariant, which every operation keeps and CheckInvariants proves:
//
//   Every frame is in exactly one of two states. FREE: reference count 0, layer tag -1, and it
//   appears exactly once on its rank's free list. USED: reference count >= 1 (the number of
//   block-table entries, across all sequences, that point at it), a layer tag in [0, L), and it
//   is not on the free list. Hence used + free == capacity, and the per-layer counts sum to
//   used.
//
// In the group layout with several ranks each rank's frames have a list of their own: a group's
// page must land in the arena of the rank that computes it.
//
// A free list is a stack, so Allocate and Release are O(1) and a just-freed frame (still hot
// in cache) is reused first. A release of a free frame is refused before anything changes:
// the refcount, not the caller, decides when memory is returned, so a double close or a
// double eviction can never put a frame on the list twice.
#include "core/pool/page_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace entrokv {

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(const PagePoolOptions& options) {
  RETURN_IF_ERROR(ValidateGeometry(options.geometry));
  if (options.capacity_frames <= 0 ||
      options.capacity_frames > std::numeric_limits<FrameId>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("capacity_frames must be in [1, ",
                                                   std::numeric_limits<FrameId>::max(), "], got ",
                                                   options.capacity_frames));
  }
  const int64_t frame_bytes = FrameBytes(options.geometry, options.layout);
  if (options.capacity_frames > std::numeric_limits<int64_t>::max() / frame_bytes) {
    return absl::InvalidArgumentError("capacity_frames * frame_bytes overflows");
  }
  RETURN_IF_ERROR(CheckRanks(options.geometry, options.devices));
  const int ranks = static_cast<int>(options.devices.size());
  const bool split = options.layout == FrameLayout::kLayer;  // each frame spans every rank
  if (!split && options.capacity_frames % ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity_frames: ", options.capacity_frames, " is not divisible by the ",
                     ranks, " ranks (in the group layout each rank's arena holds an equal share)"));
  }
  const int64_t arena_bytes = split ? options.capacity_frames * (frame_bytes / ranks)
                                    : options.capacity_frames / ranks * frame_bytes;
  std::vector<std::unique_ptr<MemoryArena>> arenas;
  for (int rank = 0; rank < ranks; ++rank) {
    const HostArenaSource source = rank < static_cast<int>(options.host_arenas.size())
                                       ? options.host_arenas[static_cast<size_t>(rank)]
                                       : HostArenaSource();
    const std::string name = ranks == 1 ? options.name : absl::StrCat(options.name, ".r", rank);
    ASSIGN_OR_RETURN(std::unique_ptr<MemoryArena> arena,
                     CreateArena(options.backend, name, arena_bytes, source,
                                 options.devices[static_cast<size_t>(rank)]));
    arenas.push_back(std::move(arena));
  }
  return std::unique_ptr<PagePool>(new PagePool(options, frame_bytes, std::move(arenas)));
}

PagePool::PagePool(const PagePoolOptions& options, int64_t frame_bytes,
                   std::vector<std::unique_ptr<MemoryArena>> arenas)
    : geometry_(options.geometry),
      layout_(options.layout),
      capacity_frames_(options.capacity_frames),
      frame_bytes_(frame_bytes),
      devices_(options.devices),
      arenas_(std::move(arenas)),
      refcount_(options.capacity_frames, 0),
      frame_layer_(options.capacity_frames, -1),
      used_per_layer_(options.geometry.layers, 0) {
  free_lists_.resize(layout_ == FrameLayout::kLayer ? 1 : arenas_.size());
  // Highest id at the bottom so frames go out in ascending order: easy to read in tests.
  for (auto& list : free_lists_) list.reserve(static_cast<size_t>(rank_frames()));
  for (int64_t f = capacity_frames_ - 1; f >= 0; --f) {
    free_lists_[static_cast<size_t>(FrameRank(static_cast<FrameId>(f)))].push_back(
        static_cast<FrameId>(f));
  }
  free_frames_ = capacity_frames_;
}

int64_t PagePool::even_free_frames() const {
  int64_t fewest = free_frames(0);
  for (int list = 1; list < free_lists(); ++list) fewest = std::min(fewest, free_frames(list));
  return fewest * free_lists();
}

int64_t PagePool::BookkeepingBytes(int64_t capacity_frames, int layers) {
  return static_cast<int64_t>(sizeof(PagePool)) +
         capacity_frames * static_cast<int64_t>(sizeof(FrameId) + 2 * sizeof(int32_t)) +
         static_cast<int64_t>(layers) * static_cast<int64_t>(sizeof(int64_t));
}

absl::StatusOr<FrameId> PagePool::Allocate(int32_t layer, int32_t refs, int list) {
  if (layer < 0 || layer >= geometry_.layers || refs < 1 || list < 0 || list >= free_lists()) {
    return absl::InvalidArgumentError(absl::StrCat("Allocate: layer ", layer, ", refs ", refs,
                                                   " or free list ", list, " out of range"));
  }
  std::vector<FrameId>& free = free_lists_[static_cast<size_t>(list)];
  if (free.empty()) {
    return absl::ResourceExhaustedError(
        free_lists() == 1
            ? absl::StrCat("pool exhausted: all ", capacity_frames_, " frames are in use")
            : absl::StrCat("pool exhausted: all ", rank_frames(), " frames of rank ", list,
                           " are in use"));
  }
  const FrameId frame = free.back();
  free.pop_back();
  --free_frames_;
  refcount_[frame] = refs;
  frame_layer_[frame] = layer;
  ++used_per_layer_[layer];
  return frame;
}

absl::Status PagePool::AddRef(FrameId frame) {
  if (!IsValid(frame) || refcount_[frame] == 0) {
    return absl::FailedPreconditionError(absl::StrCat("AddRef: frame ", frame, " is not in use"));
  }
  ++refcount_[frame];
  return absl::OkStatus();
}

absl::StatusOr<bool> PagePool::Release(FrameId frame) {
  if (!IsValid(frame) || refcount_[frame] == 0) {
    return absl::FailedPreconditionError(absl::StrCat("Release: frame ", frame, " is not in use"));
  }
  if (--refcount_[frame] > 0) return false;
  --used_per_layer_[frame_layer_[frame]];
  frame_layer_[frame] = -1;
  free_lists_[static_cast<size_t>(FrameRank(frame))].push_back(frame);
  ++free_frames_;
  return true;
}

absl::Status PagePool::Restore(const std::vector<int32_t>& refcounts,
                               const std::vector<int32_t>& layers) {
  if (used_frames() != 0) {
    return absl::FailedPreconditionError("pool restore: frames are already in use");
  }
  if (static_cast<int64_t>(refcounts.size()) != capacity_frames_ ||
      static_cast<int64_t>(layers.size()) != capacity_frames_) {
    return absl::DataLossError(absl::StrCat("pool restore: ", refcounts.size(), " counts for ",
                                            capacity_frames_, " frames"));
  }
  for (int64_t frame = 0; frame < capacity_frames_; ++frame) {
    if (refcounts[frame] < 0 ||
        (refcounts[frame] > 0 && (layers[frame] < 0 || layers[frame] >= geometry_.layers))) {
      return absl::DataLossError(absl::StrCat("pool restore: frame ", frame, " has count ",
                                              refcounts[frame], " and layer ", layers[frame]));
    }
  }
  for (auto& list : free_lists_) list.clear();
  free_frames_ = 0;
  std::fill(used_per_layer_.begin(), used_per_layer_.end(), 0);
  // The same order a fresh pool hands frames out in: ascending.
  for (int64_t f = capacity_frames_ - 1; f >= 0; --f) {
    refcount_[f] = refcounts[f];
    if (refcounts[f] == 0) {
      frame_layer_[f] = -1;
      free_lists_[static_cast<size_t>(FrameRank(static_cast<FrameId>(f)))].push_back(
          static_cast<FrameId>(f));
      ++free_frames_;
    } else {
      frame_layer_[f] = layers[f];
      ++used_per_layer_[layers[f]];
    }
  }
  return absl::OkStatus();
}

absl::Status PagePool::CopyFrame(FrameId source, FrameId destination) {
  if (!IsValid(source) || !IsValid(destination) || refcount_[source] == 0 ||
      refcount_[destination] == 0 || source == destination ||
      FrameRank(source) != FrameRank(destination)) {
    return absl::FailedPreconditionError(absl::StrCat("CopyFrame: frames ", source, " -> ",
                                                      destination,
                                                      " must be distinct, used and of one rank"));
  }
  const int64_t slice = rank_frame_bytes();
  for (int rank = 0; rank < ranks(); ++rank) {
    if (layout_ == FrameLayout::kGroup && rank != FrameRank(source)) continue;
    const int64_t first = first_frame(rank);
    RETURN_IF_ERROR(arenas_[static_cast<size_t>(rank)]->Copy((destination - first) * slice,
                                                             (source - first) * slice, slice));
  }
  return absl::OkStatus();
}

ArenaInfo PagePool::arena_info(int rank) const {
  ArenaInfo info = arenas_[static_cast<size_t>(rank)]->info();
  info.device = devices_[static_cast<size_t>(rank)];
  return info;
}

void* PagePool::FrameAddress(FrameId frame, int rank) const {
  return static_cast<char*>(arenas_[static_cast<size_t>(rank)]->base()) +
         (static_cast<int64_t>(frame) - first_frame(rank)) * rank_frame_bytes();
}

const void* PagePool::GroupAddress(FrameId frame, int group) const {
  const int per_rank = geometry_.kv_groups / ranks();
  const int rank = group / per_rank;
  if (layout_ == FrameLayout::kGroup) return FrameAddress(frame, rank);
  return static_cast<const char*>(FrameAddress(frame, rank)) +
         static_cast<int64_t>(group - rank * per_rank) * FrameBytes(geometry_, FrameLayout::kGroup);
}

void PagePool::ReadFrame(FrameId frame, char* out) const {
  if (layout_ == FrameLayout::kGroup) {
    std::memcpy(out, FrameAddress(frame, FrameRank(frame)), static_cast<size_t>(frame_bytes_));
    return;
  }
  const int64_t slice = rank_frame_bytes();
  for (int rank = 0; rank < ranks(); ++rank) {
    std::memcpy(out + rank * slice, FrameAddress(frame, rank), static_cast<size_t>(slice));
  }
}

void PagePool::WriteFrame(FrameId frame, const char* in) {
  if (layout_ == FrameLayout::kGroup) {
    std::memcpy(FrameAddress(frame, FrameRank(frame)), in, static_cast<size_t>(frame_bytes_));
    return;
  }
  const int64_t slice = rank_frame_bytes();
  for (int rank = 0; rank < ranks(); ++rank) {
    std::memcpy(FrameAddress(frame, rank), in + rank * slice, static_cast<size_t>(slice));
  }
}

absl::Status PagePool::CheckInvariants() const {
  if (used_frames() + free_frames() != capacity_frames_ || free_frames() > capacity_frames_) {
    return absl::InternalError(absl::StrCat("pool: used ", used_frames(), " + free ", free_frames(),
                                            " != capacity ", capacity_frames_));
  }
  std::vector<bool> on_free_list(capacity_frames_, false);
  int64_t listed = 0;
  for (int list = 0; list < free_lists(); ++list) {
    for (const FrameId frame : free_lists_[static_cast<size_t>(list)]) {
      if (!IsValid(frame) || FrameRank(frame) != list) {
        return absl::InternalError(
            absl::StrCat("pool: free list ", list, " holds frame ", frame, " of another rank"));
      }
      ++listed;
      if (on_free_list[frame]) {
        return absl::InternalError(
            absl::StrCat("pool: frame ", frame, " is on the free list twice"));
      }
      on_free_list[frame] = true;
      if (refcount_[frame] != 0 || frame_layer_[frame] != -1) {
        return absl::InternalError(absl::StrCat("pool: free frame ", frame, " has refcount ",
                                                refcount_[frame], " and layer ",
                                                frame_layer_[frame]));
      }
    }
  }
  if (listed != free_frames_) {
    return absl::InternalError(
        absl::StrCat("pool: ", listed, " frames on the free lists, ", free_frames_, " counted"));
  }
  std::vector<int64_t> per_layer(geometry_.layers, 0);
  for (int64_t frame = 0; frame < capacity_frames_; ++frame) {
    if (on_free_list[frame]) continue;
    if (refcount_[frame] < 1) {
      return absl::InternalError(
          absl::StrCat("pool: frame ", frame, " is neither free nor referenced (leaked)"));
    }
    const int32_t layer = frame_layer_[frame];
    if (layer < 0 || layer >= geometry_.layers) {
      return absl::InternalError(absl::StrCat("pool: used frame ", frame, " has layer ", layer));
    }
    ++per_layer[layer];
  }
  if (per_layer != used_per_layer_) {
    return absl::InternalError("pool: per-layer used counts disagree with the frames");
  }
  return absl::OkStatus();
}

}  // namespace entrokv
