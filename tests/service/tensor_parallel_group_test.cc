// Tensor-parallel models in the GROUP frame layout through the real daemon over loopback. A
// group-layout frame is one KV group's page, so it lives whole in the arena of the rank that
// holds the group: each rank has its own frames and free list, and each rank decides its own
// groups alone, never waiting for the others. Host arenas stand in for the devices.
#include <cstring>
#include <string>
#include <vector>

#include "core/pool/arena.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/tensor_parallel_fixture.h"

namespace entrokv::service::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr v1::FrameLayout kGroupLayout = v1::FRAME_LAYOUT_GROUP;

// Every frame a block table names lies in the arena of the rank holding its group.
void ExpectFramesInTheirRanksArena(const v1::PoolInfo& pool, const v1::SequenceInfo& sequence) {
  const int ranks = pool.ranks_size();
  for (const v1::BlockTable& table : sequence.block_tables()) {
    const v1::RankArena& arena = pool.ranks(table.group() / (kTpGroups / ranks));
    for (const int32_t frame : table.frames()) {
      if (frame < 0) continue;
      EXPECT_GE(frame, arena.first_frame()) << "group " << table.group();
      EXPECT_LT(frame, arena.first_frame() + arena.frames()) << "group " << table.group();
    }
  }
}

// Which pages each block table still holds.
std::vector<std::vector<bool>> LivePages(const v1::SequenceInfo& sequence) {
  std::vector<std::vector<bool>> live;
  for (const v1::BlockTable& table : sequence.block_tables()) {
    std::vector<bool>& pages = live.emplace_back();
    for (const int32_t frame : table.frames()) pages.push_back(frame >= 0);
  }
  return live;
}

class TensorParallelGroupTest : public TensorParallelTest {
 protected:
  grpc::Status Decide(const v1::DecideRequest& request, v1::DecideResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->Decide(&context, request, response);
  }

  grpc::Status Append(const std::string& model, const std::string& sequence, int64_t tokens,
                      v1::AppendTokensResponse* response = nullptr) {
    grpc::ClientContext context;
    v1::AppendTokensRequest request;
    request.set_model_id(model);
    request.set_sequence_id(sequence);
    request.set_tokens(tokens);
    v1::AppendTokensResponse ignored;
    return stub_->AppendTokens(&context, request, response != nullptr ? response : &ignored);
  }

  // Rank `rank`'s decision (every rank's rows with rank -1) equals the one-pool decision
  // `reference` on the rank's groups, which it names by their model-wide numbers.
  static void ExpectRankDecision(const v1::DecideResponse& reference,
                                 const v1::DecideResponse& mine, int ranks, int rank) {
    const int groups = kTpGroups / ranks;
    const int first = rank < 0 ? 0 : rank * groups;
    ASSERT_EQ(mine.layers_size(), reference.layers_size());
    for (int layer = 0; layer < mine.layers_size(); ++layer) {
      const v1::LayerDecision& decided = mine.layers(layer);
      EXPECT_EQ(decided.quota_pages(), reference.layers(layer).quota_pages());
      ASSERT_EQ(decided.groups_size(), groups);
      for (int g = 0; g < groups; ++g) {
        const v1::GroupDecision& expected = reference.layers(layer).groups(first + g);
        EXPECT_EQ(decided.groups(g).group(), first + g);
        EXPECT_THAT(decided.groups(g).kept_pages(), ElementsAreArray(expected.kept_pages()))
            << "layer " << layer << " group " << first + g;
        EXPECT_THAT(decided.groups(g).evicted_pages(), ElementsAreArray(expected.evicted_pages()))
            << "layer " << layer << " group " << first + g;
      }
    }
  }
};

