#include "core/pool/cache_state.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace entrokv {
namespace {

absl::Status CheckId(absl::string_view field, absl::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " must not be empty"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CacheState>> CacheState::Create(const CacheOptions& options) {
  RETURN_IF_ERROR(ValidateGeometry(options.geometry));
  RETURN_IF_ERROR(ValidatePressureOptions(options.pressure));
  const int64_t frame_bytes = FrameBytes(options.geometry, options.layout);
  if (options.capacity_bytes < frame_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("capacity_bytes ", options.capacity_bytes,
                                                   " holds no frame of ", frame_bytes, " bytes"));
  }
  PagePoolOptions pool_options;
  pool_options.geometry = options.geometry;
  pool_options.layout = options.layout;
  pool_options.backend = options.backend;
  pool_options.capacity_frames = options.capacity_bytes / frame_bytes;
  // In the group layout each rank's arena holds an equal share of whole frames.
  const auto ranks = static_cast<int64_t>(options.devices.size());
  if (options.layout == FrameLayout::kGroup && ranks > 1) {
    pool_options.capacity_frames -= pool_options.capacity_frames % ranks;
    if (pool_options.capacity_frames == 0) {
      return absl::InvalidArgumentError(absl::StrCat("capacity_bytes ", options.capacity_bytes,
                                                     " holds no frame of ", frame_bytes,
                                                     " bytes for each of ", ranks, " ranks"));
    }
  }
  pool_options.name = options.name;
  pool_options.devices = options.devices;
  pool_options.host_arenas = options.host_arenas;
  // The pool's arrays are reserved in the daemon's budget before the arena or they exist (a
  // count beyond a FrameId is PagePool::Create's INVALID_ARGUMENT, reserved nothing).
  BookkeepingBudget* const daemon = options.limits.daemon;
  int64_t reserved = 0;
  if (daemon != nullptr && pool_options.capacity_frames <= std::numeric_limits<FrameId>::max()) {
    reserved = PagePool::BookkeepingBytes(pool_options.capacity_frames, options.geometry.layers);
    RETURN_IF_ERROR(daemon->Reserve(
        reserved, absl::StrCat("a pool of ", pool_options.capacity_frames, " frames")));
  }
  absl::StatusOr<std::unique_ptr<PagePool>> pool = PagePool::Create(pool_options);
  if (!pool.ok()) {
    if (daemon != nullptr) daemon->Release(reserved);
    return pool.status();
  }
  std::unique_ptr<CacheState> state(new CacheState(options, *std::move(pool)));
  absl::MutexLock lock(&state->mu_);
  state->daemon_reserved_bytes_ = reserved;
  return state;
}

absl::Status CacheState::CheckLimits(const CacheOptions& options) {
  const ModelGeometry& geometry = options.geometry;
  const CacheLimits& limits = options.limits;
  const int64_t empty = Sequence::BookkeepingBytes(geometry, 1, 0);
  if (limits.max_sequence_bookkeeping_bytes > 0 && empty > limits.max_sequence_bookkeeping_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_sequence_bookkeeping_bytes: an empty sequence of ", geometry.layers, " layers x ",
        geometry.kv_groups, " KV groups already holds ", empty,
        " bytes of bookkeeping (block tables and head weights), more than the limit of ",
        limits.max_sequence_bookkeeping_bytes));
  }
  const int64_t frames = options.capacity_bytes / FrameBytes(geometry, options.layout);
  const int64_t pool = PagePool::BookkeepingBytes(frames, geometry.layers);
  if (limits.max_model_bookkeeping_bytes > 0 && pool + empty > limits.max_model_bookkeeping_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_model_bookkeeping_bytes: the pool's ", frames, " frames and one empty sequence hold ",
        pool + empty, " bytes of bookkeeping, more than the limit of ",
        limits.max_model_bookkeeping_bytes));
  }
  return absl::OkStatus();
}

void CacheState::LimitTableGrowth(Sequence& sequence) const {
  if (limits_.max_sequence_bookkeeping_bytes <= 0) return;
  const int64_t fixed = Sequence::BookkeepingBytes(geometry_, sequence.id().size(), 0);
  const int64_t per_entry = static_cast<int64_t>(geometry_.layers) * geometry_.kv_groups *
                            static_cast<int64_t>(sizeof(FrameId));
  sequence.set_table_capacity_limit(
      std::max<int64_t>(0, (limits_.max_sequence_bookkeeping_bytes - fixed) / per_entry));
}

