#include "service/model_registry.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace entrokv::service {

std::optional<std::vector<double>> Model::CachedWeights(absl::string_view sequence_id,
                                                        int layer) const {
  absl::StatusOr<std::vector<double>> weights = state_->GetHeadWeights(sequence_id, layer);
  if (!weights.ok() || weights->empty()) return std::nullopt;
  return *std::move(weights);
}

void Model::CacheWeights(absl::string_view sequence_id, int layer, std::vector<double> weights) {
  // A sequence closed while its decision was being made has nothing left to cache for.
  state_->SetHeadWeights(sequence_id, layer, std::move(weights)).IgnoreError();
}

absl::StatusOr<std::shared_ptr<Model>> ModelRegistry::Register(const std::string& model_id,
                                                               const CacheOptions& options) {
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
  // Making the arena may take a while (page-zeroing); no lock held meanwhile.
  absl::StatusOr<std::unique_ptr<CacheState>> state = CacheState::Create(options);
  absl::MutexLock lock(&mu_);
  pending_.erase(model_id);
  if (!state.ok()) {
    reserved_bytes_ -= options.capacity_bytes;
    return state.status();
  }
  PoolMetrics* metrics =
      metrics_->AddPool(model_id, options.geometry.query_heads, options.geometry.kv_groups);
  std::shared_ptr<Model> model(new Model(model_id, options.backend, *std::move(state), metrics),
                               [this](Model* m) { Release(m); });
  model->reserved_bytes_ = options.capacity_bytes;
  if (const ArenaInfo arena = model->state().arena(); arena.fd >= 0) {
    struct stat info;
    if (::fstat(arena.fd, &info) == 0) {
      model->arena_file_.emplace(info.st_dev, info.st_ino);
      arena_files_.insert(*model->arena_file_);
    }
  }
  model->RefreshOccupancy();
  models_[model_id] = model;
  return model;
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
    if (model->arena_file_.has_value()) arena_files_.erase(*model->arena_file_);
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
    const int64_t open = model->state().Stats().sequences_active;
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
  return closed;  // `model` lets go here; Release runs when the last call does too
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
