#include "service/model_registry.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/log.h"
#include "core/util/status_macros.h"
#include "store/model_journal.h"

namespace entrokv::service {

std::optional<std::vector<double>> Model::CachedWeights(absl::string_view sequence_id,
                                                        int layer) const {
  absl::StatusOr<std::vector<double>> weights = state_->GetHeadWeights(sequence_id, layer);
  if (!weights.ok() || weights->empty()) return std::nullopt;
  return *std::move(weights);
}

absl::Status Model::CheckRank(int rank) const {
  const int ranks = state_->ranks();
  if (rank >= 0 && rank < ranks) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("rank: ", rank, " is outside [0, ", ranks,
                                                 "): model \"", id_, "\" has ", ranks,
                                                 ranks == 1 ? " rank" : " ranks"));
}

void Model::CacheWeightRows(absl::string_view sequence_id, int layer, int first_head,
                            std::vector<double> weights) {
  // A sequence closed while its decision was being made has nothing left to cache for.
  state_->SetHeadWeightRows(sequence_id, layer, first_head, std::move(weights)).IgnoreError();
}

namespace {

// The shared-memory names of a host pool's arenas, rank by rank.
std::vector<std::string> HostArenaNames(const CacheState& state) {
  std::vector<std::string> names;
  for (int rank = 0; rank < state.ranks(); ++rank) names.push_back(state.arena(rank).name);
  return names;
}

// Unlinks the names of a host pool's arenas (a --state_dir daemon's arenas keep their names
// when they go).
void UnlinkHostArenas(const CacheState& state) {
  for (const std::string& name : HostArenaNames(state)) ::shm_unlink(name.c_str());
}

// Fresh arena names for each of `ranks` ranks of `model_id`.
std::vector<HostArenaSource> FreshHostArenas(ArenaNamer* namer, const std::string& model_id,
                                             int ranks) {
  std::vector<HostArenaSource> sources;
  if (namer == nullptr) return sources;
  for (int rank = 0; rank < ranks; ++rank) {
    sources.push_back({.name = namer->Next(model_id), .keep_name = namer->durable()});
  }
  return sources;
}

store::ModelRecord RecordOf(const std::string& model_id, const CacheOptions& options,
                            const CacheState& state) {
  store::ModelRecord record;
  record.model_id = model_id;
  record.geometry = options.geometry;
  record.layout = options.layout;
  record.backend = options.backend;
  record.capacity_bytes = options.capacity_bytes;
  record.devices = options.devices;
  if (options.backend == Backend::kHost) record.arena_names = HostArenaNames(state);
  return record;
}

}  // namespace

std::unique_ptr<CacheJournal> ModelRegistry::AttachJournal(const std::string& model_id,
                                                           CacheState& state) const {
  if (store_ == nullptr) return nullptr;
  auto journal = std::make_unique<store::ModelJournal>(store_, model_id, state.geometry());
  state.SetJournal(journal.get());
  return journal;
}

PressureOptions ModelRegistry::PressureFor(const std::string& model_id) const {
  PressureOptions pressure = pressure_;
  if (namer_ != nullptr) {
    ArenaNamer* namer = namer_;
    pressure.swap_arena = [namer, model_id] {
      return HostArenaSource{
          .name = namer->Next(model_id), .attach = false, .keep_name = namer->durable()};
    };
  }
  return pressure;
}

