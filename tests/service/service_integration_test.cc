// The real daemon in-process on 127.0.0.1:0, driven through a real channel.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/scoring/decision.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"
#include "tests/service/test_support.h"
#include "wire/convert.h"

namespace entrokv::service {
namespace {

using ::entrokv::service::testing::BytesStatistic;
using ::entrokv::service::testing::Encode;
using ::entrokv::service::testing::LoopbackOptions;
using ::entrokv::service::testing::MakeChannel;
using ::entrokv::service::testing::RandomStatistic;
using ::entrokv::service::testing::RegisterRequest;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using ::entrokv::service::testing::kGroups;
using ::entrokv::service::testing::kHeads;
using ::entrokv::service::testing::kLayers;
using ::entrokv::service::testing::ServiceTest;

// The core's decision for a statistic the test encoded the same way.
LayerDecision CoreDecision(const std::string& bytes, v1::DType dtype, int64_t tokens, int64_t pages,
                           std::span<const double> cached = {},
                           std::span<const uint8_t> live_pages = {}) {
  PolicyOptions options;  // the daemon's defaults: tau 0.5, alpha 2, 4 sinks, tail page kept
  options.page_size = 16;
  options.protections.tail_page = true;
  const DType core_dtype = *wire::ToDType("dtype", dtype);
  LayerRequest request =
      LayerRequestFor(*StatisticView::Create(bytes.data(), core_dtype, kHeads, tokens), kHeads,
                      kGroups, tokens, pages);
  request.cached_weights = cached;
  request.live_pages = live_pages;
  absl::StatusOr<LayerDecision> decision =
      DecideLayer(**FindPolicy("page_entrokv"), options, request);
  EXPECT_TRUE(decision.ok()) << decision.status();
  return *decision;
}

TEST_F(ServiceTest, FullLifecycle) {
  grpc::ClientContext register_context;
  v1::RegisterModelResponse registered;
  ASSERT_TRUE(stub_
                  ->RegisterModel(&register_context,
                                  RegisterRequest("m", kLayers, kHeads, kGroups, 4 << 20),
                                  &registered)
                  .ok());
  EXPECT_EQ(registered.pool().frame_layout(), v1::FRAME_LAYOUT_GROUP);
  EXPECT_EQ(registered.pool().backend(), v1::BACKEND_HOST);
  EXPECT_FALSE(registered.pool().arena_name().empty());
  EXPECT_GT(registered.pool().capacity_frames(), 0);

  grpc::ClientContext get_context;
  v1::GetModelRequest get;
  get.set_model_id("m");
  v1::GetModelResponse model;
  ASSERT_TRUE(stub_->GetModel(&get_context, get, &model).ok());
  EXPECT_EQ(model.pool().geometry().layers(), kLayers);

  grpc::ClientContext open_context;
  v1::OpenSequenceRequest open;
  open.set_model_id("m");
  open.set_sequence_id("s1");
  open.set_initial_tokens(100);  // 7 pages
  v1::OpenSequenceResponse opened;
  ASSERT_TRUE(stub_->OpenSequence(&open_context, open, &opened).ok());
  EXPECT_EQ(opened.sequence().length_tokens(), 100);
  EXPECT_EQ(opened.new_frames_size(), kLayers * kGroups * 7);

  grpc::ClientContext append_context;
  v1::AppendTokensRequest append;
  append.set_model_id("m");
  append.set_sequence_id("s1");
  append.set_tokens(60);  // 160 tokens = 10 pages
  v1::AppendTokensResponse appended;
  ASSERT_TRUE(stub_->AppendTokens(&append_context, append, &appended).ok());
  EXPECT_EQ(appended.length_tokens(), 160);
  EXPECT_EQ(Stats("m").used_frames(), kLayers * kGroups * 10);

  grpc::ClientContext decide_context;
  v1::DecideResponse decided;
  const grpc::Status status =
      stub_->Decide(&decide_context, DecideAll("m", "s1", 160, 4, 7), &decided);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(decided.layers_size(), kLayers);
  for (const v1::LayerDecision& layer : decided.layers()) {
    EXPECT_EQ(layer.page_count(), 10);
    ASSERT_EQ(layer.groups_size(), kGroups);
    EXPECT_EQ(layer.freed_frames_size(), kGroups * 6);
    for (const v1::GroupDecision& group : layer.groups()) {
      EXPECT_EQ(group.kept_pages_size(), 4);
      EXPECT_EQ(group.evicted_pages_size(), 6);
      EXPECT_EQ(group.kept_pages(3), 9);  // the tail page is protected
      EXPECT_EQ(group.weights_size(), kHeads / kGroups);
      EXPECT_TRUE(group.has_shadow_uor());
      EXPECT_GE(group.shadow_uor(), 1.0);
    }
  }
  v1::PoolStats stats = Stats("m");
  EXPECT_EQ(stats.used_frames(), kLayers * kGroups * 4);
  EXPECT_EQ(stats.pages_evicted_total(), kLayers * kGroups * 6);
  EXPECT_EQ(stats.bytes_moved_total(), 0);
  ExpectInvariants("m");

  grpc::ClientContext list_context;
  v1::ListSequencesRequest list;
  list.set_model_id("m");
  list.set_include_block_tables(true);
  v1::ListSequencesResponse listed;
  ASSERT_TRUE(stub_->ListSequences(&list_context, list, &listed).ok());
  ASSERT_EQ(listed.sequences_size(), 1);
  EXPECT_EQ(listed.sequences(0).block_tables_size(), kLayers * kGroups);

  grpc::ClientContext close_context;
  v1::CloseSequenceRequest close;
  close.set_model_id("m");
  close.set_sequence_id("s1");
  v1::CloseSequenceResponse closed;
  ASSERT_TRUE(stub_->CloseSequence(&close_context, close, &closed).ok());
  EXPECT_EQ(closed.live_frames(), kLayers * kGroups * 4);
  stats = Stats("m");
  EXPECT_EQ(stats.used_frames(), 0);
  EXPECT_EQ(stats.free_frames(), stats.capacity_frames());
  EXPECT_EQ(stats.sequences_active(), 0);
  ExpectInvariants("m");
}

TEST_F(ServiceTest, DecisionsEqualTheCoreAndCachedWeightsAreReused) {
  Register("m");
  Open("m", "s", 1000);
  v1::DecideRequest request = DecideAll("m", "s", 1000, 12, 99);
  grpc::ClientContext context;
  v1::DecideResponse response;
  ASSERT_TRUE(stub_->Decide(&context, request, &response).ok());
  std::vector<double> layer0_weights;
  std::vector<uint8_t> layer0_live(kGroups * 64, 0);  // after the append below: 64 pages
  for (int g = 0; g < kGroups; ++g) {
    for (const int32_t page : response.layers(0).groups(g).kept_pages()) {
      layer0_live[g * 64 + page] = 1;
    }
    layer0_live[g * 64 + 63] = 1;  // the page the append adds
  }
  for (int i = 0; i < kLayers; ++i) {
    const LayerDecision core =
        CoreDecision(request.layers(i).statistic().data(), v1::DTYPE_BFLOAT16, 1000, 12);
    for (int g = 0; g < kGroups; ++g) {
      EXPECT_THAT(response.layers(i).groups(g).kept_pages(),
                  ElementsAreArray(core.groups[g].kept_pages));
      EXPECT_THAT(response.layers(i).groups(g).weights(), ElementsAreArray(core.groups[g].weights));
      if (i == 0) {
        layer0_weights.insert(layer0_weights.end(), core.groups[g].weights.begin(),
                              core.groups[g].weights.end());
      }
    }
  }
  // Decode time: a new statistic, pooled with the weights cached at prefill.
  grpc::ClientContext append_context;
  v1::AppendTokensRequest append;
  append.set_model_id("m");
  append.set_sequence_id("s");
  append.set_tokens(16);
  v1::AppendTokensResponse appended;
  ASSERT_TRUE(stub_->AppendTokens(&append_context, append, &appended).ok());
  v1::DecideRequest decode;
  decode.set_model_id("m");
  decode.set_sequence_id("s");
  decode.set_use_cached_weights(true);
  decode.mutable_budget()->set_pages_per_group(10);
  v1::LayerStatistic* in = decode.add_layers();
  in->set_layer(0);
  *in->mutable_statistic() =
      BytesStatistic(RandomStatistic(kHeads, 1016, 5), kHeads, 1016, v1::DTYPE_FLOAT32);
  grpc::ClientContext decode_context;
  v1::DecideResponse decoded;
  const grpc::Status status = stub_->Decide(&decode_context, decode, &decoded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const LayerDecision core = CoreDecision(in->statistic().data(), v1::DTYPE_FLOAT32, 1016, 10,
                                          layer0_weights, layer0_live);
  for (int g = 0; g < kGroups; ++g) {
    EXPECT_THAT(decoded.layers(0).groups(g).kept_pages(),
                ElementsAreArray(core.groups[g].kept_pages));
  }
  ExpectInvariants("m");
}

// A decode-time decision (cached weights) selects among the pages still held, so
// the sequence keeps exactly G * K frames per layer, not fewer because it chose evicted pages.
TEST_F(ServiceTest, DecodeTimeDecisionKeepsExactlyTheQuotaOfLiveFrames) {
  Register("m");
  Open("m", "s", 1000);  // 63 pages
  grpc::ClientContext context;
  v1::DecideResponse response;
  ASSERT_TRUE(stub_->Decide(&context, DecideAll("m", "s", 1000, 12, 99), &response).ok());
  EXPECT_EQ(Stats("m").used_frames(), kLayers * kGroups * 12);
  grpc::ClientContext append_context;
  v1::AppendTokensRequest append;
  append.set_model_id("m");
  append.set_sequence_id("s");
  append.set_tokens(16);  // 1016 tokens: one more page, 13 live per (layer, group)
  v1::AppendTokensResponse appended;
  ASSERT_TRUE(stub_->AppendTokens(&append_context, append, &appended).ok());
  v1::DecideRequest decode;
  decode.set_model_id("m");
  decode.set_sequence_id("s");
  decode.set_use_cached_weights(true);
  decode.mutable_budget()->set_pages_per_group(10);
  for (int layer = 0; layer < kLayers; ++layer) {
    v1::LayerStatistic* in = decode.add_layers();
    in->set_layer(layer);
    // A fresh statistic: most of its best pages are among the 51 the prefill evicted.
    *in->mutable_statistic() =
        BytesStatistic(RandomStatistic(kHeads, 1016, 17 + layer), kHeads, 1016, v1::DTYPE_FLOAT32);
  }
  grpc::ClientContext decode_context;
  v1::DecideResponse decoded;
  const grpc::Status status = stub_->Decide(&decode_context, decode, &decoded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  for (const v1::LayerDecision& layer : decoded.layers()) {
    for (const v1::GroupDecision& group : layer.groups()) {
      EXPECT_EQ(group.kept_pages_size(), 10);
      EXPECT_EQ(group.evicted_pages_size(), 3);  // 13 live, 10 kept
    }
  }
  EXPECT_EQ(Stats("m").used_frames(), kLayers * kGroups * 10);
  ExpectInvariants("m");
}

TEST_F(ServiceTest, StreamsOneDecisionPerLayerInOrder) {
  Register("m");
  Open("m", "s", 500);
  grpc::ClientContext context;
  auto stream = stub_->DecideStream(&context);
  std::vector<std::string> sent;
  for (int layer = 0; layer < kLayers; ++layer) {
    v1::DecideLayerRequest request;
    request.set_model_id("m");
    request.set_sequence_id("s");
    request.mutable_budget()->set_fraction(0.25);
    request.mutable_layer()->set_layer(layer);
    *request.mutable_layer()->mutable_statistic() =
        BytesStatistic(RandomStatistic(kHeads, 500, 40 + layer), kHeads, 500, v1::DTYPE_BFLOAT16);
    sent.push_back(request.layer().statistic().data());
    ASSERT_TRUE(stream->Write(request));
    v1::LayerDecision decision;
    ASSERT_TRUE(stream->Read(&decision));
    EXPECT_EQ(decision.layer(), layer);
    // fraction 0.25 of 500 tokens over 4 layers: floor(0.25*500*4/16) = 31 pages, 8/8/8/7.
    EXPECT_EQ(decision.quota_pages(), layer < 3 ? 8 : 7);
    const LayerDecision core =
        CoreDecision(sent.back(), v1::DTYPE_BFLOAT16, 500, decision.quota_pages());
    for (int g = 0; g < kGroups; ++g) {
      EXPECT_THAT(decision.groups(g).kept_pages(), ElementsAreArray(core.groups[g].kept_pages));
    }
  }
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Stats("m").used_frames(), kGroups * 31);
  ExpectInvariants("m");
}

TEST_F(ServiceTest, StreamErrorEndsTheStreamWithTheCode) {
  Register("m");
  Open("m", "s", 64);
  grpc::ClientContext context;
  auto stream = stub_->DecideStream(&context);
  v1::DecideLayerRequest request;
  request.set_model_id("m");
  request.set_sequence_id("s");
  request.mutable_budget()->set_pages_per_group(2);
  request.mutable_layer()->set_layer(0);
  *request.mutable_layer()->mutable_statistic() =
      BytesStatistic(RandomStatistic(kHeads, 63, 1), kHeads, 63, v1::DTYPE_FLOAT32);
  ASSERT_TRUE(stream->Write(request));
  v1::LayerDecision decision;
  EXPECT_FALSE(stream->Read(&decision));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("tokens"));
}

TEST_F(ServiceTest, ConcurrentSequencesLeaveNoFrameBehind) {
  Register("m", 16 << 20);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t, &failures] {
      auto stub = v1::CacheManager::NewStub(channel_);
      for (int i = 0; i < 5; ++i) {
        const std::string id = absl::StrCat("t", t, "-", i);
        grpc::ClientContext open_context;
        v1::OpenSequenceRequest open;
        open.set_model_id("m");
        open.set_sequence_id(id);
        open.set_initial_tokens(300 + 17 * i);
        v1::OpenSequenceResponse opened;
        if (!stub->OpenSequence(&open_context, open, &opened).ok()) ++failures;
        grpc::ClientContext decide_context;
        v1::DecideResponse decided;
        if (!stub->Decide(&decide_context, DecideAll("m", id, 300 + 17 * i, 5, t * 100 + i),
                          &decided)
                 .ok()) {
          ++failures;
        }
        grpc::ClientContext close_context;
        v1::CloseSequenceRequest close;
        close.set_model_id("m");
        close.set_sequence_id(id);
        v1::CloseSequenceResponse closed;
        if (!stub->CloseSequence(&close_context, close, &closed).ok()) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  const v1::PoolStats stats = Stats("m");
  EXPECT_EQ(stats.used_frames(), 0);
  EXPECT_EQ(stats.sequences_active(), 0);
  ExpectInvariants("m");
}

}  // namespace
}  // namespace entrokv::service
