// Block tables and their reference discipline. Every live entry (!= kNoFrame) holds exactly
// one reference on its frame, so the pool's refcount of a frame equals the number of entries,
// across every sequence, that point at it; a frame is free exactly when no entry names it.
// In the kLayer layout the entries of one (layer, page) name at most one frame: appends set
// them together, forks copy them, evictions only clear them.
#include "core/pool/sequence.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace entrokv {
struct Sequence::TailPlan {
  enum class Action : uint8_t { kFresh, kReference, kCopy };
  int32_t layer = 0;
  int32_t first_group = 0;
  Action action = Action::kFresh;
  FrameId old_frame = kNoFrame;  // the unit's current frame, if any
  int32_t own_references = 0;    // entries of this unit that name old_frame
  FrameId new_frame = kNoFrame;  // filled by Append for kFresh and kCopy
};

Sequence::Sequence(std::string id, const ModelGeometry& geometry, FrameLayout layout)
    : id_(std::move(id)),
      geometry_(geometry),
      layout_(layout),
      tables_(static_cast<size_t>(geometry.layers) * geometry.kv_groups),
      head_weights_(geometry.layers) {}

int64_t Sequence::BookkeepingBytes(const ModelGeometry& geometry, size_t id_bytes,
                                   int64_t table_capacity) {
  // With layers and groups below 2^16 (the service allows 4096) and table_capacity <= 2^31
  // every product stays below 2^63.
  const int64_t tables = static_cast<int64_t>(geometry.layers) * geometry.kv_groups;
  // The hash map's slot (key string and value) and control byte, and the id's heap bytes.
  constexpr int64_t kEntryBytes = static_cast<int64_t>(sizeof(std::string) + sizeof(Sequence)) + 8;
  return kEntryBytes + static_cast<int64_t>(id_bytes) +
         tables * static_cast<int64_t>(sizeof(std::vector<FrameId>)) +
         tables * table_capacity * static_cast<int64_t>(sizeof(FrameId)) +
         static_cast<int64_t>(geometry.layers) *
             static_cast<int64_t>(sizeof(std::vector<double>) +
                                  sizeof(double) * static_cast<size_t>(geometry.query_heads));
}

int64_t Sequence::TableCapacityAfter(int64_t tokens) const {
  const int64_t pages = PagesFor(length_ + tokens);
  if (pages <= table_capacity_) return table_capacity_;
  // Half again at a time amortizes decode-time appends (a new page every B tokens); never
  // beyond the limit when the pages fit under it.
  const int64_t grown = std::min(table_capacity_ + table_capacity_ / 2, table_capacity_limit_);
  return std::max(pages, grown);
}

absl::StatusOr<Sequence> Sequence::Fork(std::string id, const Sequence& parent,
                                        int64_t prefix_pages, PagePool& pool) {
  if (prefix_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix_pages must be >= 0, got ", prefix_pages));
  }
  if (prefix_pages > parent.page_count()) {
    return absl::OutOfRangeError(absl::StrCat("prefix_pages ", prefix_pages, " exceeds the ",
                                              parent.page_count(), " pages of parent \"",
                                              parent.id(), "\""));
  }
  Sequence child(std::move(id), parent.geometry_, parent.layout_);
  child.table_capacity_ = prefix_pages;
  child.table_capacity_limit_ = parent.table_capacity_limit_;
  child.length_ = std::min(parent.length_, prefix_pages * parent.geometry_.page_size);
  child.head_weights_ = parent.head_weights_;
  if (!parent.running_sums_.empty()) {
    child.running_sums_.resize(parent.running_sums_.size());
    for (size_t layer = 0; layer < parent.running_sums_.size(); ++layer) {
      child.running_sums_[layer] =
          parent.RunningSumPrefix(static_cast<int32_t>(layer), child.length_);
    }
  }
  for (size_t t = 0; t < parent.tables_.size(); ++t) {
    const std::vector<FrameId>& source = parent.tables_[t];
    child.tables_[t].reserve(static_cast<size_t>(prefix_pages));
    child.tables_[t].assign(source.begin(), source.begin() + prefix_pages);
    for (const FrameId frame : child.tables_[t]) {
      if (frame != kNoFrame) RETURN_IF_ERROR(pool.AddRef(frame));
    }
  }
  return child;
}

