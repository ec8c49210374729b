#include "service/worker_pool.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace entrokv::service {
namespace {

TEST(WorkerPoolTest, RunsEveryAcceptedJob) {
  std::atomic<int> ran{0};
  {
    WorkerPool pool(2, 100);
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(pool.TrySubmit([&ran] { ++ran; }));
    pool.WaitIdle();
    EXPECT_EQ(ran.load(), 50);
    EXPECT_EQ(pool.inflight(), 0);
  }
  EXPECT_EQ(ran.load(), 50);
}

TEST(WorkerPoolTest, RefusesBeyondTheInflightBound) {
  WorkerPool pool(1, 2);
  absl::Notification release;
  ASSERT_TRUE(pool.TrySubmit([&release] { release.WaitForNotification(); }));
  ASSERT_TRUE(pool.TrySubmit([] {}));
  EXPECT_FALSE(pool.TrySubmit([] {}));  // one running + one queued = the bound
  EXPECT_EQ(pool.inflight(), 2);
  release.Notify();
  pool.WaitIdle();
  EXPECT_TRUE(pool.TrySubmit([] {}));
  pool.WaitIdle();
}

}  // namespace
}  // namespace entrokv::service
