// CacheState's swapping: preemption that keeps a sequence's K/V. SwapOut copies each live frame
// unit of the sequence into one slot of a host arena of its own and releases the frames; the
// sequence stays open with its block tables as slot numbers, its head weights and its terms.
// Resume is an admission like any other (it may wait for quotas), then copies every slot into a
// new frame and builds new block tables. The swap arena is a host arena like a pool's, so a
// --state_dir daemon keeps it (by name, journaled) across a crash as it keeps its pools.
#include <sys/mman.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/pool/cache_state.h"
#include "core/util/status_macros.h"

namespace entrokv {
namespace {

// Leaves no name behind: an arena made with keep_name stays linked when it goes.
void DropArena(std::unique_ptr<MemoryArena> arena, bool keep_name) {
  if (arena == nullptr) return;
  const std::string name = arena->info().name;
  arena.reset();
  if (keep_name && !name.empty()) ::shm_unlink(name.c_str());
}

}  // namespace

absl::StatusOr<SwapOutResult> CacheState::SwapOut(absl::string_view sequence_id) {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  if (pool_->arena_info().backend != Backend::kHost) {
    return absl::FailedPreconditionError(
        "backend: a cuda pool's frames are not swapped; close the sequence and recompute it");
  }
  if (pressure_options_.max_swap_bytes <= 0) {
    return absl::FailedPreconditionError(
        "max_swap_bytes: swapping is off (--max_swap_bytes=0); close the sequence instead");
  }
  Sequence& sequence = it->second;
  const int64_t pages = sequence.page_count();
  const int unit = UnitGroups();
  Swapped swapped;
  swapped.length = sequence.length();
  swapped.slots.assign(static_cast<size_t>(geometry_.layers) * geometry_.kv_groups,
                       std::vector<int32_t>(static_cast<size_t>(pages), -1));
  std::vector<FrameId> frames;  // per slot
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    for (int32_t first = 0; first < geometry_.kv_groups; first += unit) {
      for (int64_t page = 0; page < pages; ++page) {
        int32_t slot = -1;
        for (int32_t g = first; g < first + unit; ++g) {
          const FrameId frame = sequence.block_table(layer, g)[static_cast<size_t>(page)];
          if (frame == kNoFrame) continue;
          if (slot < 0) {
            slot = static_cast<int32_t>(frames.size());
            frames.push_back(frame);
          }
          swapped.slots[static_cast<size_t>(layer) * geometry_.kv_groups + g]
                       [static_cast<size_t>(page)] = slot;
        }
      }
    }
  }
  swapped.slot_count = static_cast<int64_t>(frames.size());
  const int64_t frame_bytes = pool_->frame_bytes();
  const int64_t bytes = swapped.slot_count * frame_bytes;
  if (swapped_bytes_ + bytes > pressure_options_.max_swap_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_swap_bytes: swapping out \"", sequence_id, "\" takes ", bytes, " bytes, ",
                     swapped_bytes_, " are swapped out already and --max_swap_bytes is ",
                     pressure_options_.max_swap_bytes, "; close it instead (nothing changed)"));
  }
  const HostArenaSource source =
      pressure_options_.swap_arena ? pressure_options_.swap_arena() : HostArenaSource();
  ASSIGN_OR_RETURN(swapped.arena, CreateHostArena(absl::StrCat(name_, ".swap"),
                                                  std::max(bytes, frame_bytes), source));
  swapped.keep_name = source.keep_name;
  char* base = static_cast<char*>(swapped.arena->base());
  for (size_t slot = 0; slot < frames.size(); ++slot) {
    pool_->ReadFrame(frames[slot], base + static_cast<int64_t>(slot) * frame_bytes);
  }
  swapped.head_weights.resize(static_cast<size_t>(geometry_.layers));
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    swapped.head_weights[static_cast<size_t>(layer)] = sequence.head_weights(layer);
  }
  if (sequence.running_sum_bytes() > 0) {
    swapped.running_sums.resize(static_cast<size_t>(geometry_.layers));
    for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
      swapped.running_sums[static_cast<size_t>(layer)] = sequence.running_sum(layer);
    }
  }
  SequencePressure& terms = TermsOf(sequence_id);
  terms.quota_frames = 0;
  terms.quota_reason = ReclaimReason::kNone;
  terms.preempt = false;
  if (journal_ != nullptr) {
    journal_->SequenceSwappedOut(SwappedSnapshot{.id = std::string(sequence_id),
                                                 .length = swapped.length,
                                                 .slots = swapped.slots,
                                                 .slot_count = swapped.slot_count,
                                                 .head_weights = swapped.head_weights,
                                                 .running_sums = swapped.running_sums,
                                                 .arena_name = swapped.arena->info().name,
                                                 .pressure = terms});
  }
  swapped.bookkeeping_bytes = sequence.bookkeeping_bytes();
  const int64_t free_before = pool_->free_frames();
  const absl::Status released = sequence.Release(*pool_);
  sequences_.erase(it);
  SwapOutResult result{.freed_frames = pool_->free_frames() - free_before, .swapped_bytes = bytes};
  swapped_bytes_ += bytes;
  counters_.swaps_out++;
  last_call_.erase(sequence_id);
  swapped_.emplace(std::string(sequence_id), std::move(swapped));
  Rebalance();
  RETURN_IF_ERROR(released);
  return result;
}

