// Runs eviction decisions for the service: checks a request against the model and sequence,
// scores every layer with the core's fused CPU scorer, then applies the kept pages to the pool.
#ifndef ENTROKV_SERVICE_DECIDER_H_
#define ENTROKV_SERVICE_DECIDER_H_

#include <chrono>
#include <functional>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "entrokv/v1/cache_manager.pb.h"
#include "service/device_reader.h"
#include "service/device_scorers.h"
#include "service/metrics.h"
#include "service/model_registry.h"
#include "service/shm_reader.h"
#include "wire/resolve.h"

namespace entrokv::service {

// When a decision must be answered (degrade_on_deadline, answer_within_ms), on the steady clock:
// the moment the daemon read the request, and the call's own deadline (none: unbounded).
struct CallTiming {
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

// Stateless apart from the pointers it is given, which must outlive it, and its estimate of
// the scoring time per statistic value (the recent decisions'). Thread-safe: one instance
// serves every worker thread. Blocking (it scores): call it on the worker pool only.
class Decider {
 public:
  Decider(const wire::Defaults& defaults, ServiceMetrics* metrics, ShmReader* shm,
          DeviceReader* device)
      : defaults_(defaults), metrics_(metrics), shm_(shm), device_(device) {}

  // --scorer: the CUDA scorers that decide the layers of pools they score
  // (DeviceScorers::ScoresPool); null or never set: every layer on the CPU. Set before serving;
  // `scorers` outlives the decider.
  void UseDeviceScorers(DeviceScorers* scorers) { device_scorers_ = scorers; }

  // Every layer is checked and scored, then all are applied at once (CacheState::ApplyDecisions,
  // all or nothing), so a bad layer or a racing AppendTokens/CloseSequence never leaves a
  // decision half applied. `cancelled` is polled before each layer is scored, between the
  // KV groups of a layer (LayerRequest::cancelled) and before applying: CANCELLED then, with
  // nothing applied. The request's deadline is the earlier of timing.deadline and
  // answer_within_ms after timing.received: with degrade_on_deadline, a layer that the recent
  // decisions' time per value says cannot be scored before it (less a reserve for the reply),
  // or whose scoring is still running then, and every layer after it, is decided by position
  // (streaming's choice, the same quota) and flagged degraded; without, a passed
  // answer_within_ms is DEADLINE_EXCEEDED with nothing applied.
  // Errors: INVALID_ARGUMENT bad field, NOT_FOUND unknown sequence, FAILED_PRECONDITION
  // statistic tokens != sequence length or no cached weights.
  [[nodiscard]] absl::Status Decide(Model& model, const v1::DecideRequest& request,
                                    const std::function<bool()>& cancelled,
                                    v1::DecideResponse* response,
                                    const CallTiming& timing = {}) const;

  // One DecideStream message, with the same rules.
  [[nodiscard]] absl::Status DecideLayer(Model& model, const v1::DecideLayerRequest& request,
                                         const std::function<bool()>& cancelled,
                                         v1::LayerDecision* response,
                                         const CallTiming& timing = {}) const;

  // Seconds the recent decisions took to score one statistic value (one head, one token): the
  // estimate a deadline is checked against. 0 until a layer was scored.
  [[nodiscard]] double SecondsPerValue() const;
  // Test hook: sets the estimate, as if recent decisions had taken that long.
  void SetSecondsPerValueForTest(double seconds);

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
  // Folds one scored layer's time into SecondsPerValue.
  void RecordScoringTime(int64_t values, double seconds) const;
  // Step 3 for an explicit budget: the scorer's kept pages, every layer at once, with the
  // chunks' running sums (moved out of the job).
  [[nodiscard]] absl::StatusOr<std::vector<ApplyResult>> ApplyFixed(Model& model, Job& job) const;
  // Step 3 for budget.auto_budget: the layers' page scores to the pool, which evicts down to
  // the sequence's quota; the job's kept pages and pressure follow what it did.
  [[nodiscard]] absl::StatusOr<std::vector<ApplyResult>> ApplyAuto(Model& model, Job& job) const;

  const wire::Defaults defaults_;
  ServiceMetrics* const metrics_;
  ShmReader* const shm_;
  DeviceReader* const device_;  // device_buffer statistics; their mappings outlive a decision
  DeviceScorers* device_scorers_ = nullptr;
  mutable absl::Mutex hook_mu_;
  BeforeApplyHook before_apply_hook_ ABSL_GUARDED_BY(hook_mu_);
  mutable absl::Mutex estimate_mu_;
  mutable double seconds_per_value_ ABSL_GUARDED_BY(estimate_mu_) = 0.0;
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_DECIDER_H_
