// The registered models: one CacheState (pool + sequences) per model id, plus the head
// weights each sequence's prefill decisions cached for decode-time calls.
#ifndef ENTROKV_SERVICE_MODEL_REGISTRY_H_
#define ENTROKV_SERVICE_MODEL_REGISTRY_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/pool/cache_journal.h"
#include "core/pool/cache_state.h"
#include "service/arena_names.h"
#include "service/metrics.h"
#include "store/recovery.h"
#include "store/state_store.h"

namespace entrokv::service {

// One registered model. Thread-safe: the CacheState is, and the rest is immutable but for the
// retired flag. Shared (std::shared_ptr) by the registry and the calls using it; after
// UnregisterModel it lives until the last call using it lets go, and only then are its arena
// and metric series released.
class Model {
 public:
  // `journal` (null without --state_dir) is what `state` reports its changes to.
  Model(std::string id, Backend backend, std::unique_ptr<CacheJournal> journal,
        std::unique_ptr<CacheState> state, PoolMetrics* metrics)
      : id_(std::move(id)),
        backend_(backend),
        journal_(std::move(journal)),
        state_(std::move(state)),
        metrics_(metrics) {}

  [[nodiscard]] const std::string& id() const { return id_; }
  [[nodiscard]] Backend backend() const { return backend_; }
  [[nodiscard]] CacheState& state() const { return *state_; }
  [[nodiscard]] PoolMetrics& metrics() const { return *metrics_; }
  // INVALID_ARGUMENT naming `rank` unless it is one of the pool's tensor-parallel ranks.
  [[nodiscard]] absl::Status CheckRank(int rank) const;

  // The H_Q weights the sequence's pool entry caches for `layer`, if any (forks inherit them;
  // closing the sequence drops them).
  [[nodiscard]] std::optional<std::vector<double>> CachedWeights(absl::string_view sequence_id,
                                                                 int layer) const;
  // Replaces heads [first_head, first_head + weights.size()) of the cached weights of
  // (sequence, layer): all of them, or a tensor-parallel rank's rows
  // (CacheState::SetHeadWeightRows); a no-op once the sequence is closed.
  void CacheWeightRows(absl::string_view sequence_id, int layer, int first_head,
                       std::vector<double> weights);
  // Copies the pool's occupancy into the gauges.
  void RefreshOccupancy() const { metrics_->UpdateOccupancy(state_->Stats()); }
  // True once UnregisterModel took the model out of the registry (or is about to): a sequence
  // opened by a call that raced it must be closed again.
  [[nodiscard]] bool retired() const { return retired_.load(); }

 private:
  friend class ModelRegistry;
  const std::string id_;
  const Backend backend_;
  const std::unique_ptr<CacheJournal> journal_;  // declared first: outlives state_
  const std::unique_ptr<CacheState> state_;
  PoolMetrics* const metrics_;
  std::atomic<bool> retired_{false};
  int64_t reserved_bytes_ = 0;  // of the registry's capacity, given back on release
  std::vector<std::pair<uint64_t, uint64_t>> arena_files_;  // host arenas (dev, inode), per rank
};

// Model id -> Model, and the arena bytes handed out so far. Thread-safe.
class ModelRegistry {
 public:
  // `capacity_bytes` bounds the sum of every model's arena and `max_models` their number
  // (models still being released count); `max_bookkeeping_bytes` (<= 0: unbounded) the
  // bookkeeping of every model together; `limits` bound what recovered models grow to (a
  // Register brings its own); `metrics` must outlive this.
  ModelRegistry(int64_t capacity_bytes, int max_models, int64_t max_bookkeeping_bytes,
                CacheLimits limits, ServiceMetrics* metrics)
      : capacity_bytes_(capacity_bytes),
        max_models_(max_models),
        bookkeeping_(max_bookkeeping_bytes),
        limits_(WithBudget(limits, &bookkeeping_)),
        metrics_(metrics) {}
  // Releases every model nobody else holds; the rest release themselves later (they must not
  // outlive the ServiceMetrics).
  ~ModelRegistry();
  ModelRegistry(const ModelRegistry&) = delete;
  ModelRegistry& operator=(const ModelRegistry&) = delete;

