#include "service/device_scorers.h"

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/scoring/fused_scorer.h"
#include "core/util/status_macros.h"

#if defined(ENTROKV_HAVE_CUDA)
#include "core/cuda/device.h"
#include "core/cuda/scorer.h"
#endif

namespace entrokv::service {

#if defined(ENTROKV_HAVE_CUDA)
// Idle scorers per device: a job takes one (or makes one) and gives it back.
struct DeviceScorers::Lender {
  absl::Mutex mu;
  absl::flat_hash_map<int, std::vector<std::unique_ptr<cuda::Scorer>>> idle ABSL_GUARDED_BY(mu);

  absl::StatusOr<std::unique_ptr<cuda::Scorer>> Take(int device) {
    {
      absl::MutexLock lock(&mu);
      std::vector<std::unique_ptr<cuda::Scorer>>& free = idle[device];
      if (!free.empty()) {
        std::unique_ptr<cuda::Scorer> scorer = std::move(free.back());
        free.pop_back();
        return scorer;
      }
    }
    return cuda::Scorer::Create(device);
  }
  void Give(std::unique_ptr<cuda::Scorer> scorer) {
    absl::MutexLock lock(&mu);
    idle[scorer->device()].push_back(std::move(scorer));
  }
};
#else
struct DeviceScorers::Lender {};
#endif

DeviceScorers::DeviceScorers(ScorerSetting setting, std::unique_ptr<Lender> lender,
                             std::string description)
    : setting_(setting), lender_(std::move(lender)), description_(std::move(description)) {}

DeviceScorers::~DeviceScorers() = default;

absl::StatusOr<std::unique_ptr<DeviceScorers>> DeviceScorers::Create(ScorerSetting setting) {
  auto none = [setting](absl::string_view why) {
    return std::unique_ptr<DeviceScorers>(
        new DeviceScorers(setting, nullptr, absl::StrCat("cpu", why)));
  };
  if (setting == ScorerSetting::kCpu) return none("");
#if defined(ENTROKV_HAVE_CUDA)
  const absl::StatusOr<int> count = cuda::DeviceCount();
  if (!count.ok()) {
    if (setting == ScorerSetting::kCuda) {
      return absl::FailedPreconditionError(
          absl::StrCat("--scorer=cuda: no CUDA device: ", count.status().message()));
    }
    return none(" (--scorer=auto: no CUDA device)");
  }
  const absl::StatusOr<std::string> name = cuda::DescribeDevice(0);
  return std::unique_ptr<DeviceScorers>(
      new DeviceScorers(setting, std::make_unique<Lender>(),
                        absl::StrCat("cuda on ", name.ok() ? *name : "device 0", " (", *count,
                                     *count == 1 ? " device)" : " devices)")));
#else
  if (setting == ScorerSetting::kCuda) {
    return absl::FailedPreconditionError("--scorer=cuda: this entrokvd was built without CUDA");
  }
  return none(" (--scorer=auto: built without CUDA)");
#endif
}

bool DeviceScorers::ScoresPool(Backend backend) const {
  if (lender_ == nullptr) return false;
  return setting_ == ScorerSetting::kCuda || backend == Backend::kCuda;
}

#if defined(ENTROKV_HAVE_CUDA)
namespace {

// One layer with a lent scorer, whose statistic is in host memory or (in_place) the device's.
absl::StatusOr<LayerDecision> DecideLent(cuda::Scorer& scorer, bool in_place, const Policy& policy,
                                         const PolicyOptions& options,
                                         const LayerRequest& request) {
  const std::span<const LayerRequest> one(&request, 1);
  absl::StatusOr<std::vector<LayerDecision>> decisions =
      in_place ? scorer.DecideModelOnDevice(policy, options, one)
               : scorer.DecideModel(policy, options, one);
  if (!decisions.ok()) return decisions.status();
  return std::move(decisions->front());
}

}  // namespace
#endif

absl::StatusOr<LayerDecision> DeviceScorers::Decide(int device, bool in_place, const Policy& policy,
                                                    const PolicyOptions& options,
                                                    const LayerRequest& request) {
#if defined(ENTROKV_HAVE_CUDA)
  if (lender_ != nullptr) {
    ASSIGN_OR_RETURN(std::unique_ptr<cuda::Scorer> scorer, lender_->Take(device));
    absl::StatusOr<LayerDecision> decision =
        DecideLent(*scorer, in_place, policy, options, request);
    lender_->Give(std::move(scorer));
    return decision;
  }
#endif
  if (in_place) {
    return absl::InternalError("scoring: a statistic in device memory with no device scorer");
  }
  FusedScorer scorer(options);
  return scorer.DecideLayer(policy, request);
}

}  // namespace entrokv::service
