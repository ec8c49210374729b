// Bounded bookkeeping and cancellation against the in-process daemon over loopback: the bookkeeping
// a model and a sequence may hold is bounded and exported, ListSequences answers page by page with
// bounded replies, and a deadline frees the worker between the KV groups of a layer.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/list_pages.h"
#include "tests/service/service_fixture.h"
#include "tests/service/test_support.h"

namespace entrokv::service {
namespace {

using ::entrokv::service::testing::BytesStatistic;
using ::entrokv::service::testing::Encode;
using ::entrokv::service::testing::FindSeries;
using ::entrokv::service::testing::kGroups;
using ::entrokv::service::testing::kHeads;
using ::entrokv::service::testing::kLayers;
using ::entrokv::service::testing::LoopbackOptions;
using ::entrokv::service::testing::RandomStatistic;
using ::entrokv::service::testing::RegisterRequest;
using ::entrokv::service::testing::ServiceTest;
using ::entrokv::service::testing::SharedMemoryStatistic;
using ::entrokv::service::testing::WriteSegment;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// The value of gauge `family`{pool=`pool`}; -1 when there is none.
double PoolGauge(const Server& server, const std::string& family, const std::string& pool) {
  const std::optional<prometheus::ClientMetric> series =
      FindSeries(server, family, {{"pool", pool}});
  return series.has_value() ? series->gauge.value : -1;
}

class LimitsTest : public ServiceTest {
 protected:
  grpc::Status List(v1::ListSequencesRequest request, v1::ListSequencesResponse* response) {
    grpc::ClientContext context;
    return stub_->ListSequences(&context, request, response);
  }
  // Every sequence of `model` by following next_page_token; the replies' sizes in `sizes`.
  std::vector<std::string> ListAll(const std::string& model, bool tables, int32_t page_size,
                                   std::vector<size_t>* sizes = nullptr) {
    std::vector<std::string> ids;
    v1::ListSequencesRequest request;
    request.set_model_id(model);
    request.set_include_block_tables(tables);
    request.set_page_size(page_size);
    while (true) {
      v1::ListSequencesResponse response;
      const grpc::Status status = List(request, &response);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok()) return ids;
      if (sizes != nullptr) sizes->push_back(response.ByteSizeLong());
      for (const v1::SequenceInfo& sequence : response.sequences()) {
        ids.push_back(sequence.sequence_id());
        if (tables) {
          EXPECT_EQ(sequence.block_tables_size(), kLayers * kGroups);
        }
      }
      if (response.next_page_token().empty()) return ids;
      request.set_page_token(response.next_page_token());
    }
  }
};

// A model of 4096 layers x 4096 KV groups used to register, and each
// OpenSequence(initial_tokens = 0) then allocated ~390 MB of empty block tables.
TEST_F(LimitsTest, AGeometryWhoseEmptySequenceIsTooLargeIsRefused) {
  grpc::ClientContext context;
  v1::RegisterModelResponse response;
  const grpc::Status status =
      stub_->RegisterModel(&context, RegisterRequest("huge", 4096, 4096, 4096, 1 << 20), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("max_sequence_bookkeeping_bytes"));
  EXPECT_EQ(server_->service().registry().size(), 0);
}

// Bookkeeping is accounted (GetPoolStats, entrokv_pool_bookkeeping_bytes) and a
// sequence or a model past its bound is refused naming the flag, with nothing changed.
TEST_F(LimitsTest, BookkeepingIsExportedAndBounded) {
  ServerOptions options = LoopbackOptions();
  // A sequence of 8 tables: about 0.6 KiB, and 32 bytes per page (8 entries of 4 bytes), so
  // about 240 pages fit 8 KiB; the model's 2048 frames take 24 KiB, so 64 KiB leave room for
  // some 60 short sequences.
  options.max_sequence_bookkeeping_bytes = 8 << 10;
  options.max_model_bookkeeping_bytes = 64 << 10;
  Restart(options);
  Register("m", 1 << 20);
  const v1::PoolStats empty = Stats("m");
  EXPECT_GT(empty.bookkeeping_bytes(), 0);
  EXPECT_EQ(PoolGauge(*server_, "entrokv_pool_bookkeeping_bytes", "m"),
            static_cast<double>(empty.bookkeeping_bytes()));
  Open("m", "a", 16 * 50);
  const v1::PoolStats one = Stats("m");
  EXPECT_GT(one.bookkeeping_bytes(), empty.bookkeeping_bytes());
  EXPECT_EQ(PoolGauge(*server_, "entrokv_pool_bookkeeping_bytes", "m"),
            static_cast<double>(one.bookkeeping_bytes()));

  const grpc::Status long_prompt = OpenStatus("m", "b", 16 * 1000);
  EXPECT_EQ(long_prompt.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(long_prompt.error_message(), HasSubstr("max_sequence_bookkeeping_bytes"));
  grpc::ClientContext context;
  v1::AppendTokensRequest append;
  append.set_model_id("m");
  append.set_sequence_id("a");
  append.set_tokens(16 * 1000);
  v1::AppendTokensResponse appended;
  const grpc::Status grown = stub_->AppendTokens(&context, append, &appended);
  EXPECT_EQ(grown.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(grown.error_message(), HasSubstr("max_sequence_bookkeeping_bytes"));
  EXPECT_EQ(Stats("m").DebugString(), one.DebugString());

  grpc::Status refused;
  int opened = 1;
  for (; opened < 100; ++opened) {
    refused = OpenStatus("m", absl::StrCat("s", opened), 16);
    if (!refused.ok()) break;
  }
  EXPECT_LT(opened, 100);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("max_model_bookkeeping_bytes"));
  EXPECT_EQ(Stats("m").sequences_active(), opened);
  EXPECT_LE(Stats("m").bookkeeping_bytes(), options.max_model_bookkeeping_bytes);
  ExpectInvariants("m");
}

// A RegisterModel of 2-byte frames (one layer, one head of one dimension, one-token pages,
// 1-byte elements): the most bookkeeping per arena byte a model can ask for.
v1::RegisterModelRequest TinyFrames(const std::string& model_id, uint64_t capacity_bytes) {
  v1::RegisterModelRequest request;
  request.set_model_id(model_id);
  v1::ModelGeometry* g = request.mutable_geometry();
  g->set_layers(1);
  g->set_query_heads(1);
  g->set_kv_groups(1);
  g->set_head_dim(1);
  g->set_page_size(1);
  g->set_element_bytes(1);
  request.set_capacity_bytes(capacity_bytes);
  return request;
}

// Every model may hold up to --max_model_bookkeeping_bytes, and up to --max_models of them may
// exist: with default flags a few pools of tiny frames took a daemon from 17 MiB to 6 GiB of
// memory for 1 GiB of arenas. The daemon-wide bound (--max_bookkeeping_bytes, 512 MiB by
// default) refuses the pool that would pass it before its arena or its bookkeeping exists, and
// an unregistered model gives its share back.
TEST_F(LimitsTest, DefaultFlagsBoundTheBookkeepingOfAllModelsTogether) {
  const int64_t limit = ServerOptions().max_bookkeeping_bytes;
  // 16M frames each (--max_pool_frames): 192 MiB of bookkeeping for a 32 MiB arena.
  const uint64_t capacity = uint64_t{32} << 20;
  std::vector<std::string> registered;
  grpc::Status refused;
  for (int i = 0; i < 4 && refused.ok(); ++i) {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    const std::string id = absl::StrCat("tiny", i);
    refused = stub_->RegisterModel(&context, TinyFrames(id, capacity), &response);
    if (refused.ok()) registered.push_back(id);
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("max_bookkeeping_bytes"));
  EXPECT_EQ(registered.size(), 2u);
  EXPECT_EQ(server_->service().registry().size(), static_cast<int>(registered.size()));
  int64_t total = 0;
  for (const std::string& id : registered) total += Stats(id).bookkeeping_bytes();
  EXPECT_LE(total, limit);
  EXPECT_EQ(server_->service().registry().bookkeeping().used_bytes(), total);
  // Sequences count against the same bound, and give it back when they close.
  ASSERT_FALSE(registered.empty());
  Open(registered[0], "s", 1000);
  const int64_t with_sequence = Stats(registered[0]).bookkeeping_bytes();
  EXPECT_GT(with_sequence, Stats(registered[1]).bookkeeping_bytes());
  EXPECT_EQ(server_->service().registry().bookkeeping().used_bytes(),
            with_sequence + Stats(registered[1]).bookkeeping_bytes());
  {
    grpc::ClientContext context;
    v1::CloseSequenceRequest request;
    request.set_model_id(registered[0]);
    request.set_sequence_id("s");
    v1::CloseSequenceResponse response;
    ASSERT_TRUE(stub_->CloseSequence(&context, request, &response).ok());
  }
  EXPECT_EQ(server_->service().registry().bookkeeping().used_bytes(), total);
  // Unregistering gives the share back: the refused registration now fits.
  {
    grpc::ClientContext context;
    v1::UnregisterModelRequest request;
    request.set_model_id(registered[0]);
    v1::UnregisterModelResponse response;
    ASSERT_TRUE(stub_->UnregisterModel(&context, request, &response).ok());
  }
  grpc::ClientContext context;
  v1::RegisterModelResponse response;
  const grpc::Status again =
      stub_->RegisterModel(&context, TinyFrames("again", capacity), &response);
  EXPECT_TRUE(again.ok()) << again.error_message();
}

// A legal 2 GiB frame made one AppendTokens copy 2 GiB (12 s, 4.4 GB of memory) on
// copy-on-write: frames are bounded at 64 MiB, each way of reaching the bound named.
TEST_F(LimitsTest, FramesLargerThanWhatOneCallMayCopyAreRefused) {
  ServerOptions options = LoopbackOptions();
  options.pool_capacity_bytes = int64_t{4} << 30;
  Restart(options);
  v1::RegisterModelRequest request = TinyFrames("huge_frames", uint64_t{2} << 30);
  request.mutable_geometry()->set_head_dim(65536);
  request.mutable_geometry()->set_page_size(16384);  // 2 x 16384 x 65536 x 1 bytes = 2 GiB
  {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    const grpc::Status status = stub_->RegisterModel(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("geometry"));
    EXPECT_THAT(status.error_message(), HasSubstr("2147483648 bytes"));
  }
  EXPECT_EQ(server_->service().registry().size(), 0);
  // 64 MiB exactly is allowed: 2 x 8192 x 2048 x 2 bytes.
  request.set_model_id("largest_frames");
  request.mutable_geometry()->set_head_dim(2048);
  request.mutable_geometry()->set_page_size(8192);
  request.mutable_geometry()->set_element_bytes(2);
  request.set_capacity_bytes(uint64_t{64} << 20);
  grpc::ClientContext context;
  v1::RegisterModelResponse response;
  const grpc::Status largest = stub_->RegisterModel(&context, request, &response);
  EXPECT_TRUE(largest.ok()) << largest.error_message();
  EXPECT_EQ(response.pool().frame_bytes(), uint64_t{64} << 20);
}

// ListSequences used to have no paging: one reply held every sequence.
TEST_F(LimitsTest, ListSequencesPagesFollowTheToken) {
  Register("m", 16 << 20);
  std::vector<std::string> ids;
  for (int i = 0; i < 250; ++i) ids.push_back(absl::StrCat("seq-", 1000 + i));
  for (auto id = ids.rbegin(); id != ids.rend(); ++id) Open("m", *id, 1);
  v1::ListSequencesRequest request;
  request.set_model_id("m");
  v1::ListSequencesResponse first;
  ASSERT_TRUE(List(request, &first).ok());
  EXPECT_EQ(first.sequences_size(), kDefaultListPageSize);
  EXPECT_FALSE(first.next_page_token().empty());
  EXPECT_THAT(ListAll("m", false, 0), ElementsAreArray(ids));
  EXPECT_THAT(ListAll("m", false, 7), ElementsAreArray(ids));
  std::vector<size_t> sizes;
  EXPECT_THAT(ListAll("m", false, kMaxListPageSize + 5, &sizes), ElementsAreArray(ids));
  EXPECT_EQ(sizes.size(), 1u);
  EXPECT_THAT(ListAll("m", true, 0), ElementsAreArray(ids));

  request.set_page_token("not-a-token");
  v1::ListSequencesResponse refused;
  grpc::Status status = List(request, &refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("page_token"));
  request.clear_page_token();
  request.set_page_size(-1);
  status = List(request, &refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("page_size"));
}

// Block tables over many sequences used to build one reply of GBs. A page holds what
// --max_message_bytes allows, so every reply stays below it; a sequence too large for any
// reply is RESOURCE_EXHAUSTED naming include_block_tables, never a half-built multi-GB reply.
TEST_F(LimitsTest, BlockTablePagesStayBelowTheMessageLimit) {
  ServerOptions options = LoopbackOptions();
  options.max_message_bytes = 64 << 10;
  Restart(options);
  Register("m", 16 << 20);
  std::vector<std::string> ids;
  for (int i = 0; i < 40; ++i) {
    ids.push_back(absl::StrCat("s", 100 + i));
    Open("m", ids.back(), 16 * 25);
  }
  std::vector<size_t> sizes;
  EXPECT_THAT(ListAll("m", true, 0, &sizes), ElementsAreArray(ids));
  EXPECT_GT(sizes.size(), 1u);
  for (const size_t size : sizes) EXPECT_LE(size, size_t{64} << 10);
  RecordProperty("block_table_pages", static_cast<int>(sizes.size()));
  RecordProperty("largest_reply_bytes",
                 static_cast<int>(*std::max_element(sizes.begin(), sizes.end())));

  Register("h", 16 << 20);
  Open("h", "long", 16 * 420);  // 8 tables x 421 entries: more than one 64 KiB page holds
  v1::ListSequencesRequest request;
  request.set_model_id("h");
  request.set_include_block_tables(true);
  v1::ListSequencesResponse response;
  const grpc::Status status = List(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("include_block_tables"));
  EXPECT_THAT(status.error_message(), HasSubstr("max_message_bytes"));
  request.set_include_block_tables(false);
  EXPECT_TRUE(List(request, &response).ok());
  EXPECT_EQ(response.sequences_size(), 1);
}

// Cancellation used to be checked between layers only, so one wide layer held the only
// worker to its end after its time was up. Now the layer stops between its KV groups: the
// daemon's answer says how many of the 1024 it had scored, and the worker is free for the next
// call. The time given is a fifth of what the whole layer takes, measured first; a client's own
// deadline reaches the same check (LayerRequest::cancelled polls both).
TEST_F(LimitsTest, ADeadlineStopsALayerBetweenItsGroups) {
  constexpr int kWideGroups = 1024;
  constexpr int64_t kTokens = 16384;  // 1024 pages per group
  ServerOptions options = LoopbackOptions();
  options.worker_threads = 1;
  Restart(options);
  {
    v1::RegisterModelRequest wide = RegisterRequest("wide", 1, kWideGroups, kWideGroups, 0);
    wide.mutable_geometry()->set_head_dim(1);
    wide.mutable_geometry()->set_element_bytes(1);  // 32-byte frames, 1M per sequence
    wide.set_capacity_bytes(uint64_t{72} << 20);
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    const grpc::Status status = stub_->RegisterModel(&context, wide, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  Open("wide", "a", kTokens);
  Open("wide", "b", kTokens);
  Register("small");
  Open("small", "s", 100);
  const std::string segment = "/entrokv-wide-" + std::to_string(::getpid());
  const std::string values = Encode(RandomStatistic(kWideGroups, kTokens, 31), v1::DTYPE_BFLOAT16);
  ASSERT_TRUE(WriteSegment(segment, values));
  const auto wide_decide = [&](const std::string& sequence, int64_t within_ms) {
    v1::DecideRequest request;
    request.set_model_id("wide");
    request.set_sequence_id(sequence);
    // Most pages kept: the call's time is scoring, not the eviction's reply.
    request.mutable_budget()->set_pages_per_group(1000);
    if (within_ms > 0) request.set_answer_within_ms(within_ms);
    v1::LayerStatistic* layer = request.add_layers();
    layer->set_layer(0);
    *layer->mutable_statistic() =
        SharedMemoryStatistic(segment, values.size(), kWideGroups, kTokens, v1::DTYPE_BFLOAT16);
    grpc::ClientContext context;
    v1::DecideResponse response;
    return stub_->Decide(&context, request, &response);
  };
  const auto start = Clock::now();
  const grpc::Status whole = wide_decide("a", 0);
  ASSERT_TRUE(whole.ok()) << whole.error_message();
  const int64_t whole_ms = MsSince(start);
  const v1::PoolStats before = Stats("wide");

  const grpc::Status late = wide_decide("b", std::max<int64_t>(1, whole_ms / 5));
  ::shm_unlink(segment.c_str());
  EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << late.error_message();
  EXPECT_THAT(late.error_message(), HasSubstr("while layers[0] was scored"));
  int scored = -1;
  int of = 0;
  const std::string message = late.error_message();
  const size_t at = message.find("scoring cancelled after ");
  ASSERT_NE(at, std::string::npos) << message;
  ASSERT_EQ(std::sscanf(message.c_str() + at, "scoring cancelled after %d of %d", &scored, &of), 2)
      << message;
  EXPECT_EQ(of, kWideGroups);
  // Without the check between groups the layer ran to its end (1024 of 1024) first.
  EXPECT_LT(scored, kWideGroups) << "the wide layer takes " << whole_ms << " ms";
  RecordProperty("wide_layer_ms", static_cast<int>(whole_ms));
  RecordProperty("groups_scored_before_the_deadline", scored);
  // The only worker is free again: the next call completes.
  grpc::ClientContext context;
  v1::DecideRequest small = DecideAll("small", "s", 100, 2, 7);
  small.mutable_layers()->DeleteSubrange(1, kLayers - 1);
  v1::DecideResponse response;
  ASSERT_TRUE(stub_->Decide(&context, small, &response).ok());
  EXPECT_EQ(Stats("wide").DebugString(), before.DebugString());  // nothing applied for "b"
  ExpectInvariants("wide");
}

}  // namespace
}  // namespace entrokv::service