absl::StatusOr<Sequence> Sequence::FromSnapshot(std::string id, const ModelGeometry& geometry,
                                                FrameLayout layout, int64_t length,
                                                std::vector<std::vector<FrameId>> tables,
                                                std::vector<std::vector<double>> head_weights,
                                                std::vector<std::vector<float>> running_sums) {
  Sequence sequence(std::move(id), geometry, layout);
  const auto fail = [&sequence](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("sequence \"", sequence.id_, "\": ", what));
  };
  if (length < 0 || length > kMaxSequenceTokens) return fail(absl::StrCat("length ", length));
  sequence.length_ = length;
  const int64_t pages = sequence.page_count();
  if (tables.size() != sequence.tables_.size()) {
    return fail(
        absl::StrCat(tables.size(), " block tables, the model has ", sequence.tables_.size()));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    if (static_cast<int64_t>(tables[t].size()) != pages) {
      return fail(
          absl::StrCat("block table ", t, " has ", tables[t].size(), " pages, not ", pages));
    }
    for (const FrameId frame : tables[t]) {
      if (frame < kNoFrame) return fail(absl::StrCat("block table ", t, " names frame ", frame));
    }
  }
  if (head_weights.size() != static_cast<size_t>(geometry.layers)) {
    return fail(
        absl::StrCat(head_weights.size(), " head-weight layers, the model has ", geometry.layers));
  }
  for (size_t layer = 0; layer < head_weights.size(); ++layer) {
    if (!head_weights[layer].empty() &&
        head_weights[layer].size() != static_cast<size_t>(geometry.query_heads)) {
      return fail(absl::StrCat("layer ", layer, " caches ", head_weights[layer].size(),
                               " head weights, the model has ", geometry.query_heads, " heads"));
    }
  }
  if (!running_sums.empty() && running_sums.size() != static_cast<size_t>(geometry.layers)) {
    return fail(
        absl::StrCat(running_sums.size(), " running-sum layers, the model has ", geometry.layers));
  }
  for (size_t layer = 0; layer < running_sums.size(); ++layer) {
    const size_t values = running_sums[layer].size();
    if (values % static_cast<size_t>(geometry.query_heads) != 0 ||
        static_cast<int64_t>(values / static_cast<size_t>(geometry.query_heads)) > length) {
      return fail(absl::StrCat("layer ", layer, "'s running sum holds ", values, " values, not ",
                               geometry.query_heads, " heads x at most ", length, " tokens"));
    }
  }
  sequence.tables_ = std::move(tables);
  for (std::vector<FrameId>& table : sequence.tables_) table.shrink_to_fit();
  sequence.table_capacity_ = pages;
  sequence.head_weights_ = std::move(head_weights);
  sequence.running_sums_ = std::move(running_sums);
  return sequence;
}

const std::vector<float>& Sequence::running_sum(int32_t layer) const {
  static const std::vector<float>* const kNone = new std::vector<float>();
  if (running_sums_.empty()) return *kNone;
  return running_sums_[layer];
}