absl::Status CacheState::CheckOneMore() const {
  const auto open = static_cast<int64_t>(sequences_.size());
  if (limits_.max_sequences_per_model > 0 && open >= limits_.max_sequences_per_model) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_sequences_per_model: the model has ", open,
                     " open sequences, the limit; close some first"));
  }
  return absl::OkStatus();
}

absl::Status CacheState::ReserveGrowth(absl::string_view sequence_id, int64_t old_bytes,
                                       int64_t new_bytes) {
  if (limits_.max_sequence_bookkeeping_bytes > 0 &&
      new_bytes > limits_.max_sequence_bookkeeping_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_sequence_bookkeeping_bytes: sequence \"", sequence_id, "\" would hold ", new_bytes,
        " bytes of bookkeeping (block tables of ", geometry_.layers, " layers x ",
        geometry_.kv_groups, " KV groups, head weights, running sums), more than the limit of ",
        limits_.max_sequence_bookkeeping_bytes, "; nothing changed"));
  }
  const int64_t total =
      pool_bookkeeping_bytes_ + sequence_bookkeeping_bytes_ - old_bytes + new_bytes;
  if (limits_.max_model_bookkeeping_bytes > 0 && total > limits_.max_model_bookkeeping_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_model_bookkeeping_bytes: the model's bookkeeping would reach ", total,
                     " bytes, more than the limit of ", limits_.max_model_bookkeeping_bytes,
                     "; close sequences first (nothing changed)"));
  }
  if (limits_.daemon != nullptr && new_bytes > old_bytes) {
    RETURN_IF_ERROR(limits_.daemon->Reserve(new_bytes - old_bytes,
                                            absl::StrCat("sequence \"", sequence_id, "\"")));
    daemon_reserved_bytes_ += new_bytes - old_bytes;
  }
  return absl::OkStatus();
}

void CacheState::SettleDaemon() {
  if (limits_.daemon == nullptr) return;
  const int64_t accounted =
      pool_bookkeeping_bytes_ + sequence_bookkeeping_bytes_ + shares_bookkeeping_bytes_;
  if (daemon_reserved_bytes_ > accounted) {
    limits_.daemon->Release(daemon_reserved_bytes_ - accounted);
  } else if (daemon_reserved_bytes_ < accounted) {
    limits_.daemon->Force(accounted - daemon_reserved_bytes_);
  }
  daemon_reserved_bytes_ = accounted;
}

CacheState::CacheState(const CacheOptions& options, std::unique_ptr<PagePool> pool)
    : geometry_(options.geometry),
      layout_(options.layout),
      ranks_(static_cast<int>(options.devices.size())),
      name_(options.name),
      limits_(options.limits),
      pool_(std::move(pool)),
      pressure_options_(options.pressure) {
  absl::MutexLock lock(&mu_);
  pool_bookkeeping_bytes_ = PagePool::BookkeepingBytes(pool_->capacity_frames(), geometry_.layers);
}

CacheState::~CacheState() {
  absl::MutexLock lock(&mu_);
  // Drop the references before the pool (and its arena) goes.
  for (auto& [id, sequence] : sequences_) sequence.Release(*pool_).IgnoreError();
  sequences_.clear();
  if (limits_.daemon != nullptr) limits_.daemon->Release(daemon_reserved_bytes_);
}

absl::Status CacheState::OpenSequence(absl::string_view sequence_id, int64_t initial_tokens) {
  return OpenSequence(sequence_id, initial_tokens, SequenceTerms());
}

absl::Status CacheState::OpenSequence(absl::string_view sequence_id, int64_t initial_tokens,
                                      const SequenceTerms& terms) {
  RETURN_IF_ERROR(CheckId("sequence_id", sequence_id));
  RETURN_IF_ERROR(ValidateSequenceTerms(terms, pressure_options_.tenants));
  if (initial_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial_tokens must be >= 0, got ", initial_tokens));
  }
  absl::MutexLock lock(&mu_);
  if (sequences_.contains(sequence_id) || swapped_.contains(sequence_id)) {
    return absl::AlreadyExistsError(absl::StrCat("sequence \"", sequence_id, "\" is already open"));
  }
  RETURN_IF_ERROR(CheckOneMore());
  Sequence sequence(std::string(sequence_id), geometry_, layout_);
  LimitTableGrowth(sequence);
  const absl::Cleanup settle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { SettleDaemon(); };
  if (initial_tokens <= kMaxSequenceTokens) {  // beyond: Append's INVALID_ARGUMENT
    RETURN_IF_ERROR(
        ReserveGrowth(sequence_id, 0,
                      Sequence::BookkeepingBytes(geometry_, sequence_id.size(),
                                                 sequence.TableCapacityAfter(initial_tokens))));
  }
  ASSIGN_OR_RETURN(const AppendResult appended, sequence.Append(initial_tokens, *pool_));
  (void)appended;
  sequence_bookkeeping_bytes_ += sequence.bookkeeping_bytes();
  const auto [it, inserted] = sequences_.emplace(std::string(sequence_id), std::move(sequence));
  ForgetLost(sequence_id);
  if (journal_ != nullptr) journal_->SequenceOpened(it->second);
  AdoptTerms(sequence_id, terms);
  return absl::OkStatus();
}