absl::StatusOr<std::shared_ptr<Model>> ModelRegistry::Register(const std::string& model_id,
                                                               const CacheOptions& requested) {
  CacheOptions options = requested;
  options.limits.daemon = &bookkeeping_;
  options.pressure = PressureFor(model_id);
  {
    absl::MutexLock lock(&mu_);
    if (models_.contains(model_id) || pending_.contains(model_id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("model_id: '", model_id, "' is already registered"));
    }
    if (releasing_.contains(model_id)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "model_id: '", model_id, "' is unregistered but still used by calls; retry shortly"));
    }
    const int64_t count =
        static_cast<int64_t>(models_.size() + pending_.size() + releasing_.size());
    if (count >= max_models_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("max_models: ", max_models_, " models exist; unregister one first"));
    }
    if (options.capacity_bytes > capacity_bytes_ - reserved_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("capacity_bytes: ", options.capacity_bytes, " asked, ",
                       capacity_bytes_ - reserved_bytes_, " of --pool_capacity_bytes left"));
    }
    reserved_bytes_ += options.capacity_bytes;
    pending_[model_id] = options.capacity_bytes;
  }
  if (options.backend == Backend::kHost) {
    options.host_arenas =
        FreshHostArenas(namer_, model_id, static_cast<int>(options.devices.size()));
  }
  // Making the arena may take a while (page-zeroing); no lock held meanwhile.
  absl::StatusOr<std::unique_ptr<CacheState>> state = CacheState::Create(options);
  if (state.ok() && store_ != nullptr) {
    // Durable before the client hears of it; a model the journal missed would come back
    // without its sequences' model.
    const absl::Status recorded = store::RecordModel(*store_, RecordOf(model_id, options, **state));
    if (!recorded.ok()) {
      if (namer_ != nullptr && namer_->durable() && options.backend == Backend::kHost) {
        UnlinkHostArenas(**state);
      }
      state = recorded;
    }
  }
  absl::MutexLock lock(&mu_);
  pending_.erase(model_id);
  if (!state.ok()) {
    reserved_bytes_ -= options.capacity_bytes;
    return state.status();
  }
  std::unique_ptr<CacheJournal> journal = AttachJournal(model_id, **state);
  PoolMetrics* metrics =
      metrics_->AddPool(model_id, options.geometry.query_heads, options.geometry.kv_groups,
                        options.devices, options.capacity_bytes);
  return Adopt(model_id, options.backend, std::move(journal), *std::move(state), metrics,
               options.capacity_bytes);
}

std::shared_ptr<Model> ModelRegistry::Adopt(const std::string& model_id, Backend backend,
                                            std::unique_ptr<CacheJournal> journal,
                                            std::unique_ptr<CacheState> state, PoolMetrics* metrics,
                                            int64_t reserved_bytes) {
  std::shared_ptr<Model> model(
      new Model(model_id, backend, std::move(journal), std::move(state), metrics),
      [this](Model* m) { Release(m); });
  model->reserved_bytes_ = reserved_bytes;
  for (int rank = 0; rank < model->state().ranks(); ++rank) {
    if (const ArenaInfo arena = model->state().arena(rank); arena.fd >= 0) {
      struct stat info;
      if (::fstat(arena.fd, &info) == 0) {
        model->arena_files_.emplace_back(info.st_dev, info.st_ino);
        arena_files_.insert(model->arena_files_.back());
      }
    }
  }
  model->RefreshOccupancy();
  models_[model_id] = model;
  return model;
}

