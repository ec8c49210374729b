#include "service/metrics.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/scoring/policy.h"

namespace entrokv::service {
namespace {

constexpr std::array<absl::string_view, kMethodCount> kMethodNames = {
    "RegisterModel",   "GetModel",         "OpenSequence",    "AppendTokens",  "Decide",
    "DecideStream",    "CloseSequence",    "GetPoolStats",    "ListSequences", "ListModels",
    "UnregisterModel", "TruncateSequence", "SwapOutSequence", "ResumeSequence"};
constexpr std::array<absl::string_view, kPhaseCount> kPhaseNames = {"decode", "score", "select",
                                                                    "apply"};

// Eight equal steps from `low` to `high` (just {low} when they meet).
prometheus::Histogram::BucketBoundaries Linear(double low, double high) {
  prometheus::Histogram::BucketBoundaries bounds;
  for (int i = 0; i <= 8; ++i) {
    const double bound = low + (high - low) * i / 8.0;
    if (bounds.empty() || bound > bounds.back()) bounds.push_back(bound);
  }
  return bounds;
}

// 10 us .. ~10 s in factors of ~3.
prometheus::Histogram::BucketBoundaries Latency() {
  return {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10};
}

}  // namespace

absl::string_view MethodName(Method method) { return kMethodNames[static_cast<int>(method)]; }

void PoolMetrics::UpdateOccupancy(const PoolStats& stats) {
  frames_used_->Set(static_cast<double>(stats.used_frames));
  frames_free_->Set(static_cast<double>(stats.free_frames));
  capacity_bytes_->Set(static_cast<double>(stats.capacity_bytes));
  bookkeeping_bytes_->Set(static_cast<double>(stats.bookkeeping_bytes));
  sequences_active_->Set(static_cast<double>(stats.sequences_active));
  const PressureStats& pressure = stats.pressure;
  target_occupancy_->Set(pressure.target_occupancy);
  sequences_swapped_->Set(static_cast<double>(pressure.sequences_swapped));
  for (size_t i = 0; i < pressure.tenants.size() && i < tenant_used_.size(); ++i) {
    tenant_used_[i]->Set(static_cast<double>(pressure.tenants[i].used_frames));
    tenant_guaranteed_[i]->Set(static_cast<double>(pressure.tenants[i].guaranteed_frames));
  }
  absl::MutexLock lock(&mu_);
  const auto advance = [](prometheus::Counter* counter, int64_t& counted, int64_t total) {
    if (total <= counted) return;
    counter->Increment(static_cast<double>(total - counted));
    counted = total;
  };
  advance(reclaimed_admission_, counted_.frames_reclaimed_admission,
          pressure.frames_reclaimed_admission);
  advance(reclaimed_target_, counted_.frames_reclaimed_target, pressure.frames_reclaimed_target);
  advance(admissions_delayed_, counted_.admissions_delayed, pressure.admissions_delayed);
  advance(admissions_refused_, counted_.admissions_refused, pressure.admissions_refused);
  advance(preemptions_, counted_.preemptions, pressure.preemptions);
  advance(swaps_out_, counted_.swaps_out, pressure.swaps_out);
  advance(swaps_in_, counted_.swaps_in, pressure.swaps_in);
}

const PoolMetrics::PolicySeries& PoolMetrics::policy(absl::string_view policy) const {
  return policies_.find(std::string(policy))->second;
}

ServiceMetrics::ServiceMetrics(std::vector<std::string> tenants)
    : registry_(std::make_shared<prometheus::Registry>()), tenants_(std::move(tenants)) {
  pool_frames_ = &prometheus::BuildGauge()
                      .Name("entrokv_pool_frames")
                      .Help("Frames of the pool by state (used or free)")
                      .Register(*registry_);
  pool_capacity_bytes_ = &prometheus::BuildGauge()
                              .Name("entrokv_pool_capacity_bytes")
                              .Help("Bytes of the pool's arena")
                              .Register(*registry_);
  pool_device_bytes_ = &prometheus::BuildGauge()
                            .Name("entrokv_pool_device_bytes")
                            .Help(
                                "Bytes of the arena of each tensor-parallel rank of the pool, "
                                "by the device it is on (host arenas: the device they stand "
                                "in for)")
                            .Register(*registry_);
  pool_bookkeeping_bytes_ =
      &prometheus::BuildGauge()
           .Name("entrokv_pool_bookkeeping_bytes")
           .Help(
               "Daemon memory the pool's bookkeeping holds besides its arena (free list, "
               "reference counts, open sequences' block tables and head weights), as "
               "accounted against --max_model_bookkeeping_bytes")
           .Register(*registry_);
  sequences_active_ = &prometheus::BuildGauge()
                           .Name("entrokv_sequences_active")
                           .Help("Open sequences of the pool")
                           .Register(*registry_);
  decisions_ = &prometheus::BuildCounter()
                    .Name("entrokv_decisions_total")
                    .Help("Layer decisions applied")
                    .Register(*registry_);
  pages_evicted_ = &prometheus::BuildCounter()
                        .Name("entrokv_pages_evicted_total")
                        .Help(
                            "Block-table pages evicted by decisions (score: by the "
                            "statistic; budget: by position, no statistic)")
                        .Register(*registry_);
  pages_retained_ = &prometheus::BuildCounter()
                         .Name("entrokv_pages_retained_total")
                         .Help("Block-table pages kept by decisions")
                         .Register(*registry_);
  union_overhead_ = &prometheus::BuildHistogram()
                         .Name("entrokv_union_overhead_ratio")
                         .Help("Union overhead ratio of the head-independent shadow, per group")
                         .Register(*registry_);
  disagreement_ = &prometheus::BuildHistogram()
                       .Name("entrokv_group_disagreement")
                       .Help("Mean pairwise Jaccard disagreement of per-head choices, per group")
                       .Register(*registry_);
  page_union_ = &prometheus::BuildHistogram()
                     .Name("entrokv_page_union_ratio")
                     .Help("Kept-page union over groups per quota, per layer (LAYER layout)")
                     .Register(*registry_);
  retained_mass_ = &prometheus::BuildHistogram()
                        .Name("entrokv_retained_mass_ratio")
                        .Help("Share of the pooled statistic inside the kept pages, per group")
                        .Register(*registry_);
  group_scope_page_union_ =
      &prometheus::BuildHistogram()
           .Name("entrokv_group_scope_page_union_ratio")
           .Help(
               "Kept-page union over groups per quota that per-group selection keeps or would "
               "have kept, per layer (LAYER layout; the shadow of layer scope)")
           .Register(*registry_);
  layer_scope_frames_saved_ =
      &prometheus::BuildCounter()
           .Name("entrokv_layer_scope_frames_saved_total")
           .Help("Frames layer scope kept fewer than per-group selection would have (LAYER layout)")
           .Register(*registry_);
  decisions_degraded_ =
      &prometheus::BuildCounter()
           .Name("entrokv_decisions_degraded_total")
           .Help(
               "Layer decisions made by position (sink and newest pages, the same budget) because "
               "the request's deadline left too little time to score them")
           .Register(*registry_);
  decision_duration_ = &prometheus::BuildHistogram()
                            .Name("entrokv_decision_duration_seconds")
                            .Help("Time per layer decision by phase")
                            .Register(*registry_);
  stats_bytes_ =
      &prometheus::BuildCounter()
           .Name("entrokv_stats_bytes_total")
           .Help("Statistic bytes received, by source (bytes, shared_memory or device_buffer)")
           .Register(*registry_);
  rpc_requests_ = &prometheus::BuildCounter()
                       .Name("entrokv_rpc_requests_total")
                       .Help("Finished RPCs by method and status code")
                       .Register(*registry_);
  rpc_duration_ = &prometheus::BuildHistogram()
                       .Name("entrokv_rpc_duration_seconds")
                       .Help("RPC handling time by method")
                       .Register(*registry_);

  target_occupancy_ =
      &prometheus::BuildGauge()
           .Name("entrokv_pool_target_occupancy")
           .Help("The pool's target occupancy (--target_occupancy), a share of its frames")
           .Register(*registry_);
  frames_reclaimed_ =
      &prometheus::BuildCounter()
           .Name("entrokv_frames_reclaimed_total")
           .Help(
               "Frames taken from sequences with server-chosen budgets at their owners' calls, "
               "by reason (admission: to admit a call that did not fit; target: to bring the "
               "pool under its target occupancy)")
           .Register(*registry_);
  admissions_ = &prometheus::BuildCounter()
                     .Name("entrokv_admissions_total")
                     .Help(
                         "Admissions that did not fit, by outcome (delayed: frames being "
                         "reclaimed; refused: floors reached)")
                     .Register(*registry_);
  preemptions_ = &prometheus::BuildCounter()
                      .Name("entrokv_preemptions_total")
                      .Help("Sequences the daemon asked their owners to preempt")
                      .Register(*registry_);
  swaps_ = &prometheus::BuildCounter()
                .Name("entrokv_swaps_total")
                .Help("Sequences swapped out to host memory and resumed, by direction")
                .Register(*registry_);
  sequences_swapped_ = &prometheus::BuildGauge()
                            .Name("entrokv_sequences_swapped")
                            .Help("Sequences of the pool swapped out to host memory")
                            .Register(*registry_);
  tenant_used_frames_ = &prometheus::BuildGauge()
                             .Name("entrokv_tenant_used_frames")
                             .Help(
                                 "Frames a tenant's sequences hold in the pool "
                                 "(tenant=\"default\": the default tenant)")
                             .Register(*registry_);
  tenant_guaranteed_frames_ =
      &prometheus::BuildGauge()
           .Name("entrokv_tenant_guaranteed_frames")
           .Help("A tenant's guaranteed share of the pool (--tenant_share), in frames")
           .Register(*registry_);

  for (int m = 0; m < kMethodCount; ++m) {
    const std::string method(kMethodNames[m]);
    for (int c = 0; c < kGrpcStatusCodeCount; ++c) {
      rpc_counts_[m][c] = &rpc_requests_->Add(
          {{"method", method}, {"code", StatusCodeName(static_cast<grpc::StatusCode>(c))}});
    }
    rpc_seconds_[m] = &rpc_duration_->Add({{"method", method}}, Latency());
  }
  for (int p = 0; p < kPhaseCount; ++p) {
    phase_seconds_[p] =
        &decision_duration_->Add({{"phase", std::string(kPhaseNames[p])}}, Latency());
  }
  stats_bytes_by_source_[0] = &stats_bytes_->Add({{"source", "bytes"}});
  stats_bytes_by_source_[1] = &stats_bytes_->Add({{"source", "shared_memory"}});
  stats_bytes_by_source_[2] = &stats_bytes_->Add({{"source", "device_buffer"}});
  stats_bytes_by_source_[3] = &stats_bytes_->Add({{"source", "pool_keys"}});
}

PoolMetrics* ServiceMetrics::AddPool(const std::string& pool, int query_heads, int kv_groups,
                                     const std::vector<int>& devices, int64_t capacity_bytes) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = pools_.try_emplace(pool);
  if (!inserted) return it->second.get();
  auto metrics = std::make_unique<PoolMetrics>();
  metrics->frames_used_ = &pool_frames_->Add({{"pool", pool}, {"state", "used"}});
  metrics->frames_free_ = &pool_frames_->Add({{"pool", pool}, {"state", "free"}});
  metrics->capacity_bytes_ = &pool_capacity_bytes_->Add({{"pool", pool}});
  for (size_t rank = 0; rank < devices.size(); ++rank) {
    prometheus::Gauge* bytes =
        &pool_device_bytes_->Add({{"pool", pool},
                                  {"rank", std::to_string(rank)},
                                  {"device", std::to_string(devices[rank])}});
    bytes->Set(static_cast<double>(capacity_bytes / static_cast<int64_t>(devices.size())));
    metrics->rank_bytes_.push_back(bytes);
  }
  metrics->bookkeeping_bytes_ = &pool_bookkeeping_bytes_->Add({{"pool", pool}});
  metrics->sequences_active_ = &sequences_active_->Add({{"pool", pool}});
  for (absl::string_view name : PolicyNames()) {
    const std::string policy(name);
    PoolMetrics::PolicySeries series;
    series.decisions = &decisions_->Add({{"pool", pool}, {"policy", policy}});
    series.evicted_score =
        &pages_evicted_->Add({{"pool", pool}, {"policy", policy}, {"reason", "score"}});
    series.evicted_budget =
        &pages_evicted_->Add({{"pool", pool}, {"policy", policy}, {"reason", "budget"}});
    series.retained = &pages_retained_->Add({{"pool", pool}, {"policy", policy}});
    metrics->policies_.emplace(policy, series);
  }
  const int group_size = std::max(1, query_heads / std::max(1, kv_groups));
  metrics->union_overhead_ratio =
      &union_overhead_->Add({{"pool", pool}}, Linear(1.0, std::max(2, group_size)));
  metrics->group_disagreement = &disagreement_->Add({{"pool", pool}}, Linear(0.0, 1.0));
  metrics->page_union_ratio =
      &page_union_->Add({{"pool", pool}}, Linear(1.0, std::max(2, kv_groups)));
  metrics->retained_mass_ratio = &retained_mass_->Add({{"pool", pool}}, Linear(0.0, 1.0));
  metrics->group_scope_page_union_ratio =
      &group_scope_page_union_->Add({{"pool", pool}}, Linear(1.0, std::max(2, kv_groups)));
  metrics->layer_scope_frames_saved = &layer_scope_frames_saved_->Add({{"pool", pool}});
  metrics->decisions_degraded = &decisions_degraded_->Add({{"pool", pool}});
  metrics->target_occupancy_ = &target_occupancy_->Add({{"pool", pool}});
  metrics->reclaimed_admission_ =
      &frames_reclaimed_->Add({{"pool", pool}, {"reason", "admission"}});
  metrics->reclaimed_target_ = &frames_reclaimed_->Add({{"pool", pool}, {"reason", "target"}});
  metrics->admissions_delayed_ = &admissions_->Add({{"pool", pool}, {"outcome", "delayed"}});
  metrics->admissions_refused_ = &admissions_->Add({{"pool", pool}, {"outcome", "refused"}});
  metrics->preemptions_ = &preemptions_->Add({{"pool", pool}});
  metrics->swaps_out_ = &swaps_->Add({{"pool", pool}, {"direction", "out"}});
  metrics->swaps_in_ = &swaps_->Add({{"pool", pool}, {"direction", "in"}});
  metrics->sequences_swapped_ = &sequences_swapped_->Add({{"pool", pool}});
  std::vector<std::string> tenants = tenants_;
  tenants.push_back(kDefaultTenantLabel);
  for (const std::string& tenant : tenants) {
    metrics->tenant_used_.push_back(
        &tenant_used_frames_->Add({{"pool", pool}, {"tenant", tenant}}));
    metrics->tenant_guaranteed_.push_back(
        &tenant_guaranteed_frames_->Add({{"pool", pool}, {"tenant", tenant}}));
  }
  it->second = std::move(metrics);
  return it->second.get();
}

