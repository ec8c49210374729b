// The Prometheus metrics (docs/architecture.md §6, docs/service.md "Metrics"), created once and
// then only updated.
#ifndef ENTROKV_SERVICE_METRICS_H_
#define ENTROKV_SERVICE_METRICS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/pool/cache_state.h"
#include "grpcpp/support/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/grpc_status.h"

namespace entrokv::service {

// The RPC methods, for the {method} label.
enum class Method : int {
  kRegisterModel,
  kGetModel,
  kOpenSequence,
  kAppendTokens,
  kDecide,
  kDecideStream,
  kCloseSequence,
  kGetPoolStats,
  kListSequences,
  kListModels,
  kUnregisterModel,
  kTruncateSequence,
  kSwapOutSequence,
  kResumeSequence,
};
inline constexpr int kMethodCount = 14;
[[nodiscard]] absl::string_view MethodName(Method method);

// Phases of a decision, for entrokv_decision_duration_seconds{phase}: decode = resolving and
// checking the statistic and budget; score = the core's DecideLayer (scoring and top-K
// selection in one call); select = turning its result into kept/evicted sets and caching the
// weights; apply = CacheState::ApplyDecision.
enum class Phase : int { kDecode, kScore, kSelect, kApply };
inline constexpr int kPhaseCount = 4;

// Where a statistic came from, for entrokv_stats_bytes_total{source}.
enum class StatSource : int { kBytes, kSharedMemory, kDeviceBuffer, kPoolKeys };

// Every series of one pool (label pool = model id), created together when the model registers.
// Thread-safe (prometheus-cpp metrics are atomic); the references stay valid as long as the
// ServiceMetrics that made them.
class PoolMetrics {
 public:
  // The series of one policy inside the pool.
  struct PolicySeries {
    prometheus::Counter* decisions = nullptr;
    prometheus::Counter* evicted_score = nullptr;
    prometheus::Counter* evicted_budget = nullptr;
    prometheus::Counter* retained = nullptr;
  };

  // Copies the occupancy gauges from the pool's stats, and advances the pressure counters to
  // the pool's totals (never back: stats read by racing calls may arrive out of order).
  void UpdateOccupancy(const PoolStats& stats);
  // The series of `policy` (a registered policy name). REQUIRES: the name is registered.
  [[nodiscard]] const PolicySeries& policy(absl::string_view policy) const;

  prometheus::Histogram* union_overhead_ratio = nullptr;
  prometheus::Histogram* group_disagreement = nullptr;
  prometheus::Histogram* page_union_ratio = nullptr;
  prometheus::Histogram* retained_mass_ratio = nullptr;
  // LAYER layout: what per-group selection keeps (or, in layer scope, would have kept) per
  // quota, per layer, and the frames layer scope kept fewer than that.
  prometheus::Histogram* group_scope_page_union_ratio = nullptr;
  prometheus::Counter* layer_scope_frames_saved = nullptr;
  // Layer decisions made by position because the request's deadline left too little time to
  // score them (degrade_on_deadline).
  prometheus::Counter* decisions_degraded = nullptr;

 private:
  friend class ServiceMetrics;
  prometheus::Gauge* frames_used_ = nullptr;
  prometheus::Gauge* frames_free_ = nullptr;
  prometheus::Gauge* capacity_bytes_ = nullptr;
  std::vector<prometheus::Gauge*> rank_bytes_;  // per tensor-parallel rank, labelled by device
  prometheus::Gauge* bookkeeping_bytes_ = nullptr;
  prometheus::Gauge* sequences_active_ = nullptr;
  absl::flat_hash_map<std::string, PolicySeries> policies_;
  // Pool pressure.
  prometheus::Gauge* target_occupancy_ = nullptr;
  prometheus::Counter* reclaimed_admission_ = nullptr;
  prometheus::Counter* reclaimed_target_ = nullptr;
  prometheus::Counter* admissions_delayed_ = nullptr;
  prometheus::Counter* admissions_refused_ = nullptr;
  prometheus::Counter* preemptions_ = nullptr;
  prometheus::Counter* swaps_out_ = nullptr;
  prometheus::Counter* swaps_in_ = nullptr;
  prometheus::Gauge* sequences_swapped_ = nullptr;
  // Per tenant, in PressureStats::tenants order (the configured tenants, then "").
  std::vector<prometheus::Gauge*> tenant_used_;
  std::vector<prometheus::Gauge*> tenant_guaranteed_;
  absl::Mutex mu_;
  PressureStats counted_ ABSL_GUARDED_BY(mu_);  // the totals the counters have reached
};

// Owns the registry and every family. Families and the series without a pool label exist from
// construction; a pool's series from AddPool. Thread-safe.
class ServiceMetrics {
 public:
  // `tenants`: the daemon's configured tenants (--tenant_share), at most kMaxTenants; every pool
  // gets a tenant series for each and for the default tenant, labelled "default".
  explicit ServiceMetrics(std::vector<std::string> tenants = {});
  ServiceMetrics(const ServiceMetrics&) = delete;
  ServiceMetrics& operator=(const ServiceMetrics&) = delete;

