// The tensor-parallel tests' daemon and helpers: a model whose 8 KV groups split over up to 8
// ranks, each rank's Decide or DecideStream on a thread of its own, and every rank's arena
// mapped as its worker maps it. Host arenas stand in for the devices (--host_devices).
#ifndef ENTROKV_TESTS_SERVICE_TENSOR_PARALLEL_FIXTURE_H_
#define ENTROKV_TESTS_SERVICE_TENSOR_PARALLEL_FIXTURE_H_

#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/pool/arena.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"

namespace entrokv::service::testing {

// A model whose 8 KV groups split over up to 8 ranks: 16 query heads, 3 layers, pages of 4.
inline constexpr int kTpLayers = 3;
inline constexpr int kTpHeads = 16;
inline constexpr int kTpGroups = 8;
inline constexpr int kPage = 4;
inline constexpr int64_t kTokens = 37;  // 10 pages, the last one partly written

inline v1::RegisterModelRequest TpRequest(const std::string& id, int ranks,
                                          v1::FrameLayout layout = v1::FRAME_LAYOUT_LAYER) {
  v1::RegisterModelRequest request = RegisterRequest(id, kTpLayers, kTpHeads, kTpGroups, 1 << 20);
  request.mutable_geometry()->set_page_size(kPage);
  request.set_frame_layout(layout);
  request.set_tensor_parallel_size(ranks);
  return request;
}

class TensorParallelTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServerOptions options = LoopbackOptions();
    options.host_devices = 8;
    options.rank_wait_ms = 300;
    StartServer(options);
  }

  grpc::Status RegisterStatus(const v1::RegisterModelRequest& request,
                              v1::RegisterModelResponse* response = nullptr) {
    grpc::ClientContext context;
    v1::RegisterModelResponse ignored;
    return stub_->RegisterModel(&context, request, response != nullptr ? response : &ignored);
  }

  // The Decide of every layer with `values` [layer][H_Q x kTokens] restricted to rank `rank`'s
  // query heads (all of them for ranks == 1 and rank -1).
  v1::DecideRequest RankRequest(const std::string& model,
                                const std::vector<std::vector<float>>& values, int ranks, int rank,
                                const v1::Budget& budget, v1::SelectionScope scope) {
    v1::DecideRequest request;
    request.set_model_id(model);
    request.set_sequence_id("s");
    *request.mutable_budget() = budget;
    request.mutable_policy()->set_name("page_entrokv");
    request.mutable_policy()->set_scope(scope);
    if (rank >= 0) request.set_rank(rank);
    const int heads = kTpHeads / ranks;
    for (int layer = 0; layer < kTpLayers; ++layer) {
      const std::vector<float>& all = values[static_cast<size_t>(layer)];
      const int first = rank < 0 ? 0 : rank * heads;
      std::vector<float> mine(all.begin() + first * kTokens,
                              all.begin() + (first + heads) * kTokens);
      v1::LayerStatistic* in = request.add_layers();
      in->set_layer(layer);
      *in->mutable_statistic() = BytesStatistic(mine, heads, kTokens, v1::DTYPE_FLOAT32);
    }
    return request;
  }

  // Every rank's Decide at once, each on its own thread; the replies in rank order.
  std::vector<std::pair<grpc::Status, v1::DecideResponse>> DecideRanks(
      const std::vector<v1::DecideRequest>& requests) {
    std::vector<std::future<std::pair<grpc::Status, v1::DecideResponse>>> calls;
    for (const v1::DecideRequest& request : requests) {
      calls.push_back(std::async(std::launch::async, [this, request] {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        v1::DecideResponse response;
        const grpc::Status status = stub_->Decide(&context, request, &response);
        return std::make_pair(status, response);
      }));
    }
    std::vector<std::pair<grpc::Status, v1::DecideResponse>> replies;
    for (auto& call : calls) replies.push_back(call.get());
    return replies;
  }

  // Each rank's own DecideStream, one thread per rank: every layer of its request written as one
  // message with `rank` set, each decision read before the next layer is written. The decisions
  // (or the stream's status) in rank order.
  std::vector<std::pair<grpc::Status, std::vector<v1::LayerDecision>>> StreamRanks(
      const std::vector<v1::DecideRequest>& requests) {
    std::vector<std::future<std::pair<grpc::Status, std::vector<v1::LayerDecision>>>> calls;
    for (const v1::DecideRequest& request : requests) {
      calls.push_back(std::async(std::launch::async, [this, request] {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        auto stream = stub_->DecideStream(&context);
        std::vector<v1::LayerDecision> decisions;
        for (const v1::LayerStatistic& layer : request.layers()) {
          v1::DecideLayerRequest message;
          message.set_model_id(request.model_id());
          message.set_sequence_id(request.sequence_id());
          *message.mutable_layer() = layer;
          *message.mutable_budget() = request.budget();
          *message.mutable_policy() = request.policy();
          message.set_rank(request.rank());
          v1::LayerDecision decision;
          if (!stream->Write(message) || !stream->Read(&decision)) break;
          decisions.push_back(decision);
        }
        stream->WritesDone();
        const grpc::Status status = stream->Finish();
        return std::make_pair(status, decisions);
      }));
    }
    std::vector<std::pair<grpc::Status, std::vector<v1::LayerDecision>>> replies;
    for (auto& call : calls) replies.push_back(call.get());
    return replies;
  }

  // OpenSequence of `tokens` tokens, or a fork of `parent` sharing its first prefix_pages
  // pages; the call's status and the frames it assigned.
  grpc::Status OpenFrames(const std::string& model, const std::string& id, int64_t tokens,
                          v1::OpenSequenceResponse* opened, const std::string& parent = "",
                          int64_t prefix_pages = 0) {
    grpc::ClientContext context;
    v1::OpenSequenceRequest request;
    request.set_model_id(model);
    request.set_sequence_id(id);
    request.set_initial_tokens(tokens);
    if (!parent.empty()) {
      request.set_parent_sequence_id(parent);
      request.set_prefix_pages(prefix_pages);
    }
    return stub_->OpenSequence(&context, request, opened);
  }

  // Every rank's arena of `pool`, mapped as that rank's worker maps it.
  static std::vector<std::unique_ptr<HostArenaMapping>> MapRanks(const v1::PoolInfo& pool) {
    std::vector<std::unique_ptr<HostArenaMapping>> arenas;
    for (const v1::RankArena& rank : pool.ranks()) {
      absl::StatusOr<std::unique_ptr<HostArenaMapping>> mapping =
          HostArenaMapping::OpenByName(rank.arena_name());
      EXPECT_TRUE(mapping.ok()) << "rank " << rank.rank() << ": " << mapping.status();
      arenas.push_back(mapping.ok() ? *std::move(mapping) : nullptr);
    }
    return arenas;
  }
};