// Each rank decides its own groups alone, one rank after another (a rank that waited for the
// others would fail at --rank_wait_ms): every group keeps the pages the one-pool decision of
// the same model keeps, so the same frames stay live and the budget is exact over the model,
// for t = 1, 2, 4, 8 and an explicit and a planned budget. A rank's decision leaves the other
// ranks' groups as they were.
TEST_F(TensorParallelGroupTest, EachRankDecidesItsGroupsAloneAsOnePoolWould) {
  int case_index = 0;
  for (const int ranks : {1, 2, 4, 8}) {
    for (const bool fraction : {false, true}) {
      SCOPED_TRACE(absl::StrCat("t=", ranks, " fraction=", fraction));
      const std::string single = absl::StrCat("single", case_index);
      const std::string sharded = absl::StrCat("tp", case_index);
      ++case_index;
      ASSERT_TRUE(RegisterStatus(TpRequest(single, 1, kGroupLayout)).ok());
      v1::RegisterModelResponse registered;
      ASSERT_TRUE(RegisterStatus(TpRequest(sharded, ranks, kGroupLayout), &registered).ok());
      const v1::PoolInfo& pool = registered.pool();
      ASSERT_EQ(pool.ranks_size(), ranks);
      for (int rank = 0; rank < ranks; ++rank) {
        const v1::RankArena& arena = pool.ranks(rank);
        EXPECT_EQ(arena.frame_bytes(), pool.frame_bytes());  // a group's frame is not split
        EXPECT_EQ(arena.frames(), pool.capacity_frames() / ranks);
        EXPECT_EQ(arena.first_frame(), rank * arena.frames());
      }
      Open(single, "s", kTokens);
      Open(sharded, "s", kTokens);
      ExpectFramesInTheirRanksArena(pool, Sequence(sharded, "s"));
      const v1::Budget budget = ExplicitOrPlanned(fraction);
      const std::vector<std::vector<float>> values = Statistics(300 + case_index);
      v1::DecideResponse reference;
      ASSERT_TRUE(
          Decide(RankRequest(single, values, 1, -1, budget, v1::SELECTION_SCOPE_GROUP), &reference)
              .ok());
      const std::vector<std::vector<bool>> full = LivePages(Sequence(sharded, "s"));
      for (int rank = 0; rank < ranks; ++rank) {
        const int which = ranks == 1 ? -1 : rank;
        v1::DecideResponse mine;
        const grpc::Status status = Decide(
            RankRequest(sharded, values, ranks, which, budget, v1::SELECTION_SCOPE_GROUP), &mine);
        ASSERT_TRUE(status.ok()) << "rank " << rank << ": " << status.error_message();
        ExpectRankDecision(reference, mine, ranks, which);
        // The ranks still to decide hold every page.
        const v1::SequenceInfo now = Sequence(sharded, "s");
        const std::vector<std::vector<bool>> live = LivePages(now);
        for (int t = 0; t < now.block_tables_size(); ++t) {
          const int group = now.block_tables(t).group();
          if (group / (kTpGroups / ranks) <= rank) continue;
          EXPECT_EQ(live[static_cast<size_t>(t)], full[static_cast<size_t>(t)])
              << "group " << group << " changed before its rank decided";
        }
      }
      EXPECT_EQ(Stats(sharded).used_frames(), Stats(single).used_frames());
      EXPECT_EQ(Stats(sharded).pages_evicted_total(), Stats(single).pages_evicted_total());
      EXPECT_EQ(LivePages(Sequence(sharded, "s")), LivePages(Sequence(single, "s")));
      ExpectFramesInTheirRanksArena(pool, Sequence(sharded, "s"));
      ExpectInvariants(sharded);
    }
  }
}

// Each rank's own DecideStream with `rank` set is decided alone per layer, as its Decide is.
TEST_F(TensorParallelGroupTest, EachRanksStreamIsDecidedAlone) {
  constexpr int kRanks = 4;
  ASSERT_TRUE(RegisterStatus(TpRequest("single", 1, kGroupLayout)).ok());
  ASSERT_TRUE(RegisterStatus(TpRequest("tp", kRanks, kGroupLayout)).ok());
  Open("single", "s", kTokens);
  Open("tp", "s", kTokens);
  v1::Budget budget;
  budget.set_pages_per_group(3);
  const std::vector<std::vector<float>> values = Statistics(77);
  v1::DecideResponse reference;
  ASSERT_TRUE(
      Decide(RankRequest("single", values, 1, -1, budget, v1::SELECTION_SCOPE_GROUP), &reference)
          .ok());
  std::vector<v1::DecideRequest> each;
  for (int rank = 0; rank < kRanks; ++rank) {
    each.push_back(RankRequest("tp", values, kRanks, rank, budget, v1::SELECTION_SCOPE_GROUP));
  }
  const auto streamed = StreamRanks(each);
  for (int rank = 0; rank < kRanks; ++rank) {
    const auto& [status, layers] = streamed[static_cast<size_t>(rank)];
    ASSERT_TRUE(status.ok()) << "rank " << rank << ": " << status.error_message();
    v1::DecideResponse mine;
    for (const v1::LayerDecision& layer : layers) *mine.add_layers() = layer;
    ExpectRankDecision(reference, mine, kRanks, rank);
  }
  EXPECT_EQ(LivePages(Sequence("tp", "s")), LivePages(Sequence("single", "s")));
  ExpectInvariants("tp");
}

