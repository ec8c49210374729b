#include "core/pool/cache_state.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

CacheOptions Options(FrameLayout layout, int64_t frames) {
  CacheOptions options;
  options.geometry = {.layers = 3,
                      .query_heads = 8,
                      .kv_groups = 2,
                      .head_dim = 4,
                      .page_size = 4,
                      .element_bytes = 2};
  options.layout = layout;
  options.capacity_bytes = frames * FrameBytes(options.geometry, layout) + 7;  // floor to frames
  options.name = "cache_state_test";
  return options;
}

TEST(CacheStateTest, CreateChecksCapacityAndGeometry) {
  CacheOptions options = Options(FrameLayout::kGroup, 1);
  options.capacity_bytes = FrameBytes(options.geometry, FrameLayout::kGroup) - 1;
  EXPECT_THAT(CacheState::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("capacity_bytes")));
  options = Options(FrameLayout::kGroup, 4);
  options.geometry.kv_groups = 3;
  EXPECT_THAT(CacheState::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("query_heads")));
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(FrameLayout::kLayer, 10)));
  const PoolStats stats = state->Stats();
  EXPECT_EQ(stats.capacity_frames, 10);
  EXPECT_EQ(stats.frame_bytes, 2 * 4 * 4 * 2 * 2);
  EXPECT_EQ(stats.capacity_bytes, 10 * stats.frame_bytes);
  EXPECT_EQ(state->arena().backend, Backend::kHost);
  EXPECT_FALSE(state->arena().name.empty());
}

TEST(CacheStateTest, ApplyDecisionsIsAllOrNothing) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(FrameLayout::kGroup, 64)));
  ASSERT_THAT(state->OpenSequence("a", 9), IsOk());  // 3 pages x 3 layers x 2 groups
  const PoolStats before = state->Stats();
  // Layer 2's page 7 does not exist: layers 0 and 1, though valid, must not be applied.
  EXPECT_THAT(
      state->ApplyDecisions("a", 9,
                            {{.layer = 0, .kept_pages_per_group = {{2}, {2}}, .running_sum = {}},
                             {.layer = 1, .kept_pages_per_group = {{2}, {2}}, .running_sum = {}},
                             {.layer = 2, .kept_pages_per_group = {{7}, {2}}, .running_sum = {}}}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("layer 2")));
  EXPECT_THAT(
      state->ApplyDecisions("a", 9,
                            {{.layer = 1, .kept_pages_per_group = {{2}, {2}}, .running_sum = {}},
                             {.layer = 1, .kept_pages_per_group = {{2}, {2}}, .running_sum = {}}}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  EXPECT_THAT(state->ApplyDecisions("a", 9, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one layer")));
  EXPECT_EQ(state->Stats().used_frames, before.used_frames);
  EXPECT_EQ(state->Stats().pages_evicted_total, 0);

  int hook_runs = 0;
  state->SetDecisionHookForTest([&] { ++hook_runs; });
  ENTROKV_ASSERT_OK_AND_ASSIGN(
      const std::vector<ApplyResult> applied,
      state->ApplyDecisions("a", 9,
                            {{.layer = 2, .kept_pages_per_group = {{2}, {0, 2}}, .running_sum = {}},
                             {.layer = 0, .kept_pages_per_group = {{}, {1}}, .running_sum = {}}}));
  EXPECT_EQ(hook_runs, 1);  // once per call, not per layer
  ASSERT_EQ(applied.size(), 2u);
  EXPECT_EQ(applied[0].frames_released, 3);  // layer 2: pages 0, 1 and 1
  EXPECT_EQ(applied[1].frames_released, 5);  // layer 0: pages 0, 1, 2 and 0, 2
  EXPECT_EQ(state->Stats().used_frames, before.used_frames - 8);
  EXPECT_THAT(state->CheckInvariants(), IsOk());
}

TEST(CacheStateTest, LifecycleAndStats) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(FrameLayout::kGroup, 64)));
  ASSERT_THAT(state->OpenSequence("a", 5), IsOk());  // 2 pages x 3 layers x 2 groups
  EXPECT_THAT(state->CheckInvariants(), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult appended, state->AppendTokens("a", 4));
  EXPECT_EQ(appended.length, 9);
  EXPECT_EQ(appended.new_frames.size(), 6u);
  EXPECT_THAT(state->CheckInvariants(), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(ApplyResult applied, state->ApplyDecision("a", 2, 9, {{2}, {0, 2}}));
  EXPECT_EQ(applied.frames_released, 3);
  EXPECT_THAT(state->CheckInvariants(), IsOk());

  PoolStats stats = state->Stats();
  EXPECT_EQ(stats.used_frames, 18 - 3);
  EXPECT_EQ(stats.free_frames, 64 - 15);
  EXPECT_EQ(stats.sequences_active, 1);
  EXPECT_THAT(stats.used_frames_per_layer, ElementsAre(6, 6, 3));
  EXPECT_EQ(stats.pages_evicted_total, 3);
  EXPECT_EQ(stats.frames_freed_total, 3);
  EXPECT_EQ(stats.bytes_moved_total, 0);
  EXPECT_EQ(stats.decisions_total, 1);

  ENTROKV_ASSERT_OK_AND_ASSIGN(SequenceInfo info, state->GetSequence("a"));
  EXPECT_EQ(info.length, 9);
  EXPECT_EQ(info.live_frames, 15);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const int64_t length, state->SequenceLength("a"));
  EXPECT_EQ(length, 9);
  ENTROKV_ASSERT_OK_AND_ASSIGN(SequenceInfo brief,
                               state->GetSequence("a", /*with_block_tables=*/false));
  EXPECT_EQ(brief.live_frames, 15);
  EXPECT_TRUE(brief.block_tables.empty());
  ASSERT_EQ(info.block_tables.size(), 3u);
  EXPECT_EQ(info.block_tables[2][0][0], kNoFrame);
  EXPECT_NE(info.block_tables[2][0][2], kNoFrame);

  ASSERT_THAT(state->CloseSequence("a"), IsOk());
  EXPECT_THAT(state->CloseSequence("a"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("\"a\"")));
  stats = state->Stats();
  EXPECT_EQ(stats.used_frames, 0);
  EXPECT_EQ(stats.sequences_active, 0);
  EXPECT_THAT(state->CheckInvariants(), IsOk());
}