absl::StatusOr<AppendResult> CacheState::Resume(absl::string_view sequence_id,
                                                AdmissionRefusal* refusal) {
  absl::MutexLock lock(&mu_);
  const auto it = swapped_.find(sequence_id);
  if (it == swapped_.end()) {
    if (sequences_.contains(sequence_id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence_id: \"", sequence_id, "\" is resident; only a swapped-out sequence resumes"));
    }
    return Missing("sequence", sequence_id);
  }
  Swapped& swapped = it->second;
  SequencePressure& terms = TermsOf(sequence_id);
  const int64_t slots = swapped.slot_count;
  // Each slot's layer, free list (its group's rank) and the entries naming it (its references).
  std::vector<int32_t> slot_layer(static_cast<size_t>(slots), -1);
  std::vector<int32_t> slot_list(static_cast<size_t>(slots), 0);
  std::vector<int32_t> slot_refs(static_cast<size_t>(slots), 0);
  std::vector<int64_t> per_list(static_cast<size_t>(pool_->free_lists()), 0);
  for (size_t t = 0; t < swapped.slots.size(); ++t) {
    for (const int32_t slot : swapped.slots[t]) {
      if (slot < 0) continue;
      slot_layer[static_cast<size_t>(slot)] = static_cast<int32_t>(t / geometry_.kv_groups);
      slot_list[static_cast<size_t>(slot)] =
          pool_->GroupRank(static_cast<int>(t % static_cast<size_t>(geometry_.kv_groups)));
      ++slot_refs[static_cast<size_t>(slot)];
    }
  }
  for (int64_t slot = 0; slot < slots; ++slot) {
    ++per_list[static_cast<size_t>(slot_list[static_cast<size_t>(slot)])];
  }
  // Counted as even_free_frames counts, so a fit here fits every rank's list.
  const int64_t need =
      *std::max_element(per_list.begin(), per_list.end()) * static_cast<int64_t>(per_list.size());
  const int64_t reserved = ReservedFrames(sequence_id, terms.priority, terms.admitted);
  const int64_t available = pool_->even_free_frames() - reserved;
  if (need > available) {  // Refuse plans the quotas for what is missing
    return Refuse(sequence_id, need, available, terms.priority, terms.admitted,
                  /*admission=*/true, refusal);
  }
  const int64_t frame_bytes = pool_->frame_bytes();
  const char* base = static_cast<const char*>(swapped.arena->base());
  std::vector<FrameId> frames(static_cast<size_t>(slots), kNoFrame);
  for (int64_t slot = 0; slot < slots; ++slot) {
    ASSIGN_OR_RETURN(
        frames[static_cast<size_t>(slot)],
        pool_->Allocate(slot_layer[static_cast<size_t>(slot)], slot_refs[static_cast<size_t>(slot)],
                        slot_list[static_cast<size_t>(slot)]));
    pool_->WriteFrame(frames[static_cast<size_t>(slot)], base + slot * frame_bytes);
  }
  std::vector<std::vector<FrameId>> tables(swapped.slots.size());
  AppendResult result;
  result.length = swapped.length;
  for (size_t t = 0; t < swapped.slots.size(); ++t) {
    tables[t].reserve(swapped.slots[t].size());
    for (size_t page = 0; page < swapped.slots[t].size(); ++page) {
      const int32_t slot = swapped.slots[t][page];
      const FrameId frame = slot < 0 ? kNoFrame : frames[static_cast<size_t>(slot)];
      tables[t].push_back(frame);
      if (frame == kNoFrame) continue;
      result.new_frames.push_back({.layer = static_cast<int32_t>(t / geometry_.kv_groups),
                                   .group = static_cast<int32_t>(t % geometry_.kv_groups),
                                   .page = static_cast<int64_t>(page),
                                   .frame = frame});
    }
  }
  ASSIGN_OR_RETURN(
      Sequence sequence,
      Sequence::FromSnapshot(std::string(sequence_id), geometry_, layout_, swapped.length,
                             std::move(tables), std::move(swapped.head_weights),
                             std::move(swapped.running_sums)));
  LimitTableGrowth(sequence);
  sequence_bookkeeping_bytes_ += sequence.bookkeeping_bytes() - swapped.bookkeeping_bytes;
  SettleDaemon();
  swapped_bytes_ -= slots * frame_bytes;
  DropArena(std::move(swapped.arena), swapped.keep_name);
  swapped_.erase(it);
  const auto [resident, inserted] =
      sequences_.emplace(std::string(sequence_id), std::move(sequence));
  if (journal_ != nullptr) {
    journal_->SequenceOpened(resident->second);
    journal_->TermsSet(sequence_id, terms);
  }
  pending_.erase(sequence_id);
  counters_.swaps_in++;
  NoteOwnerCall(sequence_id);
  Rebalance();
  return result;
}

