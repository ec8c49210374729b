#include "core/pool/page_pool.h"

#include <cstring>
#include <set>

#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

PagePoolOptions SmallPool(int64_t capacity_frames) {
  PagePoolOptions options;
  options.geometry = {.layers = 2,
                      .query_heads = 4,
                      .kv_groups = 2,
                      .head_dim = 4,
                      .page_size = 4,
                      .element_bytes = 2};
  options.capacity_frames = capacity_frames;
  options.name = "page_pool_test";
  return options;
}

TEST(PagePoolTest, StartsEmpty) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(SmallPool(8)));
  EXPECT_EQ(pool->capacity_frames(), 8);
  EXPECT_EQ(pool->used_frames(), 0);
  EXPECT_EQ(pool->free_frames(), 8);
  EXPECT_EQ(pool->frame_bytes(), 2 * 4 * 4 * 2);
  EXPECT_EQ(pool->arena_info().bytes, 8 * pool->frame_bytes());
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(PagePoolTest, RejectsBadCapacityAndGeometry) {
  EXPECT_THAT(PagePool::Create(SmallPool(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("capacity_frames")));
  EXPECT_THAT(PagePool::Create(SmallPool(int64_t{1} << 31)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("capacity_frames")));
  PagePoolOptions options = SmallPool(4);
  options.geometry.head_dim = -1;
  EXPECT_THAT(PagePool::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head_dim")));
}

TEST(PagePoolTest, AllocatesDistinctFramesUntilExhausted) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(SmallPool(4)));
  std::set<FrameId> frames;
  for (int i = 0; i < 4; ++i) {
    ENTROKV_ASSERT_OK_AND_ASSIGN(FrameId frame, pool->Allocate(i % 2, 1));
    frames.insert(frame);
    EXPECT_THAT(pool->CheckInvariants(), IsOk());
  }
  EXPECT_EQ(frames.size(), 4u);
  EXPECT_EQ(pool->used_frames_per_layer(), (std::vector<int64_t>{2, 2}));
  EXPECT_THAT(pool->Allocate(0, 1),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("exhausted")));
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(PagePoolTest, EvictedFramesReturnToFreeList) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(SmallPool(2)));
  ENTROKV_ASSERT_OK_AND_ASSIGN(FrameId a, pool->Allocate(0, 1));
  ENTROKV_ASSERT_OK_AND_ASSIGN(FrameId b, pool->Allocate(1, 1));
  ENTROKV_ASSERT_OK_AND_ASSIGN(bool freed, pool->Release(a));
  EXPECT_TRUE(freed);
  EXPECT_EQ(pool->free_frames(), 1);
  EXPECT_EQ(pool->frame_layer(a), -1);
  // The freed frame is the next one handed out (LIFO free list).
  ENTROKV_ASSERT_OK_AND_ASSIGN(FrameId c, pool->Allocate(1, 1));
  EXPECT_EQ(c, a);
  EXPECT_NE(c, b);
  EXPECT_EQ(pool->used_frames_per_layer(), (std::vector<int64_t>{0, 2}));
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(PagePoolTest, ReferenceCountsDelayTheFree) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(SmallPool(2)));
  ENTROKV_ASSERT_OK_AND_ASSIGN(FrameId frame, pool->Allocate(0, 2));
  ASSERT_THAT(pool->AddRef(frame), IsOk());
  EXPECT_EQ(pool->refcount(frame), 3);
  EXPECT_FALSE(*pool->Release(frame));
  EXPECT_FALSE(*pool->Release(frame));
  EXPECT_EQ(pool->used_frames(), 1);
  EXPECT_TRUE(*pool->Release(frame));
  EXPECT_EQ(pool->used_frames(), 0);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(PagePoolTest, DoubleReleaseIsAnErrorNotADoubleFree) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(SmallPool(2)));
  ENTROKV_ASSERT_OK_AND_ASSIGN(FrameId frame, pool->Allocate(0, 1));
  ASSERT_TRUE(*pool->Release(frame));
  EXPECT_THAT(pool->Release(frame),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not in use")));
  EXPECT_THAT(pool->AddRef(frame),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not in use")));
  EXPECT_THAT(pool->Release(99), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("99")));
  EXPECT_EQ(pool->free_frames(), 2);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(PagePoolTest, CopyFrameCopiesBytes) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(SmallPool(3)));
  ENTROKV_ASSERT_OK_AND_ASSIGN(FrameId a, pool->Allocate(0, 1));
  ENTROKV_ASSERT_OK_AND_ASSIGN(FrameId b, pool->Allocate(0, 1));
  std::memset(pool->FrameAddress(a), 0x5A, pool->frame_bytes());
  std::memset(pool->FrameAddress(b), 0, pool->frame_bytes());
  ASSERT_THAT(pool->CopyFrame(a, b), IsOk());
  EXPECT_EQ(std::memcmp(pool->FrameAddress(a), pool->FrameAddress(b), pool->frame_bytes()), 0);
  EXPECT_THAT(pool->CopyFrame(a, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("CopyFrame")));
}

TEST(PagePoolTest, CudaBackendWithoutCudaIsUnimplemented) {
#ifdef ENTROKV_POOL_HAVE_CUDA
  GTEST_SKIP() << "built with CUDA; cuda_arena_test covers the backend";
#else
  PagePoolOptions options = SmallPool(2);
  options.backend = Backend::kCuda;
  EXPECT_THAT(PagePool::Create(options),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("cuda was not built in")));
#endif
}

}  // namespace
}  // namespace entrokv
