// BookkeepingBudget: the daemon memory every model's bookkeeping holds together, bounded.
#ifndef ENTROKV_CORE_POOL_BOOKKEEPING_BUDGET_H_
#define ENTROKV_CORE_POOL_BOOKKEEPING_BUDGET_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace entrokv {

// Each model's CacheState accounts its own bookkeeping (the pool's per-frame arrays, every
// sequence's block tables and head weights; CacheLimits bounds it per sequence and per model)
// and reserves the same bytes here before it allocates them, so the models of one daemon
// together stay within one bound (--max_bookkeeping_bytes), whatever their number. Thread-safe:
// one atomic counter, shared by every CacheState that names it (CacheLimits::daemon); it must
// outlive them.
class BookkeepingBudget {
 public:
  // limit_bytes <= 0: unbounded (the bytes are still counted).
  explicit BookkeepingBudget(int64_t limit_bytes) : limit_bytes_(limit_bytes) {}
  BookkeepingBudget(const BookkeepingBudget&) = delete;
  BookkeepingBudget& operator=(const BookkeepingBudget&) = delete;

  // Takes `bytes` (>= 0) when the total stays within the limit. RESOURCE_EXHAUSTED naming
  // max_bookkeeping_bytes and `what` otherwise, with nothing taken.
  [[nodiscard]] absl::Status Reserve(int64_t bytes, absl::string_view what);
  // Takes `bytes` whatever the limit: recovery brings back what a journal holds.
  void Force(int64_t bytes) { used_bytes_.fetch_add(bytes); }
  // Gives back bytes taken before.
  void Release(int64_t bytes) { used_bytes_.fetch_sub(bytes); }

  [[nodiscard]] int64_t used_bytes() const { return used_bytes_.load(); }
  [[nodiscard]] int64_t limit_bytes() const { return limit_bytes_; }

 private:
  const int64_t limit_bytes_;
  std::atomic<int64_t> used_bytes_{0};
};

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_BOOKKEEPING_BUDGET_H_