int64_t Sequence::RunningSumBytesUpTo(int64_t tokens) const {
  if (running_sums_.empty()) return 0;
  int64_t bytes = static_cast<int64_t>(running_sums_.size() * sizeof(std::vector<float>));
  for (size_t layer = 0; layer < running_sums_.size(); ++layer) {
    const int64_t covered = std::min(running_sum_tokens(static_cast<int32_t>(layer)), tokens);
    bytes += covered * geometry_.query_heads * static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

std::vector<float> Sequence::RunningSumPrefix(int32_t layer, int64_t tokens) const {
  const std::vector<float>& sum = running_sum(layer);
  const int64_t covered = running_sum_tokens(layer);
  if (tokens >= covered) return sum;
  std::vector<float> prefix;
  prefix.reserve(static_cast<size_t>(tokens * geometry_.query_heads));
  for (int64_t head = 0; head < geometry_.query_heads; ++head) {
    const auto row = sum.begin() + head * covered;
    prefix.insert(prefix.end(), row, row + tokens);
  }
  return prefix;
}

int64_t Sequence::live_frames() const {
  int64_t live = 0;
  const int unit = unit_groups();
  for (int layer = 0; layer < geometry_.layers; ++layer) {
    for (int first = 0; first < geometry_.kv_groups; first += unit) {
      for (int64_t page = 0; page < page_count(); ++page) {
        for (int g = first; g < first + unit; ++g) {
          if (block_table(layer, g)[page] != kNoFrame) {
            ++live;
            break;
          }
        }
      }
    }
  }
  return live;
}

std::vector<std::vector<std::vector<FrameId>>> Sequence::BlockTables() const {
  std::vector<std::vector<std::vector<FrameId>>> tables(geometry_.layers);
  for (int layer = 0; layer < geometry_.layers; ++layer) {
    for (int group = 0; group < geometry_.kv_groups; ++group) {
      tables[layer].push_back(block_table(layer, group));
    }
  }
  return tables;
}

absl::StatusOr<std::vector<Sequence::TailPlan>> Sequence::PlanTail(int64_t tokens,
                                                                   const PagePool& pool) const {
  std::vector<TailPlan> plans;
  if (tokens == 0 || length_ % geometry_.page_size == 0) return plans;
  const int64_t page = page_count() - 1;
  const int unit = unit_groups();
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    for (int32_t first = 0; first < geometry_.kv_groups; first += unit) {
      TailPlan plan{.layer = layer, .first_group = first};
      for (int g = first; g < first + unit; ++g) {
        const FrameId frame = block_table(layer, g)[page];
        if (frame == kNoFrame) continue;
        if (plan.old_frame != kNoFrame && plan.old_frame != frame) {
          return absl::InternalError(absl::StrCat("sequence \"", id_, "\": layer ", layer, " page ",
                                                  page, " names two frames"));
        }
        plan.old_frame = frame;
        ++plan.own_references;
      }
      if (plan.old_frame == kNoFrame) {
        plan.action = TailPlan::Action::kFresh;
      } else if (pool.refcount(plan.old_frame) > plan.own_references) {
        plan.action = TailPlan::Action::kCopy;
      } else if (plan.own_references < unit) {
        plan.action = TailPlan::Action::kReference;
      } else {
        continue;  // a private, fully referenced tail: the engine just writes on
      }
      plans.push_back(plan);
    }
  }
  return plans;
}

absl::StatusOr<std::vector<int64_t>> Sequence::FramesNeededPerList(int64_t tokens,
                                                                   const PagePool& pool) const {
  if (tokens < 0)
    return absl::InvalidArgumentError(absl::StrCat("tokens must be >= 0, got ", tokens));
  if (tokens > kMaxSequenceTokens - length_) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: length ", length_, " + ", tokens, " exceeds ", kMaxSequenceTokens));
  }
  ASSIGN_OR_RETURN(const std::vector<TailPlan> plans, PlanTail(tokens, pool));
  std::vector<int64_t> needed(static_cast<size_t>(pool.free_lists()), 0);
  for (const TailPlan& plan : plans) {
    if (plan.action != TailPlan::Action::kReference) {
      ++needed[static_cast<size_t>(pool.GroupRank(plan.first_group))];
    }
  }
  const int64_t new_pages = PagesFor(length_ + tokens) - page_count();
  for (int32_t first = 0; first < geometry_.kv_groups; first += unit_groups()) {
    needed[static_cast<size_t>(pool.GroupRank(first))] += new_pages * geometry_.layers;
  }
  return needed;
}

