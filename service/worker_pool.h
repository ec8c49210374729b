// A fixed set of threads running scoring jobs, with a hard bound on the jobs in flight.
#ifndef ENTROKV_SERVICE_WORKER_POOL_H_
#define ENTROKV_SERVICE_WORKER_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace entrokv::service {

// Jobs run in submission order on `threads` threads. At most `max_inflight` jobs are queued or
// running; TrySubmit refuses more at once instead of queueing without bound, which is how the
// daemon sheds overload (RESOURCE_EXHAUSTED) without ever blocking a gRPC thread.
// Thread-safe. The destructor runs every accepted job, then joins.
class WorkerPool {
 public:
  // REQUIRES: threads >= 1, max_inflight >= 1.
  WorkerPool(int threads, int max_inflight);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `job` and returns true, or returns false (dropping it) when max_inflight jobs are
  // already queued or running.
  [[nodiscard]] bool TrySubmit(std::function<void()> job);
  // Jobs queued or running now.
  [[nodiscard]] int inflight() const;
  // Blocks until no job is queued or running (for drain at shutdown and for tests).
  void WaitIdle();

 private:
  void Loop();

  const int max_inflight_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_WORKER_POOL_H_