absl::Status CacheState::ForkSequence(absl::string_view sequence_id, absl::string_view parent_id,
                                      int64_t prefix_pages) {
  return ForkSequence(sequence_id, parent_id, prefix_pages, SequenceTerms());
}

absl::Status CacheState::ForkSequence(absl::string_view sequence_id, absl::string_view parent_id,
                                      int64_t prefix_pages, const SequenceTerms& terms) {
  RETURN_IF_ERROR(CheckId("sequence_id", sequence_id));
  RETURN_IF_ERROR(ValidateSequenceTerms(terms, pressure_options_.tenants));
  RETURN_IF_ERROR(CheckId("parent_id", parent_id));
  absl::MutexLock lock(&mu_);
  if (sequences_.contains(sequence_id) || swapped_.contains(sequence_id)) {
    return absl::AlreadyExistsError(absl::StrCat("sequence \"", sequence_id, "\" is already open"));
  }
  const auto parent = sequences_.find(parent_id);
  if (parent == sequences_.end()) return Missing("parent sequence", parent_id);
  RETURN_IF_ERROR(CheckOneMore());
  const absl::Cleanup settle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { SettleDaemon(); };
  if (prefix_pages >= 0 && prefix_pages <= parent->second.page_count()) {
    const int64_t child_length =
        std::min(parent->second.length(), prefix_pages * int64_t{geometry_.page_size});
    RETURN_IF_ERROR(
        ReserveGrowth(sequence_id, 0,
                      Sequence::BookkeepingBytes(geometry_, sequence_id.size(), prefix_pages) +
                          parent->second.RunningSumBytesUpTo(child_length)));
  }
  ASSIGN_OR_RETURN(Sequence child,
                   Sequence::Fork(std::string(sequence_id), parent->second, prefix_pages, *pool_));
  LimitTableGrowth(child);
  sequence_bookkeeping_bytes_ += child.bookkeeping_bytes();
  const auto [it, inserted] = sequences_.emplace(std::string(sequence_id), std::move(child));
  ForgetLost(sequence_id);
  if (journal_ != nullptr) journal_->SequenceOpened(it->second);
  AdoptTerms(sequence_id, terms);
  return absl::OkStatus();
}

absl::StatusOr<AppendResult> CacheState::AppendTokens(absl::string_view sequence_id,
                                                      int64_t tokens) {
  return AppendTokens(sequence_id, tokens, AppendOptions());
}

absl::StatusOr<TruncateResult> CacheState::TruncateSequence(absl::string_view sequence_id,
                                                            int64_t tokens) {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  Sequence& sequence = it->second;
  const int64_t old_bytes = sequence.bookkeeping_bytes();
  const int64_t old_pages = sequence.page_count();
  ASSIGN_OR_RETURN(TruncateResult result, sequence.Truncate(tokens, *pool_));
  sequence_bookkeeping_bytes_ += sequence.bookkeeping_bytes() - old_bytes;
  SettleDaemon();
  if (journal_ != nullptr) journal_->TokensTruncated(sequence, old_pages);
  // Page shares past the new end go with their pages: a page appended there later is unscored
  // until a decision scores it, so no quota takes it first. Their capacity stays accounted.
  NoteOwnerCall(sequence_id);
  SequencePressure& terms = TermsOf(sequence_id);
  const auto pages = static_cast<size_t>(sequence.page_count());
  std::vector<bool> trimmed(static_cast<size_t>(geometry_.layers), false);
  for (size_t t = 0; t < terms.shares.size(); ++t) {
    if (terms.shares[t].size() <= pages) continue;
    terms.shares[t].resize(pages);
    trimmed[t / static_cast<size_t>(geometry_.kv_groups)] = true;
  }
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    if (trimmed[static_cast<size_t>(layer)] && journal_ != nullptr) {
      journal_->SharesSet(sequence_id, terms, layer);
    }
  }
  Rebalance();
  return result;
}