TEST(CacheStateTest, ErrorsNameTheProblemAndChangeNothing) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(FrameLayout::kGroup, 12)));
  EXPECT_THAT(state->OpenSequence("", 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sequence_id")));
  EXPECT_THAT(state->OpenSequence("a", -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("initial_tokens")));
  ASSERT_THAT(state->OpenSequence("a", 4), IsOk());  // 6 frames
  EXPECT_THAT(state->OpenSequence("a", 1),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("\"a\"")));
  // 8 tokens need 12 frames: the open fails and leaves no sequence behind.
  EXPECT_THAT(state->OpenSequence("b", 8),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("exhausted")));
  EXPECT_THAT(state->GetSequence("b"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("\"b\"")));
  EXPECT_THAT(state->SequenceLength("b"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("\"b\"")));
  EXPECT_THAT(state->AppendTokens("a", 5),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("needs 12 frames, 6 free")));
  EXPECT_THAT(state->AppendTokens("zz", 1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("zz")));
  EXPECT_THAT(state->ApplyDecision("zz", 0, 4, {{0}, {0}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("zz")));
  EXPECT_THAT(state->ApplyDecision("a", 0, 5, {{0}, {0}}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("5 tokens")));
  EXPECT_THAT(state->ForkSequence("c", "zz", 0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("zz")));
  EXPECT_THAT(state->ForkSequence("a", "a", 0),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("\"a\"")));
  EXPECT_THAT(state->ForkSequence("c", "a", 2),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("prefix_pages")));
  EXPECT_THAT(state->ForkSequence("", "a", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sequence_id")));
  const PoolStats stats = state->Stats();
  EXPECT_EQ(stats.used_frames, 6);
  EXPECT_EQ(stats.sequences_active, 1);
  EXPECT_EQ(stats.decisions_total, 0);
  EXPECT_THAT(state->CheckInvariants(), IsOk());
}

TEST(CacheStateTest, ForkedFramesOutliveTheParent) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(FrameLayout::kLayer, 32)));
  ASSERT_THAT(state->OpenSequence("p", 8), IsOk());  // 2 pages x 3 layers
  ASSERT_THAT(state->ForkSequence("c", "p", 1), IsOk());
  EXPECT_EQ(state->Stats().used_frames, 6);
  ENTROKV_ASSERT_OK_AND_ASSIGN(SequenceInfo child, state->GetSequence("c"));
  EXPECT_EQ(child.length, 4);
  ASSERT_THAT(state->CloseSequence("p"), IsOk());
  EXPECT_EQ(state->Stats().used_frames, 3);  // page 0 of each layer, still held by the child
  EXPECT_THAT(state->CheckInvariants(), IsOk());
  const std::vector<SequenceInfo> list = state->ListSequences(false);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].id, "c");
  EXPECT_TRUE(list[0].block_tables.empty());
}