absl::StatusOr<int64_t> Sequence::FramesNeeded(int64_t tokens, const PagePool& pool) const {
  ASSIGN_OR_RETURN(const std::vector<int64_t> needed, FramesNeededPerList(tokens, pool));
  if (needed.size() == 1) return needed[0];
  return *std::max_element(needed.begin(), needed.end()) * static_cast<int64_t>(needed.size());
}

absl::StatusOr<AppendResult> Sequence::Append(int64_t tokens, PagePool& pool) {
  if (released_)
    return absl::FailedPreconditionError(absl::StrCat("sequence \"", id_, "\" is closed"));
  ASSIGN_OR_RETURN(const std::vector<int64_t> per_list, FramesNeededPerList(tokens, pool));
  int64_t needed = 0;
  for (int list = 0; list < pool.free_lists(); ++list) {
    const int64_t want = per_list[static_cast<size_t>(list)];
    needed += want;
    if (want <= pool.free_frames(list)) continue;
    if (pool.free_lists() == 1) {
      return absl::ResourceExhaustedError(
          absl::StrCat("pool exhausted: appending ", tokens, " tokens to \"", id_, "\" needs ",
                       want, " frames, ", pool.free_frames(), " free of ", pool.capacity_frames()));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool exhausted: appending ", tokens, " tokens to \"", id_, "\" needs ", want,
        " frames of rank ", list, ", ", pool.free_frames(list), " free of ", pool.rank_frames()));
  }
  ASSIGN_OR_RETURN(std::vector<TailPlan> plans, PlanTail(tokens, pool));
  const int unit = unit_groups();
  int64_t copies = 0;

  // Copies first: the only step that can fail for a reason outside our bookkeeping (a device
  // copy), so undo is just returning the new frames.
  for (size_t i = 0; i < plans.size(); ++i) {
    TailPlan& plan = plans[i];
    if (plan.action != TailPlan::Action::kCopy) continue;
    ASSIGN_OR_RETURN(plan.new_frame,
                     pool.Allocate(plan.layer, unit, pool.GroupRank(plan.first_group)));
    ++copies;
    if (absl::Status copied = pool.CopyFrame(plan.old_frame, plan.new_frame); !copied.ok()) {
      for (size_t j = 0; j <= i; ++j) {
        if (plans[j].action != TailPlan::Action::kCopy) continue;
        for (int r = 0; r < unit; ++r) RETURN_IF_ERROR(pool.Release(plans[j].new_frame).status());
      }
      return copied;
    }
  }

  // Commit. From here on nothing can fail unless the invariant was already broken.
  const int64_t old_pages = page_count();
  const int64_t tail = old_pages - 1;
  std::vector<bool> tail_changed(tables_.size(), false);
  for (TailPlan& plan : plans) {
    if (plan.action == TailPlan::Action::kFresh) {
      ASSIGN_OR_RETURN(plan.new_frame,
                       pool.Allocate(plan.layer, unit, pool.GroupRank(plan.first_group)));
    }
    for (int g = plan.first_group; g < plan.first_group + unit; ++g) {
      FrameId& entry = table(plan.layer, g)[tail];
      if (plan.action == TailPlan::Action::kReference) {
        if (entry != kNoFrame) continue;
        RETURN_IF_ERROR(pool.AddRef(plan.old_frame));
        entry = plan.old_frame;
      } else {
        if (entry != kNoFrame) RETURN_IF_ERROR(pool.Release(entry).status());
        entry = plan.new_frame;
      }
      tail_changed[static_cast<size_t>(plan.layer) * geometry_.kv_groups + g] = true;
    }
  }
  const int64_t capacity = TableCapacityAfter(tokens);
  length_ += tokens;
  const int64_t new_pages = page_count();
  if (capacity != table_capacity_) {
    for (auto& block_table : tables_) block_table.reserve(static_cast<size_t>(capacity));
    table_capacity_ = capacity;
  }
  for (auto& block_table : tables_) block_table.resize(new_pages, kNoFrame);
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    for (int32_t first = 0; first < geometry_.kv_groups; first += unit) {
      for (int64_t page = old_pages; page < new_pages; ++page) {
        ASSIGN_OR_RETURN(const FrameId frame, pool.Allocate(layer, unit, pool.GroupRank(first)));
        for (int g = first; g < first + unit; ++g) table(layer, g)[page] = frame;
      }
    }
  }

  AppendResult result;
  result.length = length_;
  result.frames_copied = copies;
  result.new_frames.reserve(static_cast<size_t>(needed) * unit);
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    for (int32_t group = 0; group < geometry_.kv_groups; ++group) {
      const std::vector<FrameId>& entries = block_table(layer, group);
      if (tail_changed[static_cast<size_t>(layer) * geometry_.kv_groups + group]) {
        result.new_frames.push_back({layer, group, tail, entries[tail]});
      }
      for (int64_t page = old_pages; page < new_pages; ++page) {
        result.new_frames.push_back({layer, group, page, entries[page]});
      }
    }
  }
  return result;
}