absl::Status CacheState::CloseSwapped(absl::string_view sequence_id) {
  const auto it = swapped_.find(sequence_id);
  if (journal_ != nullptr) journal_->SwappedSequenceClosed(sequence_id);
  swapped_bytes_ -= it->second.slot_count * pool_->frame_bytes();
  sequence_bookkeeping_bytes_ -= it->second.bookkeeping_bytes;
  DropArena(std::move(it->second.arena), it->second.keep_name);
  swapped_.erase(it);
  if (const auto terms = terms_.find(sequence_id); terms != terms_.end()) {
    shares_bookkeeping_bytes_ -= SharesBytes(terms->second);
    terms_.erase(terms);
  }
  SettleDaemon();
  Rebalance();
  return absl::OkStatus();
}

std::vector<std::string> CacheState::SwappedIds() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const auto& [id, swapped] : swapped_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<std::string> CacheState::SwapArenaNames() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [id, swapped] : swapped_) {
    if (swapped.arena != nullptr) names.push_back(swapped.arena->info().name);
  }
  return names;
}

absl::Status CacheState::CheckSwapped(
    const std::vector<SwappedSnapshot>& swapped,
    const absl::flat_hash_map<std::string, Sequence>& resident) const {
  absl::flat_hash_map<std::string, bool> seen;
  for (const SwappedSnapshot& snapshot : swapped) {
    const auto fail = [&snapshot](absl::string_view what) {
      return absl::DataLossError(
          absl::StrCat("swapped-out sequence \"", snapshot.id, "\": ", what));
    };
    if (snapshot.id.empty() || resident.contains(snapshot.id) ||
        !seen.emplace(snapshot.id, true).second) {
      return fail("empty, repeated or also resident");
    }
    if (snapshot.length < 0 || snapshot.length > kMaxSequenceTokens) {
      return fail(absl::StrCat("length ", snapshot.length));
    }
    const int64_t pages = PageCount(snapshot.length, geometry_.page_size);
    if (snapshot.slots.size() != static_cast<size_t>(geometry_.layers) * geometry_.kv_groups ||
        snapshot.head_weights.size() != static_cast<size_t>(geometry_.layers) ||
        (!snapshot.running_sums.empty() &&
         snapshot.running_sums.size() != static_cast<size_t>(geometry_.layers))) {
      return fail("tables, weights or running sums of another geometry");
    }
    for (const std::vector<double>& weights : snapshot.head_weights) {
      if (!weights.empty() && weights.size() != static_cast<size_t>(geometry_.query_heads)) {
        return fail("head weights of another geometry");
      }
    }
    for (const std::vector<float>& sum : snapshot.running_sums) {
      const size_t heads = static_cast<size_t>(geometry_.query_heads);
      if (sum.size() % heads != 0 || static_cast<int64_t>(sum.size() / heads) > snapshot.length) {
        return fail("a running sum of another geometry or past the length");
      }
    }
    if (snapshot.slot_count < 0 || snapshot.slot_count > pool_->capacity_frames()) {
      return fail(absl::StrCat(snapshot.slot_count, " slots"));
    }
    std::vector<bool> named(static_cast<size_t>(snapshot.slot_count), false);
    for (const std::vector<int32_t>& table : snapshot.slots) {
      if (static_cast<int64_t>(table.size()) != pages) return fail("a table of the wrong length");
      for (const int32_t slot : table) {
        if (slot < -1 || slot >= snapshot.slot_count) return fail(absl::StrCat("slot ", slot));
        if (slot >= 0) named[static_cast<size_t>(slot)] = true;
      }
    }
    if (std::find(named.begin(), named.end(), false) != named.end()) {
      return fail("a slot no table names");
    }
  }
  return absl::OkStatus();
}