  // Where host arenas get their names, and (with --state_dir) the journal every model's
  // changes go to. Both must outlive the registry; call before the first Register.
  void UseArenaNames(ArenaNamer* namer) { namer_ = namer; }
  void UseStore(store::StateStore* store) { store_ = store; }
  // Every pool's pressure settings (call before the first Register); a host pool's swapped-out
  // sequences get arenas named like its own.
  void UsePressure(PressureOptions pressure) { pressure_ = std::move(pressure); }
  // Re-registers the models a journal recorded, before serving: host arenas are attached again
  // by name and their sequences restored exactly; a model whose frames are gone (cuda arena,
  // host arena missing or resized) gets a fresh arena and its sequences are marked lost
  // (journaled, and logged). INVALID_ARGUMENT naming --state_dir and --pool_capacity_bytes
  // when the models no longer fit; DATA_LOSS naming --state_dir when the records contradict
  // each other; the arena's error when a fresh one cannot be made. Then removes this
  // instance's arenas no model names.
  [[nodiscard]] absl::Status Recover(std::vector<store::RecoveredModel> models);

  // Creates the model's pool. ALREADY_EXISTS for a registered id or one still being released;
  // RESOURCE_EXHAUSTED naming max_models when that many exist, capacity_bytes when the
  // daemon's remaining capacity is smaller, or max_bookkeeping_bytes when the pool's
  // bookkeeping does not fit beside the other models' (before any arena is made); the
  // CacheState's errors.
  // REQUIRES: the caller validated the id and geometry.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Model>> Register(const std::string& model_id,
                                                                const CacheOptions& options);
  // NOT_FOUND naming model_id.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Model>> Find(absl::string_view model_id) const;
  // Every model, ordered by id.
  [[nodiscard]] std::vector<std::shared_ptr<Model>> All() const;
  // Takes the model out of the registry; its arena bytes, descriptors and metric series are
  // released when the last call using it finishes. NOT_FOUND naming model_id; without `force`,
  // FAILED_PRECONDITION naming force while sequences are open (nothing changes then); with it,
  // closes them first. Returns the sequences closed.
  [[nodiscard]] absl::StatusOr<int64_t> Unregister(absl::string_view model_id, bool force);
  // Models registered, being created or still being released.
  [[nodiscard]] int size() const;
  // True when (dev, ino) is the shared-memory file of a host arena this registry holds.
  [[nodiscard]] bool IsArena(dev_t dev, ino_t ino) const;
  // Arena bytes handed out (or being made) so far, of --pool_capacity_bytes.
  [[nodiscard]] int64_t reserved_bytes() const;
  // The bookkeeping every model holds together, as bounded by max_bookkeeping_bytes.
  [[nodiscard]] const BookkeepingBudget& bookkeeping() const { return bookkeeping_; }

 private:
  static CacheLimits WithBudget(CacheLimits limits, BookkeepingBudget* budget) {
    limits.daemon = budget;
    return limits;
  }
  // The model's journal wired to `state`; null without a store.
  [[nodiscard]] std::unique_ptr<CacheJournal> AttachJournal(const std::string& model_id,
                                                            CacheState& state) const;
  // The pressure settings of `model_id`'s pool.
  [[nodiscard]] PressureOptions PressureFor(const std::string& model_id) const;
  [[nodiscard]] absl::Status RecoverOne(store::RecoveredModel recovered,
                                        absl::flat_hash_set<std::string>& arenas_in_use);
  // The shared_ptr deleter of every Model: drops its series and capacity, then the model.
  void Release(Model* model);
  // Makes the Model (released through Release) and registers it.
  std::shared_ptr<Model> Adopt(const std::string& model_id, Backend backend,
                               std::unique_ptr<CacheJournal> journal,
                               std::unique_ptr<CacheState> state, PoolMetrics* metrics,
                               int64_t reserved_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t capacity_bytes_;
  const int max_models_;
  BookkeepingBudget bookkeeping_;  // outlives every model: they are released before it
  const CacheLimits limits_;
  ServiceMetrics* const metrics_;
  ArenaNamer* namer_ = nullptr;
  store::StateStore* store_ = nullptr;
  PressureOptions pressure_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Model>> models_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Ids being created right now (the arena is made outside the lock).
  absl::flat_hash_map<std::string, int64_t> pending_ ABSL_GUARDED_BY(mu_);
  // Ids unregistered whose Model some call still holds.
  absl::flat_hash_map<std::string, int64_t> releasing_ ABSL_GUARDED_BY(mu_);
  // (dev, inode) of every live host arena, so no request can name one as its statistic.
  absl::flat_hash_set<std::pair<uint64_t, uint64_t>> arena_files_ ABSL_GUARDED_BY(mu_);
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_MODEL_REGISTRY_H_