absl::Status Sequence::CheckDecision(int32_t layer, int64_t decided_tokens,
                                     const std::vector<std::vector<int32_t>>& kept_pages_per_group,
                                     const std::vector<float>* running_sum) const {
  if (released_)
    return absl::FailedPreconditionError(absl::StrCat("sequence \"", id_, "\" is closed"));
  RETURN_IF_ERROR(CheckLayer(geometry_, layer));
  if (decided_tokens != length_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "decision is for ", decided_tokens, " tokens but sequence \"", id_, "\" has ", length_));
  }
  if (kept_pages_per_group.size() != static_cast<size_t>(geometry_.kv_groups)) {
    return absl::FailedPreconditionError(
        absl::StrCat("kept_pages_per_group has ", kept_pages_per_group.size(),
                     " groups, the model has ", geometry_.kv_groups));
  }
  const int64_t pages = page_count();
  for (int g = 0; g < geometry_.kv_groups; ++g) {
    const std::vector<int32_t>& kept = kept_pages_per_group[g];
    for (size_t i = 0; i < kept.size(); ++i) {
      if (kept[i] < 0 || (i > 0 && kept[i] <= kept[i - 1])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "kept_pages_per_group[", g, "] must be strictly ascending and >= 0 (index ", i, ")"));
      }
      if (kept[i] >= pages) {
        return absl::FailedPreconditionError(absl::StrCat("kept_pages_per_group[", g, "] page ",
                                                          kept[i], " >= the sequence's ", pages,
                                                          " pages"));
      }
    }
  }
  if (running_sum != nullptr &&
      static_cast<int64_t>(running_sum->size()) != length_ * geometry_.query_heads) {
    return absl::InvalidArgumentError(absl::StrCat("running sum of ", running_sum->size(),
                                                   " values, expected ", geometry_.query_heads,
                                                   " heads x ", length_, " tokens"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ApplyResult> Sequence::ApplyDecision(
    int32_t layer, int64_t decided_tokens,
    const std::vector<std::vector<int32_t>>& kept_pages_per_group, PagePool& pool,
    std::vector<float>* running_sum) {
  RETURN_IF_ERROR(CheckDecision(layer, decided_tokens, kept_pages_per_group, running_sum));
  const int64_t pages = page_count();
  ApplyResult result;
  result.evicted_pages_per_group.resize(geometry_.kv_groups);
  size_t max_kept = 0;
  for (int g = 0; g < geometry_.kv_groups; ++g) {
    const std::vector<int32_t>& kept = kept_pages_per_group[g];
    max_kept = std::max(max_kept, kept.size());
    std::vector<FrameId>& entries = table(layer, g);
    size_t next = 0;  // cursor into the ascending kept list
    for (int64_t page = 0; page < pages; ++page) {
      if (next < kept.size() && kept[next] == page) {
        ++next;
        continue;
      }
      const FrameId frame = entries[page];
      if (frame == kNoFrame) continue;
      entries[page] = kNoFrame;
      result.evicted_pages_per_group[g].push_back(page);
      ASSIGN_OR_RETURN(const bool freed, pool.Release(frame));
      if (freed) result.freed_frames.push_back(frame);
    }
  }
  result.frames_released = static_cast<int64_t>(result.freed_frames.size());
  if (layout_ == FrameLayout::kLayer && max_kept > 0) {
    std::vector<bool> in_union(pages, false);
    int64_t union_size = 0;
    for (const auto& kept : kept_pages_per_group) {
      for (const int32_t page : kept) {
        if (!in_union[page]) {
          in_union[page] = true;
          ++union_size;
        }
      }
    }
    result.page_union_ratio = static_cast<double>(union_size) / static_cast<double>(max_kept);
  }
  if (running_sum != nullptr) {
    if (running_sums_.empty()) running_sums_.resize(geometry_.layers);
    running_sums_[layer] = std::move(*running_sum);
    result.running_sum_set = true;
  }
  return result;
}

absl::StatusOr<TruncateResult> Sequence::Truncate(int64_t tokens, PagePool& pool) {
  if (released_)
    return absl::FailedPreconditionError(absl::StrCat("sequence \"", id_, "\" is closed"));
  if (tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tokens must be >= 1, got ", tokens));
  }
  if (tokens > length_) {
    return absl::OutOfRangeError(absl::StrCat("tokens: ", tokens, " is more than the ", length_,
                                              " tokens of sequence \"", id_, "\""));
  }
  TruncateResult result;
  const int64_t new_length = length_ - tokens;
  const int64_t new_pages = PagesFor(new_length);
  for (std::vector<FrameId>& entries : tables_) {
    for (size_t page = static_cast<size_t>(new_pages); page < entries.size(); ++page) {
      if (entries[page] == kNoFrame) continue;
      ++result.entries_released;
      ASSIGN_OR_RETURN(const bool freed, pool.Release(entries[page]));
      if (freed) result.freed_frames.push_back(entries[page]);
    }
    entries.resize(static_cast<size_t>(new_pages));  // the reserved capacity stays
  }
  for (size_t layer = 0; layer < running_sums_.size(); ++layer) {
    if (running_sum_tokens(static_cast<int32_t>(layer)) > new_length) {
      running_sums_[layer] = RunningSumPrefix(static_cast<int32_t>(layer), new_length);
    }
  }
  length_ = new_length;
  result.length = length_;
  return result;
}

absl::Status Sequence::SetHeadWeights(int32_t layer, std::vector<double> weights) {
  RETURN_IF_ERROR(CheckLayer(geometry_, layer));
  if (weights.size() != static_cast<size_t>(geometry_.query_heads)) {
    return absl::InvalidArgumentError(absl::StrCat("head weights: ", weights.size(),
                                                   " values, the model has ", geometry_.query_heads,
                                                   " query heads"));
  }
  head_weights_[layer] = std::move(weights);
  return absl::OkStatus();
}

absl::Status Sequence::Release(PagePool& pool) {
  if (released_) {
    return absl::FailedPreconditionError(absl::StrCat("sequence \"", id_, "\" is already closed"));
  }
  absl::Status first_error;
  for (auto& entries : tables_) {
    for (const FrameId frame : entries) {
      if (frame == kNoFrame) continue;
      if (absl::Status status = pool.Release(frame).status(); !status.ok() && first_error.ok()) {
        first_error =
            absl::InternalError(absl::StrCat("sequence \"", id_, "\": ", status.message()));
      }
    }
    entries.clear();
    entries.shrink_to_fit();
  }
  length_ = 0;
  table_capacity_ = 0;
  for (auto& weights : head_weights_) weights.clear();
  running_sums_.clear();
  running_sums_.shrink_to_fit();
  released_ = true;
  return first_error;
}

}  // namespace entrokv