absl::StatusOr<ApplyResult> CacheState::ApplyDecision(
    absl::string_view sequence_id, int32_t layer, int64_t decided_tokens,
    const std::vector<std::vector<int32_t>>& kept_pages_per_group) {
  std::vector<LayerKeep> layers(1);
  layers[0].layer = layer;
  layers[0].kept_pages_per_group = kept_pages_per_group;
  ASSIGN_OR_RETURN(std::vector<ApplyResult> results,
                   ApplyDecisions(sequence_id, decided_tokens, std::move(layers)));
  return std::move(results.front());
}

absl::Status CacheState::MergeRunningSumRows(const Sequence& sequence, int64_t decided_tokens,
                                             LayerKeep& keep) const {
  if (!keep.running_sum.has_value() || keep.running_sum_heads == 0) return absl::OkStatus();
  const int64_t first = keep.running_sum_first_head;
  const int64_t heads = keep.running_sum_heads;
  if (first < 0 || heads < 0 || first + heads > geometry_.query_heads ||
      static_cast<int64_t>(keep.running_sum->size()) != heads * decided_tokens || keep.layer < 0 ||
      keep.layer >= geometry_.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", keep.layer, ": running sum rows [", first, ", ", first + heads,
                     ") of ", keep.running_sum->size(), " values do not fit ",
                     geometry_.query_heads, " heads x ", decided_tokens, " tokens"));
  }
  const std::vector<float>& before = sequence.running_sum(keep.layer);
  const int64_t covered = static_cast<int64_t>(before.size()) / geometry_.query_heads;
  std::vector<float> merged(static_cast<size_t>(geometry_.query_heads * decided_tokens), 0.0F);
  for (int64_t head = 0; head < geometry_.query_heads; ++head) {
    float* row = merged.data() + head * decided_tokens;
    if (head >= first && head < first + heads) {
      const float* own = keep.running_sum->data() + (head - first) * decided_tokens;
      std::copy(own, own + decided_tokens, row);
    } else {
      const float* kept = before.data() + head * covered;
      std::copy(kept, kept + std::min(covered, decided_tokens), row);
    }
  }
  keep.running_sum = std::move(merged);
  keep.running_sum_first_head = 0;
  keep.running_sum_heads = 0;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ApplyResult>> CacheState::ApplyDecisions(absl::string_view sequence_id,
                                                                    int64_t decided_tokens,
                                                                    std::vector<LayerKeep> layers) {
  if (layers.empty()) return absl::InvalidArgumentError("a decision needs at least one layer");
  std::vector<ApplyResult> results;
  std::function<void()> hook;
  {
    absl::MutexLock lock(&mu_);
    const auto it = sequences_.find(sequence_id);
    if (it == sequences_.end()) return Missing("sequence", sequence_id);
    Sequence& sequence = it->second;
    std::vector<bool> seen(geometry_.layers, false);
    // The running sums' bytes after the decision: each replaced layer's old sum goes, its new
    // one comes (and the L vector headers with the first one).
    int64_t running_delta = 0;
    bool first_sum = sequence.running_sum_bytes() == 0;
    for (LayerKeep& keep : layers) {
      RETURN_IF_ERROR(MergeRunningSumRows(sequence, decided_tokens, keep));
      const std::vector<float>* sum = keep.running_sum ? &*keep.running_sum : nullptr;
      if (absl::Status checked =
              sequence.CheckDecision(keep.layer, decided_tokens, keep.kept_pages_per_group, sum);
          !checked.ok()) {
        return absl::Status(checked.code(),
                            absl::StrCat("layer ", keep.layer, ": ", checked.message()));
      }
      if (seen[keep.layer]) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", keep.layer, " appears twice"));
      }
      seen[keep.layer] = true;
      if (sum != nullptr) {
        running_delta +=
            static_cast<int64_t>(sum->size() * sizeof(float)) -
            static_cast<int64_t>(sequence.running_sum(keep.layer).size() * sizeof(float));
        if (first_sum) {
          running_delta += static_cast<int64_t>(geometry_.layers * sizeof(std::vector<float>));
          first_sum = false;
        }
      }
    }
    const int64_t old_bytes = sequence.bookkeeping_bytes();
    const absl::Cleanup settle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { SettleDaemon(); };
    if (running_delta > 0) {
      RETURN_IF_ERROR(ReserveGrowth(sequence_id, old_bytes, old_bytes + running_delta));
    }
    // Checked: from here on nothing fails unless the pool's invariant was already broken.
    results.reserve(layers.size());
    for (LayerKeep& keep : layers) {
      ASSIGN_OR_RETURN(
          ApplyResult result,
          sequence.ApplyDecision(keep.layer, decided_tokens, keep.kept_pages_per_group, *pool_,
                                 keep.running_sum ? &*keep.running_sum : nullptr));
      for (const auto& pages : result.evicted_pages_per_group) {
        pages_evicted_total_ += static_cast<int64_t>(pages.size());
      }
      frames_freed_total_ += result.frames_released;
      ++decisions_total_;
      results.push_back(std::move(result));
    }
    sequence_bookkeeping_bytes_ += sequence.bookkeeping_bytes() - old_bytes;
    // One journal write for every layer: a crash keeps the whole decision or none of it.
    if (journal_ != nullptr) journal_->DecisionApplied(sequence, layers, results);
    hook = decision_hook_;
  }
  if (hook) hook();
  return results;
}