void CacheState::RestoreSwapped(std::vector<SwappedSnapshot> swapped) {
  const int64_t frame_bytes = pool_->frame_bytes();
  for (SwappedSnapshot& snapshot : swapped) {
    const HostArenaSource source{.name = snapshot.arena_name, .attach = true, .keep_name = true};
    absl::StatusOr<std::unique_ptr<MemoryArena>> arena =
        CreateHostArena(absl::StrCat(name_, ".swap"),
                        std::max(snapshot.slot_count * frame_bytes, frame_bytes), source);
    if (!arena.ok()) {
      lost_[snapshot.id] =
          absl::StrCat("its swapped-out bytes did not survive (", arena.status().message(), ")");
      continue;
    }
    Swapped entry;
    entry.length = snapshot.length;
    entry.slots = std::move(snapshot.slots);
    entry.slot_count = snapshot.slot_count;
    entry.head_weights = std::move(snapshot.head_weights);
    entry.running_sums = std::move(snapshot.running_sums);
    entry.arena = *std::move(arena);
    entry.keep_name = true;
    entry.bookkeeping_bytes = Sequence::BookkeepingBytes(
        geometry_, snapshot.id.size(), PageCount(snapshot.length, geometry_.page_size));
    if (!entry.running_sums.empty()) {
      // As Sequence::running_sum_bytes counts them.
      entry.bookkeeping_bytes +=
          static_cast<int64_t>(entry.running_sums.size() * sizeof(std::vector<float>));
      for (const std::vector<float>& sum : entry.running_sums) {
        entry.bookkeeping_bytes += static_cast<int64_t>(sum.size() * sizeof(float));
      }
    }
    sequence_bookkeeping_bytes_ += entry.bookkeeping_bytes;
    swapped_bytes_ += snapshot.slot_count * frame_bytes;
    terms_[snapshot.id] = snapshot.pressure.value_or(SequencePressure());
    swapped_.emplace(snapshot.id, std::move(entry));
  }
}

}  // namespace entrokv
