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

// In the group layout with several ranks a frame lives whole in one rank's arena: each rank
// has its own frames, free list and byte range, and a copy never crosses ranks.
TEST(PagePoolTest, GroupLayoutRanksHaveTheirOwnFramesAndFreeLists) {
  PagePoolOptions options = SmallPool(6);  // 2 KV groups
  options.devices = {0, 1};
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(options));
  EXPECT_EQ(pool->free_lists(), 2);
  EXPECT_EQ(pool->rank_frames(), 3);
  EXPECT_EQ(pool->rank_frame_bytes(), pool->frame_bytes());
  EXPECT_EQ(pool->arena_info(1).bytes, 3 * pool->frame_bytes());
  EXPECT_EQ(pool->rank_span(1).first_frame, 3);
  EXPECT_EQ(pool->GroupRank(0), 0);
  EXPECT_EQ(pool->GroupRank(1), 1);
  // Rank 1's frames are 3, 4, 5 and run out on their own.
  std::set<FrameId> frames;
  for (int i = 0; i < 3; ++i) {
    ENTROKV_ASSERT_OK_AND_ASSIGN(FrameId frame, pool->Allocate(0, 1, 1));
    EXPECT_EQ(pool->FrameRank(frame), 1);
    frames.insert(frame);
  }
  EXPECT_EQ(frames, (std::set<FrameId>{3, 4, 5}));
  EXPECT_THAT(pool->Allocate(0, 1, 1),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("rank 1")));
  EXPECT_EQ(pool->free_frames(), 3);
  EXPECT_EQ(pool->free_frames(0), 3);
  EXPECT_EQ(pool->even_free_frames(), 0);  // rank 1 can give nothing
  ENTROKV_ASSERT_OK_AND_ASSIGN(const FrameId first, pool->Allocate(1, 1, 0));
  EXPECT_EQ(first, 0);
  // Frame 4 is at the second frame of rank 1's arena.
  EXPECT_EQ(static_cast<char*>(pool->FrameAddress(4, 1)),
            static_cast<char*>(pool->FrameAddress(3, 1)) + pool->frame_bytes());
  std::memset(pool->FrameAddress(4, 1), 0x5a, static_cast<size_t>(pool->frame_bytes()));
  EXPECT_THAT(pool->CopyFrame(4, 5), IsOk());
  EXPECT_EQ(static_cast<char*>(pool->FrameAddress(5, 1))[pool->frame_bytes() - 1], 0x5a);
  EXPECT_THAT(pool->CopyFrame(4, first),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("one rank")));
  // A freed frame goes back to its own rank's list.
  ENTROKV_ASSERT_OK_AND_ASSIGN(const bool freed, pool->Release(4));
  EXPECT_TRUE(freed);
  EXPECT_EQ(pool->free_frames(1), 1);
  EXPECT_EQ(pool->even_free_frames(), 2);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const FrameId again, pool->Allocate(0, 1, 1));
  EXPECT_EQ(again, 4);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
  // Restore puts every free frame back on its rank's list.
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto restored, PagePool::Create(options));
  EXPECT_THAT(restored->Restore({0, 1, 0, 0, 2, 0}, {-1, 0, -1, -1, 1, -1}), IsOk());
  EXPECT_EQ(restored->free_frames(0), 2);
  EXPECT_EQ(restored->free_frames(1), 2);
  EXPECT_THAT(restored->CheckInvariants(), IsOk());
  // Each rank's arena holds an equal share of whole frames.
  options.capacity_frames = 5;
  EXPECT_THAT(PagePool::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("capacity_frames")));
}

}  // namespace
}  // namespace entrokv
