#include "service/worker_pool.h"

#include <utility>

namespace entrokv::service {

WorkerPool::WorkerPool(int threads, int max_inflight) : max_inflight_(max_inflight) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

bool WorkerPool::TrySubmit(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || inflight_ >= max_inflight_) return false;
  ++inflight_;
  queue_.push_back(std::move(job));
  return true;
}

int WorkerPool::inflight() const {
  absl::MutexLock lock(&mu_);
  return inflight_;
}

void WorkerPool::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* inflight) { return *inflight == 0; }, &inflight_));
}

void WorkerPool::Loop() {
  while (true) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPool* pool)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return pool->stopping_ || !pool->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
    absl::MutexLock lock(&mu_);
    --inflight_;
  }
}

}  // namespace entrokv::service
