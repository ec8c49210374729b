#include "core/pool/sequence.h"

#include <cstring>
#include <set>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// 2 layers, 2 groups, 4 tokens per page.
constexpr ModelGeometry kGeometry{.layers = 2,
                                  .query_heads = 4,
                                  .kv_groups = 2,
                                  .head_dim = 2,
                                  .page_size = 4,
                                  .element_bytes = 1};

std::unique_ptr<PagePool> MakePool(FrameLayout layout, int64_t frames) {
  PagePoolOptions options;
  options.geometry = kGeometry;
  options.layout = layout;
  options.capacity_frames = frames;
  options.name = "sequence_test";
  return *PagePool::Create(options);
}

TEST(SequenceTest, AppendAllocatesExactlyTheNewPages) {
  auto pool = MakePool(FrameLayout::kGroup, 32);
  Sequence sequence("s", kGeometry, FrameLayout::kGroup);
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult first, sequence.Append(6, *pool));
  EXPECT_EQ(first.length, 6);
  EXPECT_EQ(first.new_frames.size(), 2u * 2 * 2);  // 2 pages x 2 layers x 2 groups
  EXPECT_EQ(pool->used_frames(), 8);
  std::set<FrameId> distinct;
  for (const FrameAssignment& a : first.new_frames) distinct.insert(a.frame);
  EXPECT_EQ(distinct.size(), 8u);
  EXPECT_EQ(first.new_frames[0].layer, 0);
  EXPECT_EQ(first.new_frames[0].group, 0);
  EXPECT_EQ(first.new_frames[1].page, 1);

  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult fill, sequence.Append(2, *pool));  // fills page 1
  EXPECT_TRUE(fill.new_frames.empty());
  EXPECT_EQ(pool->used_frames(), 8);
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult next, sequence.Append(1, *pool));  // opens page 2
  EXPECT_EQ(next.new_frames.size(), 4u);
  EXPECT_EQ(pool->used_frames(), 12);
  EXPECT_EQ(sequence.page_count(), 3);
  EXPECT_EQ(sequence.live_frames(), 12);
  EXPECT_THAT(sequence.Append(-1, *pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens")));
}

TEST(SequenceTest, LayerLayoutSharesOneFramePerLayerPage) {
  auto pool = MakePool(FrameLayout::kLayer, 8);
  Sequence sequence("s", kGeometry, FrameLayout::kLayer);
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult appended, sequence.Append(6, *pool));
  EXPECT_EQ(pool->used_frames(), 4);  // 2 pages x 2 layers
  EXPECT_EQ(appended.new_frames.size(), 8u);
  EXPECT_EQ(sequence.block_table(0, 0), sequence.block_table(0, 1));
  EXPECT_EQ(pool->refcount(sequence.block_table(1, 0)[1]), 2);  // one per group
  EXPECT_EQ(sequence.live_frames(), 4);
}