void CacheState::SetDecisionHookForTest(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  decision_hook_ = std::move(hook);
}

absl::Status CacheState::SetHeadWeightRows(absl::string_view sequence_id, int32_t layer,
                                           int32_t first_head, std::vector<double> weights) {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  Sequence& sequence = it->second;
  RETURN_IF_ERROR(CheckLayer(geometry_, layer));
  const auto heads = static_cast<int64_t>(weights.size());
  if (first_head < 0 || first_head + heads > geometry_.query_heads) {
    return absl::InvalidArgumentError(absl::StrCat("head weights: rows [", first_head, ", ",
                                                   first_head + heads, ") outside the model's ",
                                                   geometry_.query_heads, " query heads"));
  }
  std::vector<double> merged = sequence.head_weights(layer);
  if (merged.empty()) {
    merged.assign(static_cast<size_t>(geometry_.query_heads),
                  std::numeric_limits<double>::quiet_NaN());
  }
  std::copy(weights.begin(), weights.end(), merged.begin() + first_head);
  RETURN_IF_ERROR(sequence.SetHeadWeights(layer, std::move(merged)));
  if (journal_ != nullptr) journal_->HeadWeightsSet(sequence, layer);
  return absl::OkStatus();
}

absl::Status CacheState::SetHeadWeights(absl::string_view sequence_id, int32_t layer,
                                        std::vector<double> weights) {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  RETURN_IF_ERROR(it->second.SetHeadWeights(layer, std::move(weights)));
  if (journal_ != nullptr) journal_->HeadWeightsSet(it->second, layer);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> CacheState::GetHeadWeights(absl::string_view sequence_id,
                                                               int32_t layer) const {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  RETURN_IF_ERROR(CheckLayer(geometry_, layer));
  return it->second.head_weights(layer);
}

absl::StatusOr<std::vector<float>> CacheState::RunningSum(absl::string_view sequence_id,
                                                          int32_t layer) const {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  RETURN_IF_ERROR(CheckLayer(geometry_, layer));
  return it->second.running_sum(layer);
}

absl::StatusOr<std::vector<uint8_t>> CacheState::LivePages(absl::string_view sequence_id,
                                                           int32_t layer) const {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  RETURN_IF_ERROR(CheckLayer(geometry_, layer));
  const Sequence& sequence = it->second;
  std::vector<uint8_t> live;
  bool any_evicted = false;
  for (int group = 0; group < geometry_.kv_groups; ++group) {
    for (const FrameId frame : sequence.block_table(layer, group)) {
      live.push_back(frame != kNoFrame ? 1 : 0);
      any_evicted |= frame == kNoFrame;
    }
  }
  if (!any_evicted) live.clear();
  return live;
}

absl::Status CacheState::CloseSequence(absl::string_view sequence_id) {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) {
    if (lost_.contains(sequence_id)) {  // the client acknowledges the loss
      ForgetLost(sequence_id);
      return absl::OkStatus();
    }
    if (swapped_.contains(sequence_id)) return CloseSwapped(sequence_id);
    return Missing("sequence", sequence_id);
  }
  if (journal_ != nullptr) journal_->SequenceClosed(it->second);
  sequence_bookkeeping_bytes_ -= it->second.bookkeeping_bytes();
  if (const auto terms = terms_.find(sequence_id); terms != terms_.end()) {
    shares_bookkeeping_bytes_ -= SharesBytes(terms->second);
    terms_.erase(terms);
  }
  last_call_.erase(sequence_id);
  SettleDaemon();
  const absl::Status released = it->second.Release(*pool_);
  sequences_.erase(it);
  Rebalance();
  return released;
}