// A chunked prefill whose ranks decide each chunk alone, in either order, keeps the pages the
// one-pool model keeps: each rank's running sum holds its own heads' rows. Prefill weights
// cached by each rank serve that rank's decode-time decisions, and a rank that has cached none
// is told so.
TEST_F(TensorParallelGroupTest, ChunksAndCachedWeightsFollowEachRanksHeads) {
  constexpr int kRanks = 2;
  ASSERT_TRUE(RegisterStatus(TpRequest("single", 1, kGroupLayout)).ok());
  ASSERT_TRUE(RegisterStatus(TpRequest("tp", kRanks, kGroupLayout)).ok());
  v1::Budget budget;
  budget.set_pages_per_group(3);
  // Two chunks: 21 tokens, then 16 more (kTokens in all), h2o on the running sums.
  const auto chunk = [&](const std::string& model, const std::vector<std::vector<float>>& all,
                         int64_t tokens, int ranks, int rank) {
    v1::DecideRequest request;
    request.set_model_id(model);
    request.set_sequence_id("s");
    *request.mutable_budget() = budget;
    request.mutable_policy()->set_name("h2o");
    request.mutable_policy()->set_scope(v1::SELECTION_SCOPE_GROUP);
    if (rank >= 0) request.set_rank(rank);
    const int heads = kTpHeads / ranks;
    const int first = rank < 0 ? 0 : rank * heads;
    for (int layer = 0; layer < kTpLayers; ++layer) {
      const std::vector<float>& rows = all[static_cast<size_t>(layer)];
      std::vector<float> mine(rows.begin() + first * tokens,
                              rows.begin() + (first + heads) * tokens);
      v1::LayerStatistic* in = request.add_layers();
      in->set_layer(layer);
      in->set_accumulate(true);
      *in->mutable_statistic() = BytesStatistic(mine, heads, tokens, v1::DTYPE_FLOAT32);
      in->mutable_statistic()->set_kind(v1::STATISTIC_KIND_ACCUMULATED);
    }
    return request;
  };
  std::vector<std::vector<float>> first_chunk;
  std::vector<std::vector<float>> second_chunk;
  for (int layer = 0; layer < kTpLayers; ++layer) {
    first_chunk.push_back(RandomStatistic(kTpHeads, 21, 500 + layer));
    second_chunk.push_back(RandomStatistic(kTpHeads, kTokens, 600 + layer));
  }
  Open("single", "s", 21);
  Open("tp", "s", 21);
  v1::DecideResponse reference;
  v1::DecideResponse mine;
  ASSERT_TRUE(Decide(chunk("single", first_chunk, 21, 1, -1), &reference).ok());
  for (const int rank : {0, 1}) {
    const grpc::Status status = Decide(chunk("tp", first_chunk, 21, kRanks, rank), &mine);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ExpectRankDecision(reference, mine, kRanks, rank);
  }
  ASSERT_TRUE(Append("single", "s", kTokens - 21).ok());
  ASSERT_TRUE(Append("tp", "s", kTokens - 21).ok());
  ASSERT_TRUE(Decide(chunk("single", second_chunk, kTokens, 1, -1), &reference).ok());
  for (const int rank : {1, 0}) {  // the other order
    const grpc::Status status = Decide(chunk("tp", second_chunk, kTokens, kRanks, rank), &mine);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ExpectRankDecision(reference, mine, kRanks, rank);
  }
  EXPECT_EQ(LivePages(Sequence("tp", "s")), LivePages(Sequence("single", "s")));

  // page_entrokv at prefill caches its head weights; decode-time decisions reuse them.
  Open("single", "w", kTokens);
  Open("tp", "w", kTokens);
  const std::vector<std::vector<float>> prefill = Statistics(900);
  const std::vector<std::vector<float>> decode = Statistics(901);
  const auto named = [](v1::DecideRequest request, const std::string& sequence, bool cached) {
    request.set_sequence_id(sequence);
    request.set_use_cached_weights(cached);
    return request;
  };
  budget.set_pages_per_group(6);
  ASSERT_TRUE(Decide(named(RankRequest("single", prefill, 1, -1, budget, v1::SELECTION_SCOPE_GROUP),
                           "w", false),
                     &reference)
                  .ok());
  ASSERT_TRUE(Decide(named(RankRequest("tp", prefill, kRanks, 0, budget, v1::SELECTION_SCOPE_GROUP),
                           "w", false),
                     &mine)
                  .ok());
  budget.set_pages_per_group(4);
  // Rank 1 has cached nothing yet: its rows of the weights are not there.
  const grpc::Status none = Decide(
      named(RankRequest("tp", decode, kRanks, 1, budget, v1::SELECTION_SCOPE_GROUP), "w", true),
      &mine);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(none.error_message(), HasSubstr("use_cached_weights"));
  budget.set_pages_per_group(6);
  ASSERT_TRUE(Decide(named(RankRequest("tp", prefill, kRanks, 1, budget, v1::SELECTION_SCOPE_GROUP),
                           "w", false),
                     &mine)
                  .ok());
  budget.set_pages_per_group(4);
  ASSERT_TRUE(Decide(named(RankRequest("single", decode, 1, -1, budget, v1::SELECTION_SCOPE_GROUP),
                           "w", true),
                     &reference)
                  .ok());
  for (const int rank : {0, 1}) {
    const grpc::Status status =
        Decide(named(RankRequest("tp", decode, kRanks, rank, budget, v1::SELECTION_SCOPE_GROUP),
                     "w", true),
               &mine);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ExpectRankDecision(reference, mine, kRanks, rank);
  }
  EXPECT_EQ(LivePages(Sequence("tp", "w")), LivePages(Sequence("single", "w")));
  ExpectInvariants("tp");
}