// The sequence holds the same frames in every block table.
inline void ExpectSameFrames(const v1::SequenceInfo& expected, const v1::SequenceInfo& actual) {
  ASSERT_EQ(actual.block_tables_size(), expected.block_tables_size());
  for (int i = 0; i < expected.block_tables_size(); ++i) {
    EXPECT_THAT(actual.block_tables(i).frames(),
                ::testing::ElementsAreArray(expected.block_tables(i).frames()))
        << "block table " << i;
  }
}

// 4 pages per group, or a share of 0.45 planned by the pyramid allocator.
inline v1::Budget ExplicitOrPlanned(bool fraction) {
  v1::Budget budget;
  if (fraction) {
    budget.set_fraction(0.45);
    budget.set_allocator("pyramid");
  } else {
    budget.set_pages_per_group(4);
  }
  return budget;
}

inline std::vector<std::vector<float>> Statistics(uint32_t seed) {
  std::vector<std::vector<float>> values;
  for (int layer = 0; layer < kTpLayers; ++layer) {
    values.push_back(RandomStatistic(kTpHeads, kTokens, seed + static_cast<uint32_t>(layer)));
  }
  return values;
}

}  // namespace entrokv::service::testing

#endif  // ENTROKV_TESTS_SERVICE_TENSOR_PARALLEL_FIXTURE_H_