absl::Status CacheState::Missing(absl::string_view what, absl::string_view id) const {
  if (swapped_.contains(id)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " \"", id, "\" is swapped out; ResumeSequence it first (or close it)"));
  }
  if (const auto lost = lost_.find(id); lost != lost_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " \"", id, "\" was lost when entrokvd restarted: ", lost->second,
                     "; close it or open it again"));
  }
  return absl::NotFoundError(absl::StrCat(what, " \"", id, "\" is not open"));
}

void CacheState::ForgetLost(absl::string_view sequence_id) {
  if (lost_.erase(sequence_id) > 0 && journal_ != nullptr) {
    journal_->LostSequenceForgotten(sequence_id);
  }
}

void CacheState::SetJournal(CacheJournal* journal) {
  absl::MutexLock lock(&mu_);
  journal_ = journal;
}

void CacheState::MarkLost(const std::vector<std::string>& sequence_ids, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : sequence_ids) {
    if (!sequences_.contains(id)) lost_[id] = reason;
  }
}

absl::Status CacheState::Restore(std::vector<SequenceSnapshot> snapshots,
                                 std::vector<SwappedSnapshot> swapped) {
  absl::MutexLock lock(&mu_);
  if (!sequences_.empty() || pool_->used_frames() != 0) {
    return absl::FailedPreconditionError("restore: the pool already holds sequences");
  }
  const int64_t capacity = pool_->capacity_frames();
  std::vector<int32_t> refcounts(capacity, 0);
  std::vector<int32_t> layers(capacity, -1);
  absl::flat_hash_map<std::string, Sequence> restored;
  absl::flat_hash_map<std::string, SequencePressure> terms;
  for (SequenceSnapshot& snapshot : snapshots) {
    const std::string id = snapshot.id;
    const auto fail = [&id](absl::string_view what) {
      return absl::DataLossError(absl::StrCat("sequence \"", id, "\": ", what));
    };
    if (id.empty() || restored.contains(id)) return fail("empty or duplicate id");
    terms[id] = snapshot.pressure.value_or(SequencePressure());
    ASSIGN_OR_RETURN(
        Sequence sequence,
        Sequence::FromSnapshot(id, geometry_, layout_, snapshot.length, std::move(snapshot.tables),
                               std::move(snapshot.head_weights), std::move(snapshot.running_sums)));
    for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
      for (int64_t page = 0; page < sequence.page_count(); ++page) {
        FrameId unit_frame = kNoFrame;
        for (int32_t group = 0; group < geometry_.kv_groups; ++group) {
          const FrameId frame = sequence.block_table(layer, group)[page];
          if (frame == kNoFrame) continue;
          if (frame >= capacity) {
            return fail(absl::StrCat("names frame ", frame, " of a pool of ", capacity));
          }
          if (pool_->FrameRank(frame) != pool_->GroupRank(group)) {
            return fail(absl::StrCat("group ", group, " names frame ", frame, " of rank ",
                                     pool_->FrameRank(frame)));
          }
          if (layers[frame] != -1 && layers[frame] != layer) {
            return fail(absl::StrCat("frame ", frame, " is named by layers ", layers[frame],
                                     " and ", layer));
          }
          if (layout_ == FrameLayout::kLayer && unit_frame != kNoFrame && unit_frame != frame) {
            return fail(absl::StrCat("layer ", layer, " page ", page, " names two frames"));
          }
          if (refcounts[frame] == std::numeric_limits<int32_t>::max()) {
            return fail(absl::StrCat("frame ", frame, " has too many references"));
          }
          unit_frame = frame;
          layers[frame] = layer;
          ++refcounts[frame];
        }
      }
    }
    restored.emplace(id, std::move(sequence));
  }
  RETURN_IF_ERROR(CheckSwapped(swapped, restored));
  RETURN_IF_ERROR(pool_->Restore(refcounts, layers));
  sequences_ = std::move(restored);
  terms_ = std::move(terms);
  RestoreSwapped(std::move(swapped));
  shares_bookkeeping_bytes_ = 0;
  for (const auto& [id, pressure] : terms_) {
    shares_bookkeeping_bytes_ += SharesBytes(pressure);
    next_order_ = std::max(next_order_, pressure.admitted + 1);
  }
  // Recovery restores what was open even beyond today's limits; new growth is bounded again.
  sequence_bookkeeping_bytes_ = 0;
  for (auto& [id, sequence] : sequences_) {
    LimitTableGrowth(sequence);
    sequence_bookkeeping_bytes_ += sequence.bookkeeping_bytes();
  }
  SettleDaemon();
  return absl::OkStatus();
}

