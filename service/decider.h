// Runs eviction decisions for the service: checks a request against the model and sequence,
// scores every layer with the core's fused CPU scorer, then applies the kept pages to the pool.
#ifndef ENTROKV_SERVICE_DECIDER_H_
#define ENTROKV_SERVICE_DECIDER_H_

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "entrokv/v1/cache_manager.pb.h"
#include "service/metrics.h"
#include "service/model_registry.h"
#include "service/shm_reader.h"
#include "wire/resolve.h"

namespace entrokv::service {

// Stateless apart from the pointers it is given, which must outlive it. Thread-safe: one
// instance serves every worker thread. Blocking (it scores): call it on the worker pool only.
class Decider {
 public:
  Decider(const wire::Defaults& defaults, ServiceMetrics* metrics, ShmReader* shm)
      : defaults_(defaults), metrics_(metrics), shm_(shm) {}

  // Every layer is checked and scored, then all are applied at once (CacheState::ApplyDecisions,
  // all or nothing), so a bad layer or a racing AppendTokens/CloseSequence never leaves a
  // decision half applied. `cancelled` is polled before each layer is scored, between the
  // KV groups of a layer (LayerRequest::cancelled) and before applying: CANCELLED then, with
  // nothing applied.
  // Errors: INVALID_ARGUMENT bad field, NOT_FOUND unknown sequence, FAILED_PRECONDITION
  // statistic tokens != sequence length or no cached weights.
  [[nodiscard]] absl::Status Decide(Model& model, const v1::DecideRequest& request,
                                    const std::function<bool()>& cancelled,
                                    v1::DecideResponse* response) const;

  // One DecideStream message, with the same rules.
  [[nodiscard]] absl::Status DecideLayer(Model& model, const v1::DecideLayerRequest& request,
                                         const std::function<bool()>& cancelled,
                                         v1::LayerDecision* response) const;

  // Test hook: runs on the worker after a decision is scored, before `cancelled` is polled
  // and the decision applied, so a test can hold a decision there (to let a deadline pass, or
  // to keep the worker busy) without sleeping. It gets the call's `cancelled`: the server
  // learns of a client's deadline asynchronously. Empty: none.
  using BeforeApplyHook = std::function<void(const std::function<bool()>& cancelled)>;
  void SetBeforeApplyHookForTest(BeforeApplyHook hook);

 private:
  struct Job;
  [[nodiscard]] absl::Status Run(Model& model, Job& job, const std::function<bool()>& cancelled,
                                 std::vector<v1::LayerDecision*>& outputs) const;
  // Step 3 for an explicit budget: the scorer's kept pages, every layer at once.
  [[nodiscard]] absl::StatusOr<std::vector<ApplyResult>> ApplyFixed(Model& model,
                                                                    const Job& job) const;
  // Step 3 for budget.auto_budget: the layers' page scores to the pool, which evicts down to
  // the sequence's quota; the job's kept pages and pressure follow what it did.
  [[nodiscard]] absl::StatusOr<std::vector<ApplyResult>> ApplyAuto(Model& model, Job& job) const;

  const wire::Defaults defaults_;
  ServiceMetrics* const metrics_;
  ShmReader* const shm_;
  mutable absl::Mutex hook_mu_;
  BeforeApplyHook before_apply_hook_ ABSL_GUARDED_BY(hook_mu_);
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_DECIDER_H_
