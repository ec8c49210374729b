#include "core/pool/cache_state.h"

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
  EXPECT_THAT(state->ApplyDecisions("a", 9,
                                    {{.layer = 0, .kept_pages_per_group = {{2}, {2}}},
                                     {.layer = 1, .kept_pages_per_group = {{2}, {2}}},
                                     {.layer = 2, .kept_pages_per_group = {{7}, {2}}}}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("layer 2")));
  EXPECT_THAT(state->ApplyDecisions("a", 9,
                                    {{.layer = 1, .kept_pages_per_group = {{2}, {2}}},
                                     {.layer = 1, .kept_pages_per_group = {{2}, {2}}}}),
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
                            {{.layer = 2, .kept_pages_per_group = {{2}, {0, 2}}},
                             {.layer = 0, .kept_pages_per_group = {{}, {1}}}}));
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