SequenceInfo CacheState::Describe(const Sequence& sequence, bool with_block_tables) {
  SequenceInfo info;
  info.id = sequence.id();
  info.length = sequence.length();
  info.live_frames = sequence.live_frames();
  if (with_block_tables) info.block_tables = sequence.BlockTables();
  return info;
}

absl::StatusOr<SequenceInfo> CacheState::GetSequence(absl::string_view sequence_id,
                                                     bool with_block_tables) const {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  return DescribeWithTerms(it->second, with_block_tables);
}

absl::StatusOr<int64_t> CacheState::SequenceLength(absl::string_view sequence_id) const {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  return it->second.length();
}

std::vector<SequenceInfo> CacheState::ListSequences(bool with_block_tables) const {
  absl::MutexLock lock(&mu_);
  std::vector<SequenceInfo> infos;
  infos.reserve(sequences_.size());
  for (const auto& [id, sequence] : sequences_) {
    infos.push_back(DescribeWithTerms(sequence, with_block_tables));
  }
  std::sort(infos.begin(), infos.end(),
            [](const SequenceInfo& a, const SequenceInfo& b) { return a.id < b.id; });
  return infos;
}

int64_t CacheState::ListedEntries(const Sequence& sequence) const {
  return static_cast<int64_t>(geometry_.layers) * geometry_.kv_groups * (1 + sequence.page_count());
}

absl::StatusOr<SequencePage> CacheState::ListSequencePage(const ListOptions& options) const {
  if (options.max_sequences < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_sequences: must be >= 1, got ", options.max_sequences));
  }
  absl::MutexLock lock(&mu_);
  // The page's candidates only: O(open sequences) pointers, then the first max_sequences of
  // them in id order, and only those are described.
  std::vector<const std::pair<const std::string, Sequence>*> after;
  for (const auto& entry : sequences_) {
    if (entry.first > options.after_id) after.push_back(&entry);
  }
  const auto by_id = [](const auto* a, const auto* b) { return a->first < b->first; };
  const size_t wanted = static_cast<size_t>(
      std::min<int64_t>(options.max_sequences, static_cast<int64_t>(after.size())));
  std::partial_sort(after.begin(), after.begin() + static_cast<ptrdiff_t>(wanted), after.end(),
                    by_id);
  SequencePage page;
  int64_t entries = 0;
  for (size_t i = 0; i < wanted; ++i) {
    const Sequence& sequence = after[i]->second;
    if (options.with_block_tables && options.max_table_entries > 0) {
      const int64_t needed = ListedEntries(sequence);
      if (entries + needed > options.max_table_entries) {
        if (i == 0) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "the block tables of sequence \"", sequence.id(), "\" alone hold ", needed,
              " entries, more than the ", options.max_table_entries, " one page may hold"));
        }
        break;
      }
      entries += needed;
    }
    page.sequences.push_back(DescribeWithTerms(sequence, options.with_block_tables));
  }
  page.more = page.sequences.size() < after.size();
  return page;
}

PoolStats CacheState::Stats() const {
  absl::MutexLock lock(&mu_);
  PoolStats stats;
  stats.capacity_frames = pool_->capacity_frames();
  stats.used_frames = pool_->used_frames();
  stats.free_frames = pool_->free_frames();
  stats.frame_bytes = pool_->frame_bytes();
  stats.capacity_bytes = pool_->capacity_bytes();
  stats.sequences_active = static_cast<int64_t>(sequences_.size());
  stats.sequences_lost = static_cast<int64_t>(lost_.size());
  stats.used_frames_per_layer = pool_->used_frames_per_layer();
  stats.pages_evicted_total = pages_evicted_total_;
  stats.frames_freed_total = frames_freed_total_;
  stats.bytes_moved_total = 0;
  stats.bytes_copied_total = bytes_copied_total_;
  stats.decisions_total = decisions_total_;
  stats.bookkeeping_bytes =
      pool_bookkeeping_bytes_ + sequence_bookkeeping_bytes_ + shares_bookkeeping_bytes_;
  stats.pressure = PressureStatsLocked();
  return stats;
}