void ServiceMetrics::RemovePool(const std::string& pool) {
  absl::MutexLock lock(&mu_);
  const auto it = pools_.find(pool);
  if (it == pools_.end()) return;
  PoolMetrics& metrics = *it->second;
  pool_frames_->Remove(metrics.frames_used_);
  pool_frames_->Remove(metrics.frames_free_);
  pool_capacity_bytes_->Remove(metrics.capacity_bytes_);
  for (prometheus::Gauge* bytes : metrics.rank_bytes_) pool_device_bytes_->Remove(bytes);
  pool_bookkeeping_bytes_->Remove(metrics.bookkeeping_bytes_);
  sequences_active_->Remove(metrics.sequences_active_);
  for (const auto& [name, series] : metrics.policies_) {
    decisions_->Remove(series.decisions);
    pages_evicted_->Remove(series.evicted_score);
    pages_evicted_->Remove(series.evicted_budget);
    pages_retained_->Remove(series.retained);
  }
  union_overhead_->Remove(metrics.union_overhead_ratio);
  disagreement_->Remove(metrics.group_disagreement);
  page_union_->Remove(metrics.page_union_ratio);
  retained_mass_->Remove(metrics.retained_mass_ratio);
  group_scope_page_union_->Remove(metrics.group_scope_page_union_ratio);
  layer_scope_frames_saved_->Remove(metrics.layer_scope_frames_saved);
  decisions_degraded_->Remove(metrics.decisions_degraded);
  target_occupancy_->Remove(metrics.target_occupancy_);
  frames_reclaimed_->Remove(metrics.reclaimed_admission_);
  frames_reclaimed_->Remove(metrics.reclaimed_target_);
  admissions_->Remove(metrics.admissions_delayed_);
  admissions_->Remove(metrics.admissions_refused_);
  preemptions_->Remove(metrics.preemptions_);
  swaps_->Remove(metrics.swaps_out_);
  swaps_->Remove(metrics.swaps_in_);
  sequences_swapped_->Remove(metrics.sequences_swapped_);
  for (prometheus::Gauge* gauge : metrics.tenant_used_) tenant_used_frames_->Remove(gauge);
  for (prometheus::Gauge* gauge : metrics.tenant_guaranteed_) {
    tenant_guaranteed_frames_->Remove(gauge);
  }
  pools_.erase(it);
}

void ServiceMetrics::RecordRpc(Method method, grpc::StatusCode code, double seconds) {
  int index = static_cast<int>(code);
  if (index < 0 || index >= kGrpcStatusCodeCount) {
    index = static_cast<int>(grpc::StatusCode::UNKNOWN);
  }
  rpc_counts_[static_cast<int>(method)][index]->Increment();
  rpc_seconds_[static_cast<int>(method)]->Observe(seconds);
}

void ServiceMetrics::ObservePhase(Phase phase, double seconds) {
  phase_seconds_[static_cast<int>(phase)]->Observe(seconds);
}

void ServiceMetrics::AddStatsBytes(StatSource source, int64_t bytes) {
  stats_bytes_by_source_[static_cast<int>(source)]->Increment(static_cast<double>(bytes));
}

}  // namespace entrokv::service