TEST(CacheStateTest, HeadWeightsAreCachedPerLayerAndInheritedByForks) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(FrameLayout::kGroup, 64)));
  ASSERT_THAT(state->OpenSequence("p", 4), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::vector<double> none, state->GetHeadWeights("p", 1));
  EXPECT_TRUE(none.empty());
  const std::vector<double> weights = {0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.0, 0.0};
  ASSERT_THAT(state->SetHeadWeights("p", 1, weights), IsOk());
  EXPECT_THAT(state->SetHeadWeights("p", 1, {1.0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("query heads")));
  EXPECT_THAT(state->SetHeadWeights("p", 3, weights),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("layer 3")));
  EXPECT_THAT(state->SetHeadWeights("zz", 0, weights),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("zz")));
  EXPECT_THAT(state->GetHeadWeights("p", -1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("layer -1")));
  ASSERT_THAT(state->ForkSequence("c", "p", 1), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::vector<double> inherited, state->GetHeadWeights("c", 1));
  EXPECT_EQ(inherited, weights);
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::vector<double> other_layer, state->GetHeadWeights("c", 0));
  EXPECT_TRUE(other_layer.empty());
}

TEST(CacheStateTest, ListIsSortedById) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(FrameLayout::kGroup, 64)));
  for (const char* id : {"m", "b", "x", "a"}) ASSERT_THAT(state->OpenSequence(id, 1), IsOk());
  std::vector<std::string> ids;
  for (const SequenceInfo& info : state->ListSequences(true)) {
    ids.push_back(info.id);
    EXPECT_EQ(info.block_tables.size(), 3u);
  }
  EXPECT_THAT(ids, ElementsAre("a", "b", "m", "x"));
}

TEST(CacheStateTest, ConcurrentCallersKeepTheInvariant) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(FrameLayout::kGroup, 600)));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&state, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string id = absl::StrCat("t", t, "-", i % 5);
        (void)state->OpenSequence(id, i % 9);
        (void)state->AppendTokens(id, 3);
        if (auto info = state->GetSequence(id); info.ok()) {
          (void)state->ApplyDecision(id, i % 3, info->length, {{0}, {}});
        }
        if (i % 3 == 0) (void)state->CloseSequence(id);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_THAT(state->CheckInvariants(), IsOk());
  for (const SequenceInfo& info : state->ListSequences(false)) {
    ASSERT_THAT(state->CloseSequence(info.id), IsOk());
  }
  EXPECT_EQ(state->Stats().used_frames, 0);
  EXPECT_THAT(state->CheckInvariants(), IsOk());
}

}  // namespace
}  // namespace entrokv