TEST(SequenceTest, ApplyDecisionFreesEvictedFrames) {
  auto pool = MakePool(FrameLayout::kGroup, 32);
  Sequence sequence("s", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(sequence.Append(16, *pool).status(), IsOk());  // 4 pages
  const std::vector<FrameId> before = sequence.block_table(1, 0);
  const std::vector<FrameId> before_group1 = sequence.block_table(1, 1);
  ENTROKV_ASSERT_OK_AND_ASSIGN(ApplyResult result,
                               sequence.ApplyDecision(1, 16, {{0, 3}, {1, 2, 3}}, *pool));
  EXPECT_THAT(result.evicted_pages_per_group[0], ElementsAre(1, 2));
  EXPECT_THAT(result.evicted_pages_per_group[1], ElementsAre(0));
  EXPECT_EQ(result.frames_released, 3);
  EXPECT_THAT(result.freed_frames, ElementsAre(before[1], before[2], before_group1[0]));
  EXPECT_DOUBLE_EQ(result.page_union_ratio, 1.0);
  EXPECT_THAT(sequence.block_table(1, 0), ElementsAre(before[0], kNoFrame, kNoFrame, before[3]));
  EXPECT_EQ(pool->used_frames(), 16 - 3);
  // Keeping an already-evicted page is allowed; it stays evicted and nothing is freed.
  ENTROKV_ASSERT_OK_AND_ASSIGN(ApplyResult again,
                               sequence.ApplyDecision(1, 16, {{0, 1, 2, 3}, {0, 1, 2, 3}}, *pool));
  EXPECT_EQ(again.frames_released, 0);
  EXPECT_EQ(sequence.block_table(1, 0)[1], kNoFrame);
  EXPECT_EQ(pool->used_frames(), 13);
}

TEST(SequenceTest, LayerLayoutFreesAPageOnlyWhenEveryGroupEvictsIt) {
  auto pool = MakePool(FrameLayout::kLayer, 8);
  Sequence sequence("s", kGeometry, FrameLayout::kLayer);
  ASSERT_THAT(sequence.Append(16, *pool).status(), IsOk());  // 4 pages x 2 layers = 8 frames
  const FrameId page0 = sequence.block_table(0, 0)[0];
  const FrameId page2 = sequence.block_table(0, 0)[2];
  // Group 0 keeps {0, 1}, group 1 keeps {1, 3}: page 0 and 3 stay (one group each), page 2 goes.
  ENTROKV_ASSERT_OK_AND_ASSIGN(ApplyResult result,
                               sequence.ApplyDecision(0, 16, {{0, 1}, {1, 3}}, *pool));
  EXPECT_THAT(result.freed_frames, ElementsAre(page2));
  EXPECT_THAT(result.evicted_pages_per_group[0], ElementsAre(2, 3));
  EXPECT_THAT(result.evicted_pages_per_group[1], ElementsAre(0, 2));
  EXPECT_DOUBLE_EQ(result.page_union_ratio, 3.0 / 2.0);  // |{0,1,3}| / K=2
  EXPECT_EQ(pool->refcount(page0), 1);
  EXPECT_EQ(pool->used_frames(), 7);
  ENTROKV_ASSERT_OK_AND_ASSIGN(ApplyResult second,
                               sequence.ApplyDecision(0, 16, {{1}, {1}}, *pool));
  EXPECT_EQ(second.frames_released, 2);  // pages 0 and 3 lose their last group
  EXPECT_DOUBLE_EQ(second.page_union_ratio, 1.0);
  EXPECT_EQ(pool->used_frames(), 5);
}

TEST(SequenceTest, BadDecisionsChangeNothing) {
  auto pool = MakePool(FrameLayout::kGroup, 32);
  Sequence sequence("s", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(sequence.Append(10, *pool).status(), IsOk());  // 3 pages
  const auto tables = sequence.BlockTables();
  EXPECT_THAT(sequence.ApplyDecision(0, 9, {{0}, {0}}, *pool),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("9 tokens")));
  EXPECT_THAT(sequence.ApplyDecision(0, 10, {{0}}, *pool),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("groups")));
  EXPECT_THAT(sequence.ApplyDecision(2, 10, {{0}, {0}}, *pool),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("layer 2")));
  EXPECT_THAT(sequence.ApplyDecision(0, 10, {{0}, {3}}, *pool),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("page 3")));
  // Group 0 is valid and would evict; the bad group 1 must stop it before anything changes.
  EXPECT_THAT(sequence.ApplyDecision(0, 10, {{0}, {2, 1}}, *pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ascending")));
  EXPECT_THAT(sequence.ApplyDecision(0, 10, {{0}, {-1}}, *pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kept_pages_per_group[1]")));
  EXPECT_EQ(sequence.BlockTables(), tables);
  EXPECT_EQ(pool->used_frames(), 12);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(SequenceTest, AppendAfterTailEvictionAllocatesAFreshFrame) {
  auto pool = MakePool(FrameLayout::kGroup, 32);
  Sequence sequence("s", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(sequence.Append(6, *pool).status(), IsOk());  // page 1 is partial
  ASSERT_THAT(sequence.ApplyDecision(0, 6, {{0}, {0, 1}}, *pool).status(), IsOk());
  EXPECT_EQ(sequence.block_table(0, 0)[1], kNoFrame);
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult appended, sequence.Append(1, *pool));
  ASSERT_EQ(appended.new_frames.size(), 1u);
  EXPECT_EQ(appended.new_frames[0].layer, 0);
  EXPECT_EQ(appended.new_frames[0].group, 0);
  EXPECT_EQ(appended.new_frames[0].page, 1);
  EXPECT_NE(sequence.block_table(0, 0)[1], kNoFrame);
  EXPECT_EQ(pool->used_frames(), 8);
  // An evicted full page stays evicted: the next append opens a new page only.
  ASSERT_THAT(sequence.Append(1, *pool).status(), IsOk());  // length 8, page 1 full
  ASSERT_THAT(sequence.ApplyDecision(1, 8, {{0}, {0}}, *pool).status(), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult later, sequence.Append(1, *pool));
  EXPECT_EQ(later.new_frames.size(), 4u);
  EXPECT_EQ(sequence.block_table(1, 0)[1], kNoFrame);
}

TEST(SequenceTest, LayerLayoutTailReReferencesAFrameStillHeld) {
  auto pool = MakePool(FrameLayout::kLayer, 8);
  Sequence sequence("s", kGeometry, FrameLayout::kLayer);
  ASSERT_THAT(sequence.Append(6, *pool).status(), IsOk());
  const FrameId tail = sequence.block_table(0, 0)[1];
  ASSERT_THAT(sequence.ApplyDecision(0, 6, {{0}, {0, 1}}, *pool).status(), IsOk());
  EXPECT_EQ(pool->refcount(tail), 1);
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult appended, sequence.Append(1, *pool));
  ASSERT_EQ(appended.new_frames.size(), 1u);
  EXPECT_EQ(appended.new_frames[0].frame, tail);
  EXPECT_EQ(pool->refcount(tail), 2);
  EXPECT_EQ(pool->used_frames(), 4);
}

TEST(SequenceTest, ForkSharesThePrefixAndEvictionDropsOnlyItsReference) {
  auto pool = MakePool(FrameLayout::kGroup, 64);
  Sequence parent("p", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(parent.Append(12, *pool).status(), IsOk());  // 3 full pages, 12 frames
  ENTROKV_ASSERT_OK_AND_ASSIGN(Sequence child, Sequence::Fork("c", parent, 2, *pool));
  EXPECT_EQ(child.length(), 8);
  EXPECT_EQ(pool->used_frames(), 12);
  const FrameId shared = parent.block_table(0, 0)[0];
  EXPECT_EQ(child.block_table(0, 0)[0], shared);
  EXPECT_EQ(pool->refcount(shared), 2);
  ENTROKV_ASSERT_OK_AND_ASSIGN(ApplyResult evicted, child.ApplyDecision(0, 8, {{1}, {1}}, *pool));
  EXPECT_EQ(evicted.frames_released, 0);  // the parent still uses page 0
  EXPECT_EQ(pool->refcount(shared), 1);
  EXPECT_EQ(parent.block_table(0, 0)[0], shared);
  ASSERT_THAT(parent.Release(*pool), IsOk());
  EXPECT_EQ(pool->used_frames(), 6);  // the child's 2 pages x 4 units minus its 2 evictions
  ASSERT_THAT(child.Release(*pool), IsOk());
  EXPECT_EQ(pool->used_frames(), 0);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(SequenceTest, ForkRangeIsChecked) {
  auto pool = MakePool(FrameLayout::kGroup, 64);
  Sequence parent("p", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(parent.Append(5, *pool).status(), IsOk());
  EXPECT_THAT(Sequence::Fork("c", parent, 3, *pool).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("prefix_pages")));
  EXPECT_THAT(Sequence::Fork("c", parent, -1, *pool).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prefix_pages")));
  EXPECT_EQ(pool->used_frames(), 8);
  EXPECT_EQ(pool->refcount(parent.block_table(0, 0)[0]), 1);
}

TEST(SequenceTest, AppendIntoASharedTailCopiesOnWrite) {
  auto pool = MakePool(FrameLayout::kGroup, 64);
  Sequence parent("p", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(parent.Append(6, *pool).status(), IsOk());  // tail page 1 holds 2 tokens
  const FrameId parent_tail = parent.block_table(1, 1)[1];
  std::memset(pool->FrameAddress(parent_tail), 0x42, pool->frame_bytes());
  ENTROKV_ASSERT_OK_AND_ASSIGN(Sequence child, Sequence::Fork("c", parent, 2, *pool));
  EXPECT_EQ(child.length(), 6);
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult appended, child.Append(1, *pool));
  EXPECT_EQ(appended.frames_copied, 4);  // the tail of each (layer, group)
  EXPECT_EQ(appended.new_frames.size(), 4u);
  const FrameId child_tail = child.block_table(1, 1)[1];
  EXPECT_NE(child_tail, parent_tail);
  EXPECT_EQ(parent.block_table(1, 1)[1], parent_tail);
  EXPECT_EQ(pool->refcount(parent_tail), 1);
  EXPECT_EQ(std::memcmp(pool->FrameAddress(child_tail), pool->FrameAddress(parent_tail),
                        pool->frame_bytes()),
            0);
  // The shared full page 0 was not touched.
  EXPECT_EQ(child.block_table(1, 1)[0], parent.block_table(1, 1)[0]);
  EXPECT_EQ(pool->used_frames(), 8 + 4);
}

TEST(SequenceTest, ExhaustedAppendAllocatesNothing) {
  auto pool = MakePool(FrameLayout::kGroup, 10);
  Sequence sequence("s", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(sequence.Append(4, *pool).status(), IsOk());  // 4 frames
  ENTROKV_ASSERT_OK_AND_ASSIGN(int64_t needed, sequence.FramesNeeded(8, *pool));
  EXPECT_EQ(needed, 8);
  EXPECT_THAT(sequence.Append(8, *pool),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("needs 8 frames, 6 free")));
  EXPECT_EQ(sequence.length(), 4);
  EXPECT_EQ(sequence.page_count(), 1);
  EXPECT_EQ(pool->used_frames(), 4);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(SequenceTest, DoubleReleaseIsAnError) {
  auto pool = MakePool(FrameLayout::kGroup, 16);
  Sequence sequence("s", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(sequence.Append(4, *pool).status(), IsOk());
  ASSERT_THAT(sequence.Release(*pool), IsOk());
  EXPECT_EQ(pool->used_frames(), 0);
  EXPECT_THAT(sequence.Release(*pool),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already closed")));
  EXPECT_THAT(sequence.Append(1, *pool),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("closed")));
  EXPECT_EQ(pool->free_frames(), 16);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(SequenceTest, TruncateReleasesThePagesPastTheNewEnd) {
  auto pool = MakePool(FrameLayout::kGroup, 32);
  Sequence sequence("s", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(sequence.Append(10, *pool).status(), IsOk());  // 3 pages x 2 layers x 2 groups
  const std::vector<FrameId> layer1 = sequence.block_table(1, 1);
  ENTROKV_ASSERT_OK_AND_ASSIGN(TruncateResult cut, sequence.Truncate(5, *pool));
  EXPECT_EQ(cut.length, 5);
  EXPECT_EQ(sequence.length(), 5);
  EXPECT_EQ(sequence.page_count(), 2);
  EXPECT_EQ(cut.entries_released, 4);  // page 2 of each (layer, group)
  EXPECT_EQ(cut.freed_frames.size(), 4u);
  EXPECT_THAT(sequence.block_table(1, 1), ElementsAre(layer1[0], layer1[1]));
  EXPECT_EQ(pool->used_frames(), 8);
  // Inside the tail page nothing is released; the next append writes on in its frame.
  ASSERT_THAT(sequence.Append(2, *pool).status(), IsOk());  // 7 tokens
  ENTROKV_ASSERT_OK_AND_ASSIGN(TruncateResult inside, sequence.Truncate(1, *pool));
  EXPECT_EQ(inside.length, 6);
  EXPECT_EQ(inside.entries_released, 0);
  EXPECT_EQ(pool->used_frames(), 8);
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult refill, sequence.Append(2, *pool));  // to 8 tokens
  EXPECT_TRUE(refill.new_frames.empty());
  EXPECT_EQ(sequence.block_table(1, 1)[1], layer1[1]);
  ENTROKV_ASSERT_OK_AND_ASSIGN(TruncateResult all, sequence.Truncate(8, *pool));
  EXPECT_EQ(all.length, 0);
  EXPECT_EQ(all.freed_frames.size(), 8u);
  EXPECT_EQ(pool->used_frames(), 0);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(SequenceTest, TruncateOutOfRangeChangesNothing) {
  auto pool = MakePool(FrameLayout::kGroup, 32);
  Sequence sequence("s", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(sequence.Append(6, *pool).status(), IsOk());
  const auto tables = sequence.BlockTables();
  EXPECT_THAT(sequence.Truncate(7, *pool),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("tokens: 7 is more than the 6")));
  EXPECT_THAT(sequence.Truncate(0, *pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens")));
  EXPECT_THAT(sequence.Truncate(-3, *pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens")));
  EXPECT_EQ(sequence.length(), 6);
  EXPECT_EQ(sequence.BlockTables(), tables);
  EXPECT_EQ(pool->used_frames(), 8);
}

TEST(SequenceTest, LayerLayoutTruncateFreesEachFrameOnce) {
  auto pool = MakePool(FrameLayout::kLayer, 16);
  Sequence sequence("s", kGeometry, FrameLayout::kLayer);
  ASSERT_THAT(sequence.Append(12, *pool).status(), IsOk());  // 3 pages x 2 layers
  const FrameId last = sequence.block_table(0, 0)[2];
  ENTROKV_ASSERT_OK_AND_ASSIGN(TruncateResult cut, sequence.Truncate(4, *pool));
  EXPECT_EQ(cut.entries_released, 4);  // page 2 of 2 layers x 2 group entries
  ASSERT_EQ(cut.freed_frames.size(), 2u);
  EXPECT_EQ(cut.freed_frames[0], last);
  EXPECT_EQ(pool->used_frames(), 4);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(SequenceTest, TruncateIntoASharedPageKeepsItSharedUntilTheNextAppendCopiesIt) {
  // Speculative tokens on a fork: the child appends past a page it shares with its parent, the
  // target model rejects them, and the child's tail is the shared page again. Writing into it
  // must not reach the parent's copy.
  auto pool = MakePool(FrameLayout::kGroup, 64);
  Sequence parent("p", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(parent.Append(8, *pool).status(), IsOk());  // 2 full pages
  const FrameId shared = parent.block_table(1, 0)[1];
  std::memset(pool->FrameAddress(shared), 0x37, pool->frame_bytes());
  ENTROKV_ASSERT_OK_AND_ASSIGN(Sequence child, Sequence::Fork("c", parent, 2, *pool));
  ASSERT_THAT(child.Append(3, *pool).status(), IsOk());  // page 2, private
  EXPECT_EQ(pool->used_frames(), 8 + 4);
  ENTROKV_ASSERT_OK_AND_ASSIGN(TruncateResult cut, child.Truncate(5, *pool));  // to 6 tokens
  EXPECT_EQ(cut.freed_frames.size(), 4u);  // the child's own page 2
  EXPECT_EQ(child.block_table(1, 0)[1], shared);
  EXPECT_EQ(pool->refcount(shared), 2);
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult again, child.Append(1, *pool));
  EXPECT_EQ(again.frames_copied, 4);  // page 1 of each (layer, group): copy-on-write
  const FrameId copy = child.block_table(1, 0)[1];
  EXPECT_NE(copy, shared);
  EXPECT_EQ(parent.block_table(1, 0)[1], shared);
  EXPECT_EQ(pool->refcount(shared), 1);
  EXPECT_EQ(std::memcmp(pool->FrameAddress(copy), pool->FrameAddress(shared), pool->frame_bytes()),
            0);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(SequenceTest, TruncateKeepsEvictedPagesEvicted) {
  auto pool = MakePool(FrameLayout::kGroup, 32);
  Sequence sequence("s", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(sequence.Append(12, *pool).status(), IsOk());  // 3 pages
  ASSERT_THAT(sequence.ApplyDecision(0, 12, {{0, 2}, {0, 1, 2}}, *pool).status(), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(TruncateResult cut, sequence.Truncate(5, *pool));  // to 7
  EXPECT_EQ(cut.entries_released, 4);
  EXPECT_EQ(sequence.block_table(0, 0)[1], kNoFrame);  // evicted before, evicted now
  // The evicted page is the tail now: an append gives it a fresh frame (its older slots are
  // undefined, as after any eviction of a tail page).
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult appended, sequence.Append(1, *pool));
  ASSERT_EQ(appended.new_frames.size(), 1u);
  EXPECT_EQ(appended.new_frames[0].page, 1);
  EXPECT_NE(sequence.block_table(0, 0)[1], kNoFrame);
  EXPECT_THAT(pool->CheckInvariants(), IsOk());
}

TEST(SequenceTest, RunningSumsFollowTheSequence) {
  auto pool = MakePool(FrameLayout::kGroup, 64);
  Sequence sequence("s", kGeometry, FrameLayout::kGroup);
  ASSERT_THAT(sequence.Append(6, *pool).status(), IsOk());
  EXPECT_TRUE(sequence.running_sum(1).empty());
  EXPECT_EQ(sequence.running_sum_bytes(), 0);
  std::vector<float> sum(4 * 6);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = static_cast<float>(i);
  std::vector<float> short_sum(4 * 5);
  EXPECT_THAT(sequence.ApplyDecision(1, 6, {{0, 1}, {0, 1}}, *pool, &short_sum),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4 heads x 6 tokens")));
  EXPECT_TRUE(sequence.running_sum(1).empty());
  std::vector<float> moved = sum;
  ENTROKV_ASSERT_OK_AND_ASSIGN(ApplyResult applied,
                               sequence.ApplyDecision(1, 6, {{0, 1}, {0, 1}}, *pool, &moved));
  EXPECT_TRUE(applied.running_sum_set);
  EXPECT_EQ(sequence.running_sum(1), sum);
  EXPECT_EQ(sequence.running_sum_tokens(1), 6);
  EXPECT_TRUE(sequence.running_sum(0).empty());
  EXPECT_EQ(sequence.running_sum_bytes(),
            static_cast<int64_t>(2 * sizeof(std::vector<float>) + sum.size() * sizeof(float)));
  // A fork of the first page inherits the first 4 columns of every head's row.
  ENTROKV_ASSERT_OK_AND_ASSIGN(Sequence child, Sequence::Fork("c", sequence, 1, *pool));
  EXPECT_THAT(child.running_sum(1),
              ElementsAre(0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 15, 18, 19, 20, 21));
  // Truncation drops the truncated tokens' columns.
  ASSERT_THAT(sequence.Truncate(4, *pool).status(), IsOk());
  EXPECT_THAT(sequence.running_sum(1), ElementsAre(0, 1, 6, 7, 12, 13, 18, 19));
  EXPECT_EQ(sequence.running_sum_tokens(1), 2);
  ASSERT_THAT(sequence.Release(*pool), IsOk());
  EXPECT_EQ(sequence.running_sum_bytes(), 0);
  ASSERT_THAT(child.Release(*pool), IsOk());
}

}  // namespace
}  // namespace entrokv