absl::Status ModelRegistry::Recover(std::vector<store::RecoveredModel> models) {
  // A saturating sum: a damaged journal may record any capacity up to INT64_MAX.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t needed = 0;
  for (const store::RecoveredModel& recovered : models) {
    const int64_t capacity = recovered.model.capacity_bytes;
    needed = capacity > kMax - needed ? kMax : needed + capacity;
  }
  if (needed > capacity_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state_dir: the ", models.size(), " recorded models need ", needed,
                     " bytes of arena, more than --pool_capacity_bytes=", capacity_bytes_));
  }
  absl::flat_hash_set<std::string> arenas_in_use;
  for (store::RecoveredModel& recovered : models) {
    RETURN_IF_ERROR(RecoverOne(std::move(recovered), arenas_in_use));
  }
  if (namer_ != nullptr && namer_->durable()) {
    if (const int removed = namer_->RemoveUnused(arenas_in_use); removed > 0) {
      LogInfo(absl::StrCat("--state_dir: removed ", removed,
                           " arenas of this state that no model names"));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelRegistry::RecoverOne(store::RecoveredModel recovered,
                                       absl::flat_hash_set<std::string>& arenas_in_use) {
  store::ModelRecord& record = recovered.model;
  const std::string& id = record.model_id;
  const auto fail = [&id](const absl::Status& status) {
    // A state that cannot be served as configured is the operator's to fix, as a bad flag is
    // (entrokvd exits 2): too little room for its pools or their bookkeeping, or an arena
    // another process holds.
    absl::StatusCode code = status.code();
    if (code == absl::StatusCode::kResourceExhausted) code = absl::StatusCode::kInvalidArgument;
    if (code == absl::StatusCode::kUnavailable) code = absl::StatusCode::kFailedPrecondition;
    return absl::Status(code, absl::StrCat("--state_dir: model '", id, "': ", status.message()));
  };
  CacheOptions options;
  options.geometry = record.geometry;
  options.layout = record.layout;
  options.backend = record.backend;
  options.capacity_bytes = record.capacity_bytes;
  options.devices = record.devices;
  options.name = id;
  options.limits = limits_;
  options.pressure = PressureFor(id);
  std::string lost_reason;
  absl::StatusOr<std::unique_ptr<CacheState>> state;
  if (record.backend == Backend::kHost) {
    for (const std::string& name : record.arena_names) {
      options.host_arenas.push_back({.name = name, .attach = true, .keep_name = true});
    }
    if (record.arena_names.size() != record.devices.size()) {
      state = absl::FailedPreconditionError(absl::StrCat("the journal names ",
                                                         record.arena_names.size(), " arenas for ",
                                                         record.devices.size(), " ranks"));
    } else {
      state = CacheState::Create(options);
    }
    if (!state.ok() && absl::IsNotFound(state.status())) {
      lost_reason = absl::StrCat("its host arena did not survive (", state.status().message(),
                                 "; /dev/shm does not outlive a reboot)");
    } else if (!state.ok() && absl::IsFailedPrecondition(state.status())) {
      // Resized, damaged or handed to another user while the daemon was down: not trusted.
      lost_reason = absl::StrCat("its host arena is not this pool's any more (",
                                 state.status().message(), ")");
    } else if (!state.ok()) {
      return fail(state.status());
    }
  } else {
    lost_reason =
        "its cuda arena died with the previous process (device memory never outlives the "
        "process that allocated it)";
  }
  if (!lost_reason.empty()) {
    if (record.backend == Backend::kHost) {
      options.host_arenas = FreshHostArenas(namer_, id, static_cast<int>(options.devices.size()));
    }
    state = CacheState::Create(options);
    if (!state.ok()) return fail(state.status());
    std::vector<std::string> lost_ids;
    for (const SequenceSnapshot& sequence : recovered.sequences) lost_ids.push_back(sequence.id);
    for (const auto& [sequence_id, reason] : recovered.lost) lost_ids.push_back(sequence_id);
    for (const SwappedSnapshot& sequence : recovered.swapped) lost_ids.push_back(sequence.id);
    record.arena_names.clear();
    if (record.backend == Backend::kHost) record.arena_names = HostArenaNames(**state);
    if (store_ != nullptr) {
      RETURN_IF_ERROR(fail(store::RecordLoss(*store_, record, lost_ids, lost_reason)));
    }
    for (const std::string& sequence_id : lost_ids) (*state)->MarkLost({sequence_id}, lost_reason);
    LogWarning(absl::StrCat("--state_dir: model '", id, "' recovered with a fresh arena; ",
                            lost_ids.size(), " sequences lost: ", lost_reason));
  } else {
    const size_t count = recovered.sequences.size() + recovered.swapped.size();
    RETURN_IF_ERROR(
        fail((*state)->Restore(std::move(recovered.sequences), std::move(recovered.swapped))));
    for (const auto& [sequence_id, reason] : recovered.lost) {
      (*state)->MarkLost({sequence_id}, reason);
    }
    LogInfo(absl::StrCat("--state_dir: model '", id, "' recovered: ", count, " sequences, ",
                         (*state)->Stats().used_frames, " of ", (*state)->Stats().capacity_frames,
                         " frames in use, arenas ", absl::StrJoin(record.arena_names, ", ")));
  }
  if (record.backend == Backend::kHost) {
    for (const std::string& name : HostArenaNames(**state)) arenas_in_use.insert(name);
  }
  for (const std::string& name : (*state)->SwapArenaNames()) arenas_in_use.insert(name);
  std::unique_ptr<CacheJournal> journal = AttachJournal(id, **state);
  absl::MutexLock lock(&mu_);
  PoolMetrics* metrics =
      metrics_->AddPool(id, options.geometry.query_heads, options.geometry.kv_groups,
                        options.devices, options.capacity_bytes);
  Adopt(id, options.backend, std::move(journal), *std::move(state), metrics,
        options.capacity_bytes);
  reserved_bytes_ += options.capacity_bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Model>> ModelRegistry::Find(absl::string_view model_id) const {
  absl::MutexLock lock(&mu_);
  const auto it = models_.find(model_id);
  if (it == models_.end()) {
    return absl::NotFoundError(absl::StrCat("model_id: '", model_id, "' is not registered"));
  }
  return it->second;
}

std::vector<std::shared_ptr<Model>> ModelRegistry::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Model>> all;
  for (const auto& [id, model] : models_) all.push_back(model);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return all;
}

ModelRegistry::~ModelRegistry() {
  absl::flat_hash_map<std::string, std::shared_ptr<Model>> models;
  {
    absl::MutexLock lock(&mu_);
    models.swap(models_);
  }
  models.clear();  // Release runs here for the models nobody else holds
}

void ModelRegistry::Release(Model* model) {
  {
    absl::MutexLock lock(&mu_);
    metrics_->RemovePool(model->id());
    reserved_bytes_ -= model->reserved_bytes_;
    for (const auto& file : model->arena_files_) arena_files_.erase(file);
    releasing_.erase(model->id());
  }
  delete model;  // unmaps and unlinks the arena, closes its descriptor
}

absl::StatusOr<int64_t> ModelRegistry::Unregister(absl::string_view model_id, bool force) {
  std::shared_ptr<Model> model;
  {
    absl::MutexLock lock(&mu_);
    const auto it = models_.find(model_id);
    if (it == models_.end()) {
      return absl::NotFoundError(absl::StrCat("model_id: '", model_id, "' is not registered"));
    }
    model = it->second;
    // Retired first, counted second: an OpenSequence that counts too late sees the flag.
    model->retired_.store(true);
    const PoolStats stats = model->state().Stats();
    const int64_t open = stats.sequences_active + stats.pressure.sequences_swapped;
    if (open > 0 && !force) {
      model->retired_.store(false);
      return absl::FailedPreconditionError(absl::StrCat(
          "force: model '", model_id, "' has ", open, " open sequences; close them or set force"));
    }
    releasing_[model->id()] = model->reserved_bytes_;
    models_.erase(it);
  }
  int64_t closed = 0;
  for (const SequenceInfo& info : model->state().ListSequences(/*with_block_tables=*/false)) {
    if (model->state().CloseSequence(info.id).ok()) ++closed;
  }
  for (const std::string& id : model->state().SwappedIds()) {
    if (model->state().CloseSequence(id).ok()) ++closed;
  }
  if (store_ != nullptr) {
    // Gone for good: its records leave the journal (a restart must not bring it back), and its
    // host arena's name goes now (a --state_dir daemon keeps names only for restarts).
    if (const absl::Status deleted = store::DeleteModel(*store_, model->id()); !deleted.ok()) {
      LogError(absl::StrCat("--state_dir: could not remove model '", model->id(),
                            "' from the journal: ", deleted.message()));
    }
    if (model->backend() == Backend::kHost) UnlinkHostArenas(model->state());
  }
  return closed;  // `model` lets go here; Release runs when the last call does too
}

int64_t ModelRegistry::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return reserved_bytes_;
}

bool ModelRegistry::IsArena(dev_t dev, ino_t ino) const {
  absl::MutexLock lock(&mu_);
  return arena_files_.contains(std::pair<uint64_t, uint64_t>(dev, ino));
}

int ModelRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(models_.size() + pending_.size() + releasing_.size());
}

}  // namespace entrokv::service