namespace entrokv {
namespace {

// The accounted bookkeeping is the pool's plus each sequence's, follows every
// open, append, fork and close, and comes back to the pool's alone.
TEST(CacheStateTest, BookkeepingIsAccountedForEverySequence) {
  CacheOptions options = Options(FrameLayout::kGroup, 256);
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  const int64_t pool = PagePool::BookkeepingBytes(256, options.geometry.layers);
  EXPECT_EQ(state->Stats().bookkeeping_bytes, pool);
  ASSERT_THAT(state->OpenSequence("a", 0), IsOk());
  EXPECT_EQ(state->Stats().bookkeeping_bytes,
            pool + Sequence::BookkeepingBytes(options.geometry, 1, 0));
  ASSERT_THAT(state->AppendTokens("a", 17).status(), IsOk());  // 5 pages
  const int64_t grown = state->Stats().bookkeeping_bytes;
  EXPECT_EQ(grown, pool + Sequence::BookkeepingBytes(options.geometry, 1, 5));
  ASSERT_THAT(state->ForkSequence("bb", "a", 2), IsOk());
  EXPECT_EQ(state->Stats().bookkeeping_bytes,
            grown + Sequence::BookkeepingBytes(options.geometry, 2, 2));
  ASSERT_THAT(state->CloseSequence("a"), IsOk());
  ASSERT_THAT(state->CloseSequence("bb"), IsOk());
  EXPECT_EQ(state->Stats().bookkeeping_bytes, pool);
}

// A model of 4096 layers x 4096 groups used to make every OpenSequence(0) allocate
// ~390 MB of empty block tables. Such a geometry is refused before any arena exists.
TEST(CacheStateTest, CheckLimitsRefusesGeometriesWhoseEmptySequenceIsTooLarge) {
  CacheOptions options;
  options.geometry = {.layers = 4096,
                      .query_heads = 4096,
                      .kv_groups = 4096,
                      .head_dim = 1,
                      .page_size = 1,
                      .element_bytes = 1};
  options.capacity_bytes = 1 << 20;
  options.limits.max_sequence_bookkeeping_bytes = int64_t{256} << 20;
  EXPECT_GT(Sequence::BookkeepingBytes(options.geometry, 1, 0), int64_t{390} << 20);
  EXPECT_THAT(
      CacheState::CheckLimits(options),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_sequence_bookkeeping_bytes")));
  options.limits = {.max_model_bookkeeping_bytes = int64_t{100} << 20};
  EXPECT_THAT(CacheState::CheckLimits(options), StatusIs(absl::StatusCode::kResourceExhausted,
                                                         HasSubstr("max_model_bookkeeping_bytes")));
  EXPECT_THAT(CacheState::CheckLimits(Options(FrameLayout::kGroup, 8)), IsOk());
}

// One sequence's block tables and the model's total are bounded; a call past
// either is refused naming it, and nothing changes.
TEST(CacheStateTest, BookkeepingLimitsRefuseGrowthAndChangeNothing) {
  CacheOptions options = Options(FrameLayout::kGroup, 4096);
  const ModelGeometry& geometry = options.geometry;
  // Room for 100 table entries, no more: 3 layers x 2 groups x 4 bytes each.
  options.limits.max_sequence_bookkeeping_bytes = Sequence::BookkeepingBytes(geometry, 1, 100);
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  ASSERT_THAT(state->OpenSequence("a", 4 * 60), IsOk());           // 60 pages
  ASSERT_THAT(state->AppendTokens("a", 4 * 40).status(), IsOk());  // 100: the limit exactly
  const PoolStats before = state->Stats();
  EXPECT_THAT(state->AppendTokens("a", 1), StatusIs(absl::StatusCode::kResourceExhausted,
                                                    HasSubstr("max_sequence_bookkeeping_bytes")));
  EXPECT_THAT(
      state->OpenSequence("b", 4 * 101),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_sequence_bookkeeping_bytes")));
  EXPECT_EQ(state->Stats().bookkeeping_bytes, before.bookkeeping_bytes);
  EXPECT_EQ(state->Stats().used_frames, before.used_frames);
  EXPECT_EQ(state->Stats().sequences_active, 1);

  // The model's bound: the pool and room for two empty sequences.
  options.limits = {.max_model_bookkeeping_bytes =
                        PagePool::BookkeepingBytes(4096, geometry.layers) +
                        2 * Sequence::BookkeepingBytes(geometry, 1, 0)};
  ENTROKV_ASSERT_OK_AND_ASSIGN(state, CacheState::Create(options));
  ASSERT_THAT(state->OpenSequence("a", 0), IsOk());
  ASSERT_THAT(state->OpenSequence("b", 0), IsOk());
  const PoolStats full = state->Stats();
  EXPECT_THAT(state->OpenSequence("c", 0), StatusIs(absl::StatusCode::kResourceExhausted,
                                                    HasSubstr("max_model_bookkeeping_bytes")));
  EXPECT_THAT(
      state->AppendTokens("a", 1).status(),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_model_bookkeeping_bytes")));
  EXPECT_THAT(state->ForkSequence("c", "a", 0), StatusIs(absl::StatusCode::kResourceExhausted,
                                                         HasSubstr("max_model_bookkeeping_bytes")));
  EXPECT_EQ(state->Stats().bookkeeping_bytes, full.bookkeeping_bytes);
  EXPECT_EQ(state->Stats().sequences_active, 2);
  EXPECT_THAT(state->CheckInvariants(), IsOk());
}

// Speculative decoding: a truncation gives back the frames and the running sums' bookkeeping of
// the tokens it drops; one past the length is refused naming tokens and changes nothing.
TEST(CacheStateTest, TruncateSequenceGivesBackFramesAndBookkeeping) {
  CacheOptions options = Options(FrameLayout::kGroup, 256);
  BookkeepingBudget daemon(0);
  options.limits.daemon = &daemon;
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  ASSERT_THAT(state->OpenSequence("a", 10), IsOk());  // 3 pages x 3 layers x 2 groups
  std::vector<LayerKeep> keep(1);
  keep[0].layer = 1;
  keep[0].kept_pages_per_group = {{0, 1, 2}, {0, 1, 2}};
  keep[0].running_sum = std::vector<float>(8 * 10, 0.5f);
  ASSERT_THAT(state->ApplyDecisions("a", 10, std::move(keep)).status(), IsOk());
  const PoolStats before = state->Stats();
  EXPECT_EQ(before.used_frames, 18);
  EXPECT_EQ(daemon.used_bytes(), before.bookkeeping_bytes);

  EXPECT_THAT(state->TruncateSequence("a", 11),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("tokens: 11")));
  EXPECT_THAT(state->TruncateSequence("nope", 1),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_EQ(state->Stats().used_frames, before.used_frames);
  EXPECT_EQ(state->Stats().bookkeeping_bytes, before.bookkeeping_bytes);

  ENTROKV_ASSERT_OK_AND_ASSIGN(const TruncateResult cut, state->TruncateSequence("a", 7));
  EXPECT_EQ(cut.length, 3);
  EXPECT_EQ(cut.freed_frames.size(), 12u);  // pages 1 and 2 of 3 layers x 2 groups
  EXPECT_EQ(state->Stats().used_frames, 6);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const std::vector<float> sum, state->RunningSum("a", 1));
  EXPECT_EQ(sum.size(), 8u * 3);
  EXPECT_EQ(state->Stats().bookkeeping_bytes,
            before.bookkeeping_bytes - static_cast<int64_t>(8 * 7 * sizeof(float)));
  EXPECT_EQ(daemon.used_bytes(), state->Stats().bookkeeping_bytes);
  EXPECT_THAT(state->CheckInvariants(), IsOk());
  ASSERT_THAT(state->CloseSequence("a"), IsOk());
  EXPECT_EQ(state->Stats().bookkeeping_bytes, PagePool::BookkeepingBytes(256, 3));
}

// A chunk's running sum is bookkeeping like the block tables: one that would pass a bound is
// refused with the whole decision (nothing evicted, no sum kept).
TEST(CacheStateTest, RunningSumsAreBoundedWithTheirDecision) {
  CacheOptions options = Options(FrameLayout::kGroup, 4096);
  // Room for the 5 pages' tables and one layer's sum (the 3 layers' vector headers with it).
  options.limits.max_sequence_bookkeeping_bytes =
      Sequence::BookkeepingBytes(options.geometry, 1, 5) +
      static_cast<int64_t>(3 * sizeof(std::vector<float>) + 8 * 20 * sizeof(float));
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  ASSERT_THAT(state->OpenSequence("a", 20), IsOk());  // 5 pages
  const PoolStats before = state->Stats();
  std::vector<LayerKeep> two(2);
  for (int layer = 0; layer < 2; ++layer) {
    two[layer].layer = layer;
    two[layer].kept_pages_per_group = {{0}, {0}};
    two[layer].running_sum = std::vector<float>(8 * 20, 1.0f);
  }
  EXPECT_THAT(
      state->ApplyDecisions("a", 20, two),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_sequence_bookkeeping_bytes")));
  EXPECT_EQ(state->Stats().used_frames, before.used_frames);
  EXPECT_EQ(state->Stats().bookkeeping_bytes, before.bookkeeping_bytes);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const std::vector<float> none, state->RunningSum("a", 0));
  EXPECT_TRUE(none.empty());
  two.pop_back();  // one layer's sum fits
  ASSERT_THAT(state->ApplyDecisions("a", 20, two).status(), IsOk());
  EXPECT_LT(state->Stats().used_frames, before.used_frames);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const std::vector<float> kept, state->RunningSum("a", 0));
  EXPECT_EQ(kept.size(), 8u * 20);
  EXPECT_THAT(state->CheckInvariants(), IsOk());
}

// The sequences-per-model bound used to be checked outside the pool's lock, so opens
// racing each other could pass it together. Under the lock exactly the bound gets in.
TEST(CacheStateTest, ConcurrentOpensNeverPassTheSequenceBound) {
  CacheOptions options = Options(FrameLayout::kGroup, 1024);
  options.limits.max_sequences_per_model = 5;
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  constexpr int kThreads = 8;
  constexpr int kOpensPerThread = 20;
  std::atomic<int> opened{0};
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOpensPerThread; ++i) {
        const absl::Status status = state->OpenSequence(absl::StrCat("s", t, "-", i), 4);
        if (status.ok()) ++opened;
        if (absl::IsResourceExhausted(status)) {
          EXPECT_THAT(status.message(), HasSubstr("max_sequences_per_model"));
          ++refused;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(opened.load(), 5);
  EXPECT_EQ(refused.load(), kThreads * kOpensPerThread - 5);
  EXPECT_EQ(state->Stats().sequences_active, 5);
  const std::string parent = state->ListSequences(false).front().id;  // whichever got in
  EXPECT_THAT(state->ForkSequence("fork", parent, 0),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_sequences_per_model")));
  EXPECT_THAT(state->CheckInvariants(), IsOk());
}

std::vector<std::string> Ids(const SequencePage& page) {
  std::vector<std::string> ids;
  for (const SequenceInfo& info : page.sequences) ids.push_back(info.id);
  return ids;
}

// ListSequences used to build every sequence's block tables at once. A page describes
// only its own sequences; resuming after the last id is stable under opens and closes.
TEST(CacheStateTest, ListSequencePagesResumeAfterTheLastIdListed) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(FrameLayout::kGroup, 1024)));
  for (const char* id : {"d", "a", "e", "c", "b"}) ASSERT_THAT(state->OpenSequence(id, 4), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(SequencePage page,
                               state->ListSequencePage({.after_id = "", .max_sequences = 2}));
  EXPECT_THAT(Ids(page), ElementsAre("a", "b"));
  EXPECT_TRUE(page.more);
  // Between pages: "a" closes (already listed), "bb" opens after the cursor, "c" closes.
  ASSERT_THAT(state->CloseSequence("a"), IsOk());
  ASSERT_THAT(state->CloseSequence("c"), IsOk());
  ASSERT_THAT(state->OpenSequence("bb", 4), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(page,
                               state->ListSequencePage({.after_id = "b", .max_sequences = 2}));
  EXPECT_THAT(Ids(page), ElementsAre("bb", "d"));
  EXPECT_TRUE(page.more);
  ENTROKV_ASSERT_OK_AND_ASSIGN(page,
                               state->ListSequencePage({.after_id = "d", .max_sequences = 2}));
  EXPECT_THAT(Ids(page), ElementsAre("e"));
  EXPECT_FALSE(page.more);
  EXPECT_TRUE(page.sequences[0].block_tables.empty());
  EXPECT_THAT(state->ListSequencePage({.after_id = "", .max_sequences = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_sequences")));
}

TEST(CacheStateTest, ListSequencePagesAreBoundedByTableEntries) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(FrameLayout::kGroup, 1024)));
  // 3 layers x 2 groups: 6 x (1 + pages) entries each.
  ASSERT_THAT(state->OpenSequence("a", 4 * 9), IsOk());   // 60 entries
  ASSERT_THAT(state->OpenSequence("b", 4 * 9), IsOk());   // 60
  ASSERT_THAT(state->OpenSequence("c", 4 * 19), IsOk());  // 120
  ListOptions list{
      .after_id = "", .max_sequences = 10, .with_block_tables = true, .max_table_entries = 120};
  ENTROKV_ASSERT_OK_AND_ASSIGN(SequencePage page, state->ListSequencePage(list));
  EXPECT_THAT(Ids(page), ElementsAre("a", "b"));
  EXPECT_TRUE(page.more);
  ASSERT_EQ(page.sequences[0].block_tables.size(), 3u);
  EXPECT_EQ(page.sequences[0].block_tables[0][0].size(), 9u);
  list.after_id = "b";
  ENTROKV_ASSERT_OK_AND_ASSIGN(page, state->ListSequencePage(list));
  EXPECT_THAT(Ids(page), ElementsAre("c"));
  EXPECT_FALSE(page.more);
  list.max_table_entries = 119;
  EXPECT_THAT(state->ListSequencePage(list),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("\"c\" alone")));
  list.with_block_tables = false;  // without tables the entries do not count
  EXPECT_THAT(state->ListSequencePage(list), IsOk());
}

// Every model of a daemon reserves its bookkeeping in one budget before it allocates: a pool
// that does not fit beside the others is refused before its arena exists, a sequence that does
// not fit is refused with nothing changed, and closing and destroying give the bytes back.
TEST(CacheStateTest, ModelsShareTheDaemonsBookkeepingBudget) {
  CacheOptions options = Options(FrameLayout::kGroup, 64);
  const int64_t pool_bytes = PagePool::BookkeepingBytes(64, options.geometry.layers);
  BookkeepingBudget budget(2 * pool_bytes + 2000);
  options.limits.daemon = &budget;
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto first, CacheState::Create(options));
  EXPECT_EQ(budget.used_bytes(), pool_bytes);
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto second, CacheState::Create(options));
    EXPECT_EQ(budget.used_bytes(), 2 * pool_bytes);
    CacheOptions third = options;
    third.capacity_bytes *= 8;  // its 512 frames need more than the 2000 bytes left
    EXPECT_THAT(CacheState::Create(third),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_bookkeeping_bytes")));
    EXPECT_EQ(budget.used_bytes(), 2 * pool_bytes);
  }
  EXPECT_EQ(budget.used_bytes(), pool_bytes);  // the second's share came back
  budget.Force(pool_bytes);                    // someone else takes it again
  int opened = 0;
  absl::Status refused;
  while (refused.ok() && opened < 64) {
    refused = first->OpenSequence(absl::StrCat("s", opened), 4);
    if (refused.ok()) ++opened;
  }
  EXPECT_THAT(refused,
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_bookkeeping_bytes")));
  EXPECT_GT(opened, 0);
  EXPECT_EQ(first->Stats().sequences_active, opened);
  EXPECT_EQ(budget.used_bytes(), pool_bytes + first->Stats().bookkeeping_bytes);
  EXPECT_LE(budget.used_bytes(), budget.limit_bytes());
  for (int i = 0; i < opened; ++i) ASSERT_THAT(first->CloseSequence(absl::StrCat("s", i)), IsOk());
  EXPECT_EQ(budget.used_bytes(), 2 * pool_bytes);
  first.reset();
  EXPECT_EQ(budget.used_bytes(), pool_bytes);
  budget.Release(pool_bytes);
}

}  // namespace
}  // namespace entrokv
