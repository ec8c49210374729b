// The CUDA scorer (docs/performance.md, "The GPU path"): the fused policies' passes over the
// statistic run on a GPU (striped entropy sums, the head weights from them through the CPU's own
// arithmetic in portable_math.h, the pooled page maxima with the values' validation and, to
// measure, each head's page maxima and the head-mean row's page sums), and so does the selection
// of group scope; the rest of the page-level half (protections' measurements, layer scope, page
// scores) is GroupFinisher's on the host. So its decisions are the CPU path's bit for bit
// (cuda_scorer_test checks that on a GPU). Plain C++: includable without nvcc or the CUDA
// headers.
#ifndef ENTROKV_CORE_CUDA_SCORER_H_
#define ENTROKV_CORE_CUDA_SCORER_H_

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/scoring/decision.h"
#include "core/scoring/policy.h"

namespace entrokv::cuda {

// Whether the device computes this request's scores: a fused policy (IsFusedPolicy), a
// statistic, alpha 2 or +inf when the policy weighs heads by entropy without cached weights
// (alpha 1 takes the library's log of every value, which differs between glibc and CUDA), a page
// size of at most 4096 tokens and no neighbourhood pooling. Other requests are decided on the
// CPU by the same scorer's callers' rules.
[[nodiscard]] bool ScoresOnDevice(const Policy& policy, const PolicyOptions& options,
                                  const LayerRequest& request);

// Owns a CUDA stream and device buffers that grow to the largest batch seen. Not thread-safe:
// one per thread. Keeps no reference to a request after a call.
class Scorer {
 public:
  // UNAVAILABLE with no driver or device; INVALID_ARGUMENT naming `device` when it does not
  // exist.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Scorer>> Create(int device);
  ~Scorer();
  Scorer(const Scorer&) = delete;
  Scorer& operator=(const Scorer&) = delete;

  [[nodiscard]] int device() const;

  // Same contract, errors and result as entrokv::DecideModel(policy, options, requests, 1), the
  // statistics in host memory (copied to the device). Requests ScoresOnDevice refuses are
  // decided by the fused CPU path. INTERNAL naming the CUDA call when the device fails.
  [[nodiscard]] absl::StatusOr<std::vector<LayerDecision>> DecideModel(
      const Policy& policy, const PolicyOptions& options, std::span<const LayerRequest> requests);

  // The same with every request's statistic view pointing at memory on this scorer's device
  // (a worker's buffer, or one the caller copied there); a request ScoresOnDevice refuses is
  // copied to the host and decided by the fused CPU path.
  [[nodiscard]] absl::StatusOr<std::vector<LayerDecision>> DecideModelOnDevice(
      const Policy& policy, const PolicyOptions& options, std::span<const LayerRequest> requests);

 private:
  struct State;
  explicit Scorer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace entrokv::cuda

#endif  // ENTROKV_CORE_CUDA_SCORER_H_