// Copy-on-write copies a group's frame within its rank's arena, and swapping out and back
// keeps every group's bytes in its rank's arena.
TEST_F(TensorParallelGroupTest, CopiesAndSwapsStayInEachRanksArena) {
  v1::RegisterModelResponse registered;
  ASSERT_TRUE(RegisterStatus(TpRequest("m", 2, kGroupLayout), &registered).ok());
  const v1::PoolInfo& pool = registered.pool();
  const std::vector<std::unique_ptr<HostArenaMapping>> arenas = MapRanks(pool);
  ASSERT_EQ(arenas.size(), 2u);
  for (const auto& arena : arenas) ASSERT_NE(arena, nullptr);
  const int64_t frame_bytes = static_cast<int64_t>(pool.frame_bytes());
  // Where a group's frame is, as its rank's worker finds it.
  const auto bytes_of = [&](int group, int32_t frame) {
    const v1::RankArena& arena = pool.ranks(group / (kTpGroups / 2));
    EXPECT_GE(frame, arena.first_frame());
    EXPECT_LT(frame, arena.first_frame() + arena.frames());
    return static_cast<char*>(arenas[static_cast<size_t>(arena.rank())]->data()) +
           (frame - arena.first_frame()) * frame_bytes;
  };
  const auto mark = [](const v1::FrameAssignment& frame) {
    return static_cast<char>(frame.layer() * 32 + frame.group() * 3 + frame.page() + 1);
  };
  v1::OpenSequenceResponse opened;
  ASSERT_TRUE(OpenFrames("m", "parent", 6, &opened).ok());  // one full page and a tail of 2 tokens
  ASSERT_EQ(opened.new_frames_size(), 2 * kTpLayers * kTpGroups);
  for (const v1::FrameAssignment& frame : opened.new_frames()) {
    std::memset(bytes_of(frame.group(), frame.frame()), mark(frame),
                static_cast<size_t>(frame_bytes));
  }
  // A fork sharing both pages; its first append copies every group's shared tail page.
  ASSERT_TRUE(OpenFrames("m", "child", 0, &opened, "parent", 2).ok());
  v1::AppendTokensResponse appended;
  ASSERT_TRUE(Append("m", "child", 1, &appended).ok());
  ASSERT_EQ(appended.new_frames_size(), kTpLayers * kTpGroups);
  for (const v1::FrameAssignment& copy : appended.new_frames()) {
    const char* bytes = bytes_of(copy.group(), copy.frame());
    EXPECT_EQ(bytes[0], mark(copy)) << "layer " << copy.layer() << " group " << copy.group();
    EXPECT_EQ(bytes[frame_bytes - 1], mark(copy));
  }
  // The parent out and back, after other frames overwrote every arena.
  grpc::ClientContext swap_context;
  v1::SwapOutSequenceRequest swap;
  swap.set_model_id("m");
  swap.set_sequence_id("parent");
  v1::SwapOutSequenceResponse swapped;
  ASSERT_TRUE(stub_->SwapOutSequence(&swap_context, swap, &swapped).ok());
  for (const auto& arena : arenas) {
    std::memset(arena->data(), 0, static_cast<size_t>(arena->bytes()));
  }
  grpc::ClientContext resume_context;
  v1::ResumeSequenceRequest resume;
  resume.set_model_id("m");
  resume.set_sequence_id("parent");
  v1::ResumeSequenceResponse resumed;
  ASSERT_TRUE(stub_->ResumeSequence(&resume_context, resume, &resumed).ok());
  ASSERT_EQ(resumed.new_frames_size(), 2 * kTpLayers * kTpGroups);
  for (const v1::FrameAssignment& frame : resumed.new_frames()) {
    const char* bytes = bytes_of(frame.group(), frame.frame());
    EXPECT_EQ(bytes[0], mark(frame))
        << "layer " << frame.layer() << " group " << frame.group() << " page " << frame.page();
    EXPECT_EQ(bytes[frame_bytes - 1], mark(frame));
  }
  ExpectInvariants("m");
}

