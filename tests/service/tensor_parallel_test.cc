// Several devices and tensor-parallel models through the real daemon over loopback: a pool per
// device, one arena per rank, and the ranks' Decide calls gathered into one decision. Host
// arenas stand in for the devices (--host_devices), so everything here runs without a GPU.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/pool/arena.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/tensor_parallel_fixture.h"

namespace entrokv::service::testing {
namespace {

using ::testing::HasSubstr;

// The ranks' gathered decision is the one-pool decision of the same model: the same pages in
// every (layer, group), the same frames, the same budget, for t = 1, 2, 4, 8, both scopes and
// an explicit and a planned budget.
TEST_F(TensorParallelTest, RanksDecideTogetherAsOnePoolWould) {
  int case_index = 0;
  for (const int ranks : {1, 2, 4, 8}) {
    for (const v1::SelectionScope scope : {v1::SELECTION_SCOPE_LAYER, v1::SELECTION_SCOPE_GROUP}) {
      for (const bool fraction : {false, true}) {
        SCOPED_TRACE(absl::StrCat("t=", ranks, " scope=", scope, " fraction=", fraction));
        const std::string single = absl::StrCat("single", case_index);
        const std::string sharded = absl::StrCat("tp", case_index);
        ++case_index;
        ASSERT_TRUE(RegisterStatus(TpRequest(single, 1)).ok());
        v1::RegisterModelResponse registered;
        ASSERT_TRUE(RegisterStatus(TpRequest(sharded, ranks), &registered).ok());
        EXPECT_EQ(registered.pool().tensor_parallel_size(), ranks);
        Open(single, "s", kTokens);
        Open(sharded, "s", kTokens);
        const v1::Budget budget = ExplicitOrPlanned(fraction);
        const std::vector<std::vector<float>> values = Statistics(100 + case_index);
        std::vector<v1::DecideRequest> one = {RankRequest(single, values, 1, -1, budget, scope)};
        std::vector<v1::DecideRequest> each;
        for (int rank = 0; rank < ranks; ++rank) {
          each.push_back(
              RankRequest(sharded, values, ranks, ranks == 1 ? -1 : rank, budget, scope));
        }
        const auto alone = DecideRanks(one);
        const auto together = DecideRanks(each);
        ASSERT_TRUE(alone[0].first.ok()) << alone[0].first.error_message();
        for (int rank = 0; rank < ranks; ++rank) {
          const auto& [status, response] = together[static_cast<size_t>(rank)];
          ASSERT_TRUE(status.ok()) << "rank " << rank << ": " << status.error_message();
          ASSERT_EQ(response.layers_size(), kTpLayers);
          for (int layer = 0; layer < kTpLayers; ++layer) {
            const v1::LayerDecision& mine = response.layers(layer);
            const v1::LayerDecision& reference = alone[0].second.layers(layer);
            EXPECT_EQ(mine.quota_pages(), reference.quota_pages());
            ASSERT_EQ(mine.groups_size(), kTpGroups);
            for (int g = 0; g < kTpGroups; ++g) {
              EXPECT_THAT(mine.groups(g).kept_pages(),
                          ::testing::ElementsAreArray(reference.groups(g).kept_pages()))
                  << "layer " << layer << " group " << g;
              EXPECT_THAT(mine.groups(g).evicted_pages(),
                          ::testing::ElementsAreArray(reference.groups(g).evicted_pages()));
            }
          }
        }
        // The same frames are live: the budget is exact over the whole model.
        EXPECT_EQ(Stats(sharded).used_frames(), Stats(single).used_frames());
        EXPECT_EQ(Stats(sharded).pages_evicted_total(), Stats(single).pages_evicted_total());
        ExpectSameFrames(Sequence(single, "s"), Sequence(sharded, "s"));
        ExpectInvariants(sharded);
      }
    }
  }
}

TEST_F(TensorParallelTest, EachRankHasItsArenaOnItsDevice) {
  v1::RegisterModelRequest request = TpRequest("m", 4);
  request.add_devices(7);
  request.add_devices(5);
  request.add_devices(3);
  request.add_devices(1);
  v1::RegisterModelResponse response;
  ASSERT_TRUE(RegisterStatus(request, &response).ok());
  const v1::PoolInfo& pool = response.pool();
  ASSERT_EQ(pool.ranks_size(), 4);
  // A frame of the LAYER layout holds all 8 groups; each rank's slice two of them.
  EXPECT_EQ(pool.frame_bytes(), 8u * 2 * kPage * 8 * 2);
  std::vector<std::string> names;
  for (int rank = 0; rank < 4; ++rank) {
    const v1::RankArena& arena = pool.ranks(rank);
    EXPECT_EQ(arena.rank(), rank);
    EXPECT_EQ(arena.device(), 7 - 2 * rank);
    EXPECT_EQ(arena.frame_bytes(), pool.frame_bytes() / 4);
    ENTROKV_ASSERT_OK_AND_ASSIGN(std::unique_ptr<HostArenaMapping> mapping,
                                 HostArenaMapping::OpenByName(arena.arena_name()));
    EXPECT_EQ(mapping->bytes(), static_cast<int64_t>(pool.capacity_frames() * arena.frame_bytes()));
    names.push_back(arena.arena_name());
  }
  EXPECT_EQ(pool.arena_name(), names[0]);
  // Each rank's bytes on its device, for sum by (device) over every pool of the node.
  for (int rank = 0; rank < 4; ++rank) {
    const std::optional<prometheus::ClientMetric> series = FindSeries(
        *server_, "entrokv_pool_device_bytes",
        {{"pool", "m"}, {"rank", absl::StrCat(rank)}, {"device", absl::StrCat(7 - 2 * rank)}});
    ASSERT_TRUE(series.has_value()) << "rank " << rank;
    EXPECT_EQ(series->gauge.value, static_cast<double>(pool.capacity_bytes() / 4));
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end()) << "ranks share an arena";
  // One model on one device: a single rank, on the device it names.
  request = TpRequest("one", 1);
  request.add_devices(6);
  ASSERT_TRUE(RegisterStatus(request, &response).ok());
  ASSERT_EQ(response.pool().ranks_size(), 1);
  EXPECT_EQ(response.pool().ranks(0).device(), 6);
}

// A copy-on-write copies every rank's slice of the frame, each in its own arena.
TEST_F(TensorParallelTest, CopyOnWriteCopiesEveryRanksSlice) {
  v1::RegisterModelResponse registered;
  ASSERT_TRUE(RegisterStatus(TpRequest("m", 2), &registered).ok());
  const v1::PoolInfo& pool = registered.pool();
  v1::OpenSequenceResponse opened;
  ASSERT_TRUE(OpenFrames("m", "parent", 6, &opened).ok());  // one full page and a tail of 2 tokens
  const std::vector<std::unique_ptr<HostArenaMapping>> arenas = MapRanks(pool);
  ASSERT_EQ(arenas.size(), 2u);
  for (const auto& arena : arenas) ASSERT_NE(arena, nullptr);
  const int64_t slice = static_cast<int64_t>(pool.ranks(0).frame_bytes());
  int32_t tail = -1;
  for (const v1::FrameAssignment& frame : opened.new_frames()) {
    if (frame.layer() == 0 && frame.page() == 1) tail = frame.frame();
  }
  ASSERT_GE(tail, 0);
  for (int rank = 0; rank < 2; ++rank) {
    std::memset(static_cast<char*>(arenas[static_cast<size_t>(rank)]->data()) + tail * slice,
                0x30 + rank, static_cast<size_t>(slice));
  }
  // A fork sharing both pages; its first append copies the shared tail page.
  ASSERT_TRUE(OpenFrames("m", "child", 0, &opened, "parent", 2).ok());
  grpc::ClientContext append_context;
  v1::AppendTokensRequest append;
  append.set_model_id("m");
  append.set_sequence_id("child");
  append.set_tokens(1);
  v1::AppendTokensResponse appended;
  ASSERT_TRUE(stub_->AppendTokens(&append_context, append, &appended).ok());
  int32_t copy = -1;
  for (const v1::FrameAssignment& frame : appended.new_frames()) {
    if (frame.layer() == 0 && frame.page() == 1) copy = frame.frame();
  }
  ASSERT_GE(copy, 0);
  ASSERT_NE(copy, tail);
  for (int rank = 0; rank < 2; ++rank) {
    const char* bytes =
        static_cast<const char*>(arenas[static_cast<size_t>(rank)]->data()) + copy * slice;
    EXPECT_EQ(bytes[0], 0x30 + rank) << "rank " << rank;
    EXPECT_EQ(bytes[slice - 1], 0x30 + rank) << "rank " << rank;
  }
  ExpectInvariants("m");
}

// Swapping out and back keeps every rank's slice of every frame.
TEST_F(TensorParallelTest, SwapOutAndResumeKeepEveryRanksBytes) {
  v1::RegisterModelResponse registered;
  ASSERT_TRUE(RegisterStatus(TpRequest("m", 2), &registered).ok());
  const v1::PoolInfo& pool = registered.pool();
  const int64_t slice = static_cast<int64_t>(pool.ranks(0).frame_bytes());
  v1::OpenSequenceResponse opened;
  ASSERT_TRUE(OpenFrames("m", "s", 9, &opened).ok());
  const std::vector<std::unique_ptr<HostArenaMapping>> arenas = MapRanks(pool);
  ASSERT_EQ(arenas.size(), 2u);
  for (const auto& arena : arenas) ASSERT_NE(arena, nullptr);
  // (layer, page) -> a byte that names it and the rank.
  const auto mark = [](const v1::FrameAssignment& frame, int rank) {
    return static_cast<char>(frame.layer() * 16 + frame.page() * 2 + rank + 1);
  };
  for (const v1::FrameAssignment& frame : opened.new_frames()) {
    for (int rank = 0; rank < 2; ++rank) {
      std::memset(
          static_cast<char*>(arenas[static_cast<size_t>(rank)]->data()) + frame.frame() * slice,
          mark(frame, rank), static_cast<size_t>(slice));
    }
  }
  grpc::ClientContext swap_context;
  v1::SwapOutSequenceRequest swap;
  swap.set_model_id("m");
  swap.set_sequence_id("s");
  v1::SwapOutSequenceResponse swapped;
  ASSERT_TRUE(stub_->SwapOutSequence(&swap_context, swap, &swapped).ok());
  // Other frames overwrite the old ones while the sequence is out.
  Open("m", "other", 9);
  for (int rank = 0; rank < 2; ++rank) {
    std::memset(arenas[static_cast<size_t>(rank)]->data(), 0,
                static_cast<size_t>(arenas[static_cast<size_t>(rank)]->bytes()));
  }
  grpc::ClientContext resume_context;
  v1::ResumeSequenceRequest resume;
  resume.set_model_id("m");
  resume.set_sequence_id("s");
  v1::ResumeSequenceResponse resumed;
  ASSERT_TRUE(stub_->ResumeSequence(&resume_context, resume, &resumed).ok());
  ASSERT_GT(resumed.new_frames_size(), 0);
  for (const v1::FrameAssignment& frame : resumed.new_frames()) {
    for (int rank = 0; rank < 2; ++rank) {
      const char* bytes = static_cast<const char*>(arenas[static_cast<size_t>(rank)]->data()) +
                          frame.frame() * slice;
      EXPECT_EQ(bytes[0], mark(frame, rank))
          << "layer " << frame.layer() << " page " << frame.page() << " rank " << rank;
      EXPECT_EQ(bytes[slice - 1], mark(frame, rank));
    }
  }
  ExpectInvariants("m");
}

TEST_F(TensorParallelTest, BadRanksAndDevicesNameTheFieldAndRegisterNothing) {
  struct Case {
    v1::RegisterModelRequest request;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({TpRequest("a", 3), "tensor_parallel_size"});
  cases.push_back({TpRequest("b", 65), "tensor_parallel_size"});
  cases.push_back({TpRequest("c", -1), "tensor_parallel_size"});
  // The group layout gives each rank an equal share of whole frames: 2 ranks, 1 frame.
  v1::RegisterModelRequest one_frame = TpRequest("d", 2, v1::FRAME_LAYOUT_GROUP);
  one_frame.set_capacity_bytes(2 * kPage * one_frame.geometry().head_dim() *
                               one_frame.geometry().element_bytes());
  cases.push_back({one_frame, "capacity_bytes"});
  v1::RegisterModelRequest few = TpRequest("e", 2);
  few.add_devices(0);
  cases.push_back({few, "devices"});
  v1::RegisterModelRequest missing = TpRequest("f", 2);
  missing.add_devices(0);
  missing.add_devices(8);  // --host_devices=8: devices 0..7
  cases.push_back({missing, "devices[1]"});
  v1::RegisterModelRequest negative = TpRequest("g", 1);
  negative.add_devices(-1);
  cases.push_back({negative, "devices[0]"});
  for (const Case& bad : cases) {
    const grpc::Status status = RegisterStatus(bad.request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.field;
    EXPECT_THAT(status.error_message(), HasSubstr(bad.field));
  }
  grpc::ClientContext context;
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub_->ListModels(&context, v1::ListModelsRequest(), &models).ok());
  EXPECT_EQ(models.pools_size(), 0);
  EXPECT_EQ(server_->service().registry().reserved_bytes(), 0);
}

TEST_F(TensorParallelTest, BadRankRequestsNameTheFieldAndApplyNothing) {
  ASSERT_TRUE(RegisterStatus(TpRequest("m", 2)).ok());
  ASSERT_TRUE(RegisterStatus(TpRequest("one", 1)).ok());
  Open("m", "s", kTokens);
  Open("one", "s", kTokens);
  v1::Budget budget;
  budget.set_pages_per_group(3);
  const std::vector<std::vector<float>> values = Statistics(7);
  const auto expect = [this](const v1::DecideRequest& request, grpc::StatusCode code,
                             const std::string& field) {
    const auto replies = DecideRanks({request});
    EXPECT_EQ(replies[0].first.error_code(), code)
        << field << ": " << replies[0].first.error_message();
    EXPECT_THAT(replies[0].first.error_message(), HasSubstr(field));
  };
  v1::DecideRequest beyond = RankRequest("m", values, 2, 1, budget, v1::SELECTION_SCOPE_LAYER);
  beyond.set_rank(2);
  expect(beyond, grpc::StatusCode::INVALID_ARGUMENT, "rank");
  v1::DecideRequest negative = RankRequest("m", values, 2, 0, budget, v1::SELECTION_SCOPE_LAYER);
  negative.set_rank(-1);
  expect(negative, grpc::StatusCode::INVALID_ARGUMENT, "rank");
  expect(RankRequest("one", values, 2, 1, budget, v1::SELECTION_SCOPE_LAYER),
         grpc::StatusCode::INVALID_ARGUMENT, "rank");
  // A length the sequence does not have, its rows sized to match: refused before any is read.
  v1::DecideRequest longer = RankRequest("m", values, 2, 1, budget, v1::SELECTION_SCOPE_LAYER);
  *longer.mutable_layers(0)->mutable_statistic() = BytesStatistic(
      RandomStatistic(kTpHeads / 2, kTokens + 1, 3), kTpHeads / 2, kTokens + 1, v1::DTYPE_FLOAT32);
  expect(longer, grpc::StatusCode::FAILED_PRECONDITION, "layers[0].statistic.tokens");
  v1::DecideRequest nobody = RankRequest("m", values, 2, 1, budget, v1::SELECTION_SCOPE_LAYER);
  nobody.set_sequence_id("nobody");
  expect(nobody, grpc::StatusCode::NOT_FOUND, "nobody");
  // A keys mix from a rank: the gathered rows could not carry it, so it is refused.
  v1::DecideRequest mixed = RankRequest("m", values, 2, 1, budget, v1::SELECTION_SCOPE_LAYER);
  mixed.mutable_layers(0)->mutable_statistic()->mutable_keys_mix()->mutable_keys()->set_score(
      v1::KEY_SCORE_KEYDIFF);
  expect(mixed, grpc::StatusCode::INVALID_ARGUMENT, "layers[0].statistic.keys_mix");
  // Every query head from one rank: not its share.
  v1::DecideRequest all_heads = RankRequest("m", values, 1, -1, budget, v1::SELECTION_SCOPE_LAYER);
  all_heads.set_rank(1);
  expect(all_heads, grpc::StatusCode::INVALID_ARGUMENT, "layers[0].statistic.query_heads");
  // Ranks that disagree on the budget: both are refused, nothing applied.
  v1::DecideRequest zero = RankRequest("m", values, 2, 0, budget, v1::SELECTION_SCOPE_LAYER);
  v1::DecideRequest one = RankRequest("m", values, 2, 1, budget, v1::SELECTION_SCOPE_LAYER);
  one.mutable_budget()->set_pages_per_group(5);
  const auto split = DecideRanks({zero, one});
  const auto invalid_naming_rank = [](const grpc::Status& status) {
    return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
           status.error_message().find("rank") != std::string::npos;
  };
  // The one that came second breaks the set: it and the waiting one both get the error (or,
  // when the second came after the first expired, the first gets DEADLINE_EXCEEDED).
  EXPECT_TRUE(invalid_naming_rank(split[0].first) || invalid_naming_rank(split[1].first))
      << split[0].first.error_message() << " / " << split[1].first.error_message();
  EXPECT_FALSE(split[0].first.ok());
  EXPECT_FALSE(split[1].first.ok());
  EXPECT_EQ(Stats("m").pages_evicted_total(), 0);
  ExpectInvariants("m");
  EXPECT_EQ(server_->service().ranks().waiting(), 0);
}

// Waiting ranks hold their statistics; together they stay within --max_inflight_decisions x
// --max_message_bytes, so a client sending ranks that never complete cannot grow the daemon.
TEST_F(TensorParallelTest, WaitingRanksHoldBoundedBytes) {
  ServerOptions options = LoopbackOptions();
  options.host_devices = 8;
  // Long enough that the ranks sent one after another all wait together on a loaded machine
  // (at 2 s, a rank once arrived after the first had expired); the waiting calls end with it.
  options.rank_wait_ms = 5000;
  options.max_inflight_decisions = 1;
  options.max_message_bytes = 4096;  // 4096 bytes may wait: four ranks' 888 bytes, not five
  Restart(options);
  ASSERT_TRUE(RegisterStatus(TpRequest("m", 8)).ok());
  Open("m", "s", kTokens);
  v1::Budget budget;
  budget.set_pages_per_group(3);
  const std::vector<std::vector<float>> values = Statistics(13);
  const int64_t rank_bytes = int64_t{kTpLayers} * (kTpHeads / 8) * kTokens * 4;
  std::vector<std::future<std::pair<grpc::Status, v1::DecideResponse>>> waiting;
  for (int rank = 0; rank < 4; ++rank) {
    waiting.push_back(std::async(std::launch::async, [this, &values, &budget, rank] {
      return DecideRanks({RankRequest("m", values, 8, rank, budget, v1::SELECTION_SCOPE_LAYER)})[0];
    }));
    // One rank at a time: the worker pool takes one decision job at once here.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (server_->service().ranks().held_bytes() < (rank + 1) * rank_bytes &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_EQ(server_->service().ranks().held_bytes(), (rank + 1) * rank_bytes);
  }
  const auto refused =
      DecideRanks({RankRequest("m", values, 8, 4, budget, v1::SELECTION_SCOPE_LAYER)})[0].first;
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("max_inflight_decisions"));
  EXPECT_EQ(server_->service().ranks().held_bytes(), 4 * rank_bytes);  // nothing added
  for (auto& call : waiting) {
    EXPECT_EQ(call.get().first.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  EXPECT_EQ(server_->service().ranks().held_bytes(), 0);
  EXPECT_EQ(Stats("m").pages_evicted_total(), 0);
  ExpectInvariants("m");
}

// A rank that never sends its Decide: after --rank_wait_ms every waiting rank hears which rank
// is missing, nothing is applied, and the next complete set decides normally.
TEST_F(TensorParallelTest, AMissingRankFailsTheOthersAtTheWaitAndAppliesNothing) {
  ASSERT_TRUE(RegisterStatus(TpRequest("m", 4)).ok());
  Open("m", "s", kTokens);
  v1::Budget budget;
  budget.set_pages_per_group(3);
  const std::vector<std::vector<float>> values = Statistics(11);
  std::vector<v1::DecideRequest> three;
  for (const int rank : {0, 1, 3}) {
    three.push_back(RankRequest("m", values, 4, rank, budget, v1::SELECTION_SCOPE_LAYER));
  }
  const v1::SequenceInfo before = Sequence("m", "s");
  const auto start = std::chrono::steady_clock::now();
  const auto replies = DecideRanks(three);
  const auto waited = std::chrono::steady_clock::now() - start;
  for (const auto& [status, response] : replies) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("rank_wait_ms: rank 2 of 4"));
    EXPECT_THAT(status.error_message(), HasSubstr("nothing was applied"));
  }
  EXPECT_GE(waited, std::chrono::milliseconds(300));
  EXPECT_EQ(Stats("m").pages_evicted_total(), 0);
  ExpectSameFrames(before, Sequence("m", "s"));
  EXPECT_EQ(server_->service().ranks().waiting(), 0);
  std::vector<v1::DecideRequest> four;
  for (int rank = 0; rank < 4; ++rank) {
    four.push_back(RankRequest("m", values, 4, rank, budget, v1::SELECTION_SCOPE_LAYER));
  }
  for (const auto& [status, response] : DecideRanks(four)) {
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_GT(Stats("m").pages_evicted_total(), 0);
  ExpectInvariants("m");
}

// Each rank streams its own layers (DecideStream with `rank`): a layer is decided when every
// rank's message for it has come, each stream gets the one-pool decision of that layer, and the
// pool ends as a one-pool model's would.
TEST_F(TensorParallelTest, RanksStreamingTheirLayersGetTheOnePoolDecision) {
  int case_index = 0;
  for (const int ranks : {2, 4}) {
    for (const v1::SelectionScope scope : {v1::SELECTION_SCOPE_LAYER, v1::SELECTION_SCOPE_GROUP}) {
      SCOPED_TRACE(absl::StrCat("t=", ranks, " scope=", scope));
      const std::string single = absl::StrCat("single", case_index);
      const std::string sharded = absl::StrCat("tp", case_index);
      ++case_index;
      ASSERT_TRUE(RegisterStatus(TpRequest(single, 1)).ok());
      ASSERT_TRUE(RegisterStatus(TpRequest(sharded, ranks)).ok());
      Open(single, "s", kTokens);
      Open(sharded, "s", kTokens);
      v1::Budget budget;
      budget.set_pages_per_group(4);
      const std::vector<std::vector<float>> values = Statistics(300 + case_index);
      const auto alone = DecideRanks({RankRequest(single, values, 1, -1, budget, scope)});
      ASSERT_TRUE(alone[0].first.ok()) << alone[0].first.error_message();
      std::vector<v1::DecideRequest> each;
      for (int rank = 0; rank < ranks; ++rank) {
        each.push_back(RankRequest(sharded, values, ranks, rank, budget, scope));
      }
      const auto streamed = StreamRanks(each);
      for (int rank = 0; rank < ranks; ++rank) {
        const auto& [status, decisions] = streamed[static_cast<size_t>(rank)];
        ASSERT_TRUE(status.ok()) << "rank " << rank << ": " << status.error_message();
        ASSERT_EQ(static_cast<int>(decisions.size()), kTpLayers) << "rank " << rank;
        for (int layer = 0; layer < kTpLayers; ++layer) {
          const v1::LayerDecision& reference = alone[0].second.layers(layer);
          ASSERT_EQ(decisions[static_cast<size_t>(layer)].groups_size(), kTpGroups);
          for (int g = 0; g < kTpGroups; ++g) {
            EXPECT_THAT(decisions[static_cast<size_t>(layer)].groups(g).kept_pages(),
                        ::testing::ElementsAreArray(reference.groups(g).kept_pages()))
                << "rank " << rank << " layer " << layer << " group " << g;
          }
        }
      }
      EXPECT_EQ(Stats(sharded).used_frames(), Stats(single).used_frames());
      ExpectSameFrames(Sequence(single, "s"), Sequence(sharded, "s"));
      ExpectInvariants(sharded);
    }
  }
}

// A rank whose stream never sends the layer: the other ranks' streams end with
// DEADLINE_EXCEEDED naming it after --rank_wait_ms, and nothing is applied.
TEST_F(TensorParallelTest, AStreamMissingARankFailsAtTheWaitAndAppliesNothing) {
  ASSERT_TRUE(RegisterStatus(TpRequest("m", 2)).ok());
  Open("m", "s", kTokens);
  v1::Budget budget;
  budget.set_pages_per_group(3);
  const std::vector<std::vector<float>> values = Statistics(17);
  const auto replies =
      StreamRanks({RankRequest("m", values, 2, 0, budget, v1::SELECTION_SCOPE_LAYER)});
  const auto& [status, decisions] = replies[0];
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("rank_wait_ms: rank 1 of 2"));
  EXPECT_TRUE(decisions.empty());
  EXPECT_EQ(Stats("m").pages_evicted_total(), 0);
  EXPECT_EQ(server_->service().ranks().waiting(), 0);
  ExpectInvariants("m");
}

}  // namespace
}  // namespace entrokv::service::testing