absl::Status CacheState::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(pool_->CheckInvariants());
  std::vector<int32_t> references(pool_->capacity_frames(), 0);
  std::vector<int32_t> layer_of(pool_->capacity_frames(), -1);
  for (const auto& [id, sequence] : sequences_) {
    for (int layer = 0; layer < geometry_.layers; ++layer) {
      for (int64_t page = 0; page < sequence.page_count(); ++page) {
        FrameId layer_frame = kNoFrame;
        for (int group = 0; group < geometry_.kv_groups; ++group) {
          const std::vector<FrameId>& table = sequence.block_table(layer, group);
          if (static_cast<int64_t>(table.size()) != sequence.page_count()) {
            return absl::InternalError(absl::StrCat("sequence \"", id, "\": table (", layer, ", ",
                                                    group, ") has ", table.size(), " pages, not ",
                                                    sequence.page_count()));
          }
          const FrameId frame = table[page];
          if (frame == kNoFrame) continue;
          if (!pool_->IsValid(frame) || pool_->refcount(frame) == 0) {
            return absl::InternalError(absl::StrCat("sequence \"", id, "\" (", layer, ", ", group,
                                                    ", ", page, ") names free frame ", frame));
          }
          if (pool_->FrameRank(frame) != pool_->GroupRank(group)) {
            return absl::InternalError(absl::StrCat("sequence \"", id, "\" group ", group,
                                                    " names frame ", frame, " of rank ",
                                                    pool_->FrameRank(frame)));
          }
          if (pool_->frame_layer(frame) != layer ||
              (layer_of[frame] != -1 && layer_of[frame] != layer)) {
            return absl::InternalError(absl::StrCat("frame ", frame, " is named by layers ",
                                                    layer_of[frame], " and ", layer));
          }
          layer_of[frame] = layer;
          if (layout_ == FrameLayout::kLayer) {
            if (layer_frame != kNoFrame && layer_frame != frame) {
              return absl::InternalError(absl::StrCat("sequence \"", id, "\" layer ", layer,
                                                      " page ", page, " names two frames"));
            }
            layer_frame = frame;
          }
          ++references[frame];
        }
      }
    }
  }
  for (int64_t frame = 0; frame < pool_->capacity_frames(); ++frame) {
    const FrameId f = static_cast<FrameId>(frame);
    if (references[frame] != pool_->refcount(f)) {
      return absl::InternalError(absl::StrCat("frame ", frame, " has refcount ", pool_->refcount(f),
                                              " but ", references[frame],
                                              " block-table references"));
    }
  }
  return absl::OkStatus();
}

ArenaInfo CacheState::arena(int rank) const {
  absl::MutexLock lock(&mu_);
  return pool_->arena_info(rank);
}

absl::StatusOr<CacheState::KeyRows> CacheState::ReadKeys(absl::string_view sequence_id,
                                                         int32_t layer, int group,
                                                         DType dtype) const {
  if (DTypeBytes(dtype) != geometry_.element_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("dtype: keys of ", DTypeName(dtype), " are ",
                                                   DTypeBytes(dtype), " bytes, the pool stores ",
                                                   geometry_.element_bytes, "-byte elements"));
  }
  absl::MutexLock lock(&mu_);
  if (pool_->arena_info().backend != Backend::kHost) {
    return absl::FailedPreconditionError(
        "keys: the daemon reads keys only from a host pool's frames; this pool is on a device");
  }
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return Missing("sequence", sequence_id);
  const Sequence& sequence = it->second;
  RETURN_IF_ERROR(CheckLayer(geometry_, layer));
  if (group < 0 || group >= geometry_.kv_groups) {
    return absl::FailedPreconditionError(
        absl::StrCat("keys: group ", group, " outside the ", geometry_.kv_groups, " KV groups"));
  }
  const int64_t tokens = sequence.length();
  const int64_t page_size = geometry_.page_size;
  const int head_dim = geometry_.head_dim;
  KeyRows rows;
  rows.keys.assign(static_cast<size_t>(tokens * head_dim), 0.0F);
  rows.present.assign(static_cast<size_t>(tokens), 0);
  const std::vector<FrameId>& table = sequence.block_table(layer, group);
  for (int64_t page = 0; page < sequence.page_count(); ++page) {
    if (table[page] == kNoFrame) continue;
    const auto* block = static_cast<const char*>(pool_->GroupAddress(table[page], group));
    for (int64_t slot = 0; slot < page_size && page * page_size + slot < tokens; ++slot) {
      const int64_t token = page * page_size + slot;
      WidenToFloat(block + slot * head_dim * geometry_.element_bytes, dtype, head_dim,
                   &rows.keys[static_cast<size_t>(token * head_dim)]);
      rows.present[static_cast<size_t>(token)] = 1;
    }
  }
  return rows;
}

RankSpan CacheState::rank_span(int rank) const {
  absl::MutexLock lock(&mu_);
  return pool_->rank_span(rank);
}

void* CacheState::FrameAddress(FrameId frame, int rank) const {
  absl::MutexLock lock(&mu_);
  return pool_->FrameAddress(frame, rank);
}

}  // namespace entrokv
