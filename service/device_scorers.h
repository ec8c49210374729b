// --scorer (docs/service.md, "Scoring on a GPU"): which scorer decides a layer. The fused CPU path
// is the reference; the CUDA scorer (core/cuda/scorer.h) gives the same decisions, bit for bit,
// so the decision, the metrics and the journal do not depend on which one ran.
#ifndef ENTROKV_SERVICE_DEVICE_SCORERS_H_
#define ENTROKV_SERVICE_DEVICE_SCORERS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/pool/geometry.h"
#include "core/scoring/decision.h"
#include "core/scoring/policy.h"
#include "service/option_table.h"

namespace entrokv::service {

// The daemon's CUDA scorers, lent to one job at a time per device (a scorer owns a stream and
// its buffers and is not thread-safe). Thread-safe.
class DeviceScorers {
 public:
  // kCpu: none. kAuto: the CUDA scorer where this build has it and the host has a device, none
  // otherwise. kCuda: FAILED_PRECONDITION naming --scorer where this build or host has no CUDA
  // device (entrokvd exits 2).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceScorers>> Create(ScorerSetting setting);
  ~DeviceScorers();

  // Whether a job on a pool of this backend is scored on a GPU: kCuda every pool, kAuto pools
  // on a GPU, never without a device.
  [[nodiscard]] bool ScoresPool(Backend backend) const;
  // "cpu", or "cuda on NVIDIA H200, 139 GiB, sm_90 (device 0 of 1)" for the start's log line.
  [[nodiscard]] const std::string& description() const { return description_; }

  // One layer on `device` (the pool's arena's device; a host pool's jobs use device 0): the
  // same result as FusedScorer::DecideLayer.
  [[nodiscard]] absl::StatusOr<LayerDecision> DecideLayer(int device, const Policy& policy,
                                                          const PolicyOptions& options,
                                                          const LayerRequest& request) {
    return Decide(device, /*in_place=*/false, policy, options, request);
  }
  // The same with the request's statistic in `device`'s memory (a worker's device_buffer read in
  // place): scored there when the CUDA scorer takes the request (cuda::ScoresOnDevice), else
  // copied to the host once and scored on the CPU. REQUIRES: ScoresPool was true (INTERNAL
  // otherwise: a host scorer cannot read device memory).
  [[nodiscard]] absl::StatusOr<LayerDecision> DecideLayerInPlace(int device, const Policy& policy,
                                                                 const PolicyOptions& options,
                                                                 const LayerRequest& request) {
    return Decide(device, /*in_place=*/true, policy, options, request);
  }

 private:
  [[nodiscard]] absl::StatusOr<LayerDecision> Decide(int device, bool in_place,
                                                     const Policy& policy,
                                                     const PolicyOptions& options,
                                                     const LayerRequest& request);
  struct Lender;
  DeviceScorers(ScorerSetting setting, std::unique_ptr<Lender> lender, std::string description);

  ScorerSetting setting_;
  std::unique_ptr<Lender> lender_;  // null: no device scoring
  std::string description_;
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_DEVICE_SCORERS_H_