// Growth takes the same frames from every rank, so the rank with the fewest free frames bounds
// it: an append that the pool's total would fit but one rank cannot is refused, changing
// nothing, and fits once that rank has decided too.
TEST_F(TensorParallelGroupTest, TheScarcestRankBoundsGrowth) {
  v1::RegisterModelRequest request = TpRequest("m", 2, kGroupLayout);
  const int64_t frame_bytes =
      2 * kPage * request.geometry().head_dim() * request.geometry().element_bytes();
  request.set_capacity_bytes(2 * 130 * frame_bytes);  // 130 frames per rank
  ASSERT_TRUE(RegisterStatus(request).ok());
  Open("m", "s", kTokens);  // 10 pages x 3 layers x 4 groups: 120 frames of each rank
  v1::Budget budget;
  budget.set_pages_per_group(2);
  const std::vector<std::vector<float>> values = Statistics(41);
  v1::DecideResponse decided;
  ASSERT_TRUE(
      Decide(RankRequest("m", values, 2, 0, budget, v1::SELECTION_SCOPE_GROUP), &decided).ok());
  const v1::PoolStats before = Stats("m");
  EXPECT_EQ(before.free_frames(), 106 + 10);  // rank 0 freed 96, rank 1 has 10
  // Four more tokens take 12 frames of each rank (a new page of every layer and group, and
  // the written tail of the groups that evicted it): rank 1 has 10.
  const grpc::Status refused = Append("m", "s", 4);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("rank"));
  EXPECT_EQ(Stats("m").used_frames(), before.used_frames());
  EXPECT_EQ(Sequence("m", "s").length_tokens(), kTokens);
  ASSERT_TRUE(
      Decide(RankRequest("m", values, 2, 1, budget, v1::SELECTION_SCOPE_GROUP), &decided).ok());
  ASSERT_TRUE(Append("m", "s", 4).ok());
  ExpectFramesInTheirRanksArena(
      [&] {
        grpc::ClientContext context;
        v1::ListModelsResponse models;
        EXPECT_TRUE(stub_->ListModels(&context, v1::ListModelsRequest(), &models).ok());
        return models.pools(0);
      }(),
      Sequence("m", "s"));
  ExpectInvariants("m");
}

// Requests a rank cannot decide alone name the field and change nothing.
TEST_F(TensorParallelGroupTest, BadGroupRankRequestsNameTheFieldAndApplyNothing) {
  ASSERT_TRUE(RegisterStatus(TpRequest("m", 2, kGroupLayout)).ok());
  Open("m", "s", kTokens);
  v1::Budget budget;
  budget.set_pages_per_group(3);
  const std::vector<std::vector<float>> values = Statistics(13);
  const v1::DecideRequest good = RankRequest("m", values, 2, 1, budget, v1::SELECTION_SCOPE_GROUP);
  std::vector<BadDecide> cases;
  v1::DecideRequest outside = good;
  outside.set_rank(2);
  cases.push_back({outside, "rank: 2 is outside [0, 2)"});
  // Every head's rows from one rank.
  v1::DecideRequest every_head = RankRequest("m", values, 1, -1, budget, v1::SELECTION_SCOPE_GROUP);
  every_head.set_rank(1);
  cases.push_back({every_head, "layers[0].statistic.query_heads: 16, rank 1's share has 8"});
  v1::DecideRequest layer_scope = good;
  layer_scope.mutable_policy()->set_scope(v1::SELECTION_SCOPE_LAYER);
  cases.push_back({layer_scope, "policy.scope"});
  v1::DecideRequest automatic = good;
  automatic.mutable_budget()->mutable_auto_budget()->set_floor_fraction(0.5);
  cases.push_back({automatic, "budget.auto_budget"});
  v1::DecideRequest moving = good;  // quotas cannot move to groups the rank does not hold
  moving.mutable_policy()->set_group_floor(0.5);
  cases.push_back({moving, "policy.group_floor"});
  ExpectRefusedChangingNothing("m", cases);
  EXPECT_EQ(Stats("m").pages_evicted_total(), 0);
}

}  // namespace
}  // namespace entrokv::service::testing