  [[nodiscard]] std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Creates (once per pool name) every series of the pool, zero, with histogram buckets for
  // its group size r = query_heads / kv_groups and its kv_groups. Returns the same object for
  // the same name; it lives as long as this.
  // `devices`: the device of each tensor-parallel rank's arena, the ranks splitting
  // `capacity_bytes` evenly.
  PoolMetrics* AddPool(const std::string& pool, int query_heads, int kv_groups,
                       const std::vector<int>& devices = {0}, int64_t capacity_bytes = 0);
  // Removes every series of the pool (a no-op for an unknown name); the PoolMetrics AddPool
  // returned for it is destroyed. REQUIRES: nothing uses it any more. A new per-pool series
  // must be removed here too (service_hardening_test counts what is left).
  void RemovePool(const std::string& pool);

  void RecordRpc(Method method, grpc::StatusCode code, double seconds);
  void ObservePhase(Phase phase, double seconds);
  void AddStatsBytes(StatSource source, int64_t bytes);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* pool_frames_;
  prometheus::Family<prometheus::Gauge>* pool_capacity_bytes_;
  prometheus::Family<prometheus::Gauge>* pool_device_bytes_;
  prometheus::Family<prometheus::Gauge>* pool_bookkeeping_bytes_;
  prometheus::Family<prometheus::Gauge>* sequences_active_;
  prometheus::Family<prometheus::Counter>* decisions_;
  prometheus::Family<prometheus::Counter>* pages_evicted_;
  prometheus::Family<prometheus::Counter>* pages_retained_;
  prometheus::Family<prometheus::Histogram>* union_overhead_;
  prometheus::Family<prometheus::Histogram>* disagreement_;
  prometheus::Family<prometheus::Histogram>* page_union_;
  prometheus::Family<prometheus::Histogram>* retained_mass_;
  prometheus::Family<prometheus::Histogram>* group_scope_page_union_;
  prometheus::Family<prometheus::Counter>* layer_scope_frames_saved_;
  prometheus::Family<prometheus::Counter>* decisions_degraded_;
  prometheus::Family<prometheus::Histogram>* decision_duration_;
  prometheus::Family<prometheus::Counter>* stats_bytes_;
  prometheus::Family<prometheus::Counter>* rpc_requests_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_;
  prometheus::Family<prometheus::Gauge>* target_occupancy_;
  prometheus::Family<prometheus::Counter>* frames_reclaimed_;
  prometheus::Family<prometheus::Counter>* admissions_;
  prometheus::Family<prometheus::Counter>* preemptions_;
  prometheus::Family<prometheus::Counter>* swaps_;
  prometheus::Family<prometheus::Gauge>* sequences_swapped_;
  prometheus::Family<prometheus::Gauge>* tenant_used_frames_;
  prometheus::Family<prometheus::Gauge>* tenant_guaranteed_frames_;
  const std::vector<std::string> tenants_;

  // [method][code], all created at start-up so every series exists (zero) from the start.
  std::array<std::array<prometheus::Counter*, kGrpcStatusCodeCount>, kMethodCount> rpc_counts_{};
  std::array<prometheus::Histogram*, kMethodCount> rpc_seconds_{};
  std::array<prometheus::Histogram*, kPhaseCount> phase_seconds_{};
  std::array<prometheus::Counter*, 4> stats_bytes_by_source_{};

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<PoolMetrics>> pools_ ABSL_GUARDED_BY(mu_);
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_METRICS_H_
