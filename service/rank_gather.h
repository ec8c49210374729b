// Decisions of tensor-parallel models (docs/service.md, "Several GPUs and tensor parallelism").
// Each rank of a model sends the same Decide with the statistics of its own query heads; the
// ranks share one block table, so they must drop the same pages. RankGather holds the requests
// of one (model, sequence, layers) until every rank's is there, then hands them back as one
// request over all the model's query heads, decided once, whose decision every rank gets. No
// thread waits meanwhile: a waiting rank's reply is a callback, called by the thread of the
// request that completes the set, or by the gather's timer when the last rank does not come
// within the wait (DEADLINE_EXCEEDED naming the missing ranks, nothing applied).
#ifndef ENTROKV_SERVICE_RANK_GATHER_H_
#define ENTROKV_SERVICE_RANK_GATHER_H_

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "entrokv/v1/cache_manager.pb.h"
#include "service/device_reader.h"
#include "service/model_registry.h"
#include "service/shm_reader.h"

namespace entrokv::service {

class RankGather {
 public:
  // A rank's answer: OK with the decision, or the error (decision null). Called exactly once.
  using Reply = std::function<void(const absl::Status& status, const v1::DecideResponse* decision)>;

  // A complete set: the request to decide (rank 0's fields, every rank's statistic rows in
  // rank order, so query_heads = H_Q) and every rank's reply, in rank order.
  struct Complete {
    v1::DecideRequest request;
    std::vector<Reply> replies;
  };

  // `wait`: how long a set waits for its last rank after its first; `max_sets`: sets waiting
  // at once, and `max_bytes`: statistic bytes the waiting ranks hold together, more get
  // RESOURCE_EXHAUSTED; `shm` and `device` read statistics in shared memory and in device
  // buffers (a rank's is copied to the host when it comes) and must outlive this.
  RankGather(std::chrono::milliseconds wait, int max_sets, int64_t max_bytes, const ShmReader* shm,
             DeviceReader* device);
  // Every set still waiting gets UNAVAILABLE.
  ~RankGather();
  RankGather(const RankGather&) = delete;
  RankGather& operator=(const RankGather&) = delete;

  // Adds one rank's request for `model`. The completed set when this request was the last rank
  // to come; nullopt when ranks are missing (`reply` is called later). Errors, where `reply`
  // is not called (the caller answers): NOT_FOUND for an unknown sequence, FAILED_PRECONDITION
  // naming a statistic's tokens other than the sequence's length (checked before any byte is
  // read); INVALID_ARGUMENT naming rank (outside [0, t) or sent
  // twice for the same layers), a statistic field (query_heads other than H_Q / t, a size or
  // dtype that is not the rank's share), or the request when it differs from the first
  // rank's in more than its statistics; then every rank waiting on the set gets the same
  // error and the set is gone. RESOURCE_EXHAUSTED naming max_inflight_decisions when
  // `max_sets` sets wait already, or when this request's rows would make the waiting ranks
  // hold more than `max_bytes` (the last rank of a set never waits, so it always passes);
  // the shared-memory reader's errors.
  [[nodiscard]] absl::StatusOr<std::optional<Complete>> Add(const Model& model,
                                                            const v1::DecideRequest& request,
                                                            Reply reply);

  // Sets waiting for ranks now, and the statistic bytes their ranks hold.
  [[nodiscard]] int waiting() const;
  [[nodiscard]] int64_t held_bytes() const;

 private:
  struct Set {
    std::string description;    // "layers [0, 1] of sequence \"s\" of model \"m\"", for errors
    std::string shape;          // the first request without statistics or rank, serialized
    v1::DecideRequest request;  // the first request, its statistics to be replaced
    std::vector<std::vector<std::string>> rows;  // [rank][layer]: the rank's statistic bytes
    std::vector<std::optional<Reply>> replies;   // [rank]
    int arrived = 0;
    int64_t bytes = 0;  // of rows
    std::chrono::steady_clock::time_point deadline;
  };

  void ExpireLoop();
  // Takes the sets past their deadline out of the map.
  std::vector<Set> TakeExpired(std::chrono::steady_clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::chrono::milliseconds wait_;
  const int max_sets_;
  const int64_t max_bytes_;
  const ShmReader* const shm_;
  DeviceReader* const device_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Set> sets_ ABSL_GUARDED_BY(mu_);
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // every set's bytes
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar timer_wakeup_;  // a new set (an earlier deadline maybe) or stopping
  std::thread timer_;           // started last, joined first
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_RANK_GATHER_H_
