// Resource and security cases against the in-process daemon over loopback: models
// come and go without leaking descriptors or metric series, limits answer RESOURCE_EXHAUSTED,
// and nothing changes when a call is refused.
#include <dirent.h>
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
#include "tests/service/service_fixture.h"
#include "tests/service/test_support.h"

namespace entrokv::service {
namespace {

using ::entrokv::service::testing::BytesStatistic;
using ::entrokv::service::testing::CallReflection;
using ::entrokv::service::testing::Encode;
using ::entrokv::service::testing::FindSeries;
using ::entrokv::service::testing::kGroups;
using ::entrokv::service::testing::kHeads;
using ::entrokv::service::testing::kLayers;
using ::entrokv::service::testing::LoopbackOptions;
using ::entrokv::service::testing::RandomStatistic;
using ::entrokv::service::testing::RegisterRequest;
using ::entrokv::service::testing::ServiceTest;
using ::entrokv::service::testing::WriteSegment;
using ::testing::HasSubstr;

int OpenDescriptors() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (const dirent* entry = ::readdir(dir)) count += entry->d_name[0] != '.';
  ::closedir(dir);
  return count;
}

// Series of the daemon's registry carrying the label pool=`pool`.
int SeriesOfPool(const Server& server, const std::string& pool) {
  int count = 0;
  for (const prometheus::MetricFamily& family :
       const_cast<Server&>(server).metrics().registry()->Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        count += label.name == "pool" && label.value == pool;
      }
    }
  }
  return count;
}

class HardeningTest : public ServiceTest {
 protected:
  grpc::Status RegisterStatus(const std::string& model) {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    return stub_->RegisterModel(&context, RegisterRequest(model, kLayers, kHeads, kGroups, 1 << 16),
                                &response);
  }
  grpc::Status Unregister(const std::string& model, bool force, int64_t* closed = nullptr) {
    grpc::ClientContext context;
    v1::UnregisterModelRequest request;
    request.set_model_id(model);
    request.set_force(force);
    v1::UnregisterModelResponse response;
    const grpc::Status status = stub_->UnregisterModel(&context, request, &response);
    if (closed != nullptr) *closed = response.closed_sequences();
    return status;
  }
  // A one-layer Decide of `sequence` (`tokens` long) reading a bf16 statistic from `segment`.
  grpc::Status ShmDecide(const std::string& model, const std::string& sequence, int64_t tokens,
                         const std::string& segment) {
    v1::DecideRequest request;
    request.set_model_id(model);
    request.set_sequence_id(sequence);
    request.mutable_budget()->set_pages_per_group(2);
    v1::LayerStatistic* layer = request.add_layers();
    layer->set_layer(0);
    v1::Statistic* stat = layer->mutable_statistic();
    stat->set_dtype(v1::DTYPE_BFLOAT16);
    stat->set_query_heads(kHeads);
    stat->set_tokens(tokens);
    stat->mutable_shared_memory()->set_segment(segment);
    stat->mutable_shared_memory()->set_length_bytes(static_cast<uint64_t>(kHeads) * tokens * 2);
    grpc::ClientContext context;
    v1::DecideResponse response;
    return stub_->Decide(&context, request, &response);
  }
  // A worker segment holding a random bf16 statistic; unlinked by the caller.
  static std::string MakeSegment(const std::string& tag, int64_t tokens) {
    const std::string name = "/entrokv-" + tag + "-" + std::to_string(::getpid());
    const std::string values = Encode(RandomStatistic(kHeads, tokens, 5), v1::DTYPE_BFLOAT16);
    EXPECT_TRUE(WriteSegment(name, values)) << name;
    return name;
  }
};

// Every model used to keep its arena descriptor for good and add ~84 series.
TEST_F(HardeningTest, UnregisteringModelsReleasesDescriptorsAndSeries) {
  ASSERT_TRUE(RegisterStatus("warm").ok());
  ASSERT_TRUE(Unregister("warm", false).ok());
  const int before = OpenDescriptors();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 300; ++i) {
    const std::string model = absl::StrCat("m", i);
    ASSERT_TRUE(RegisterStatus(model).ok()) << i;
    ASSERT_GT(SeriesOfPool(*server_, model), 0);
    Open(model, "s", 40);
    const grpc::Status refused = Unregister(model, /*force=*/false);
    ASSERT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << i;
    EXPECT_THAT(refused.error_message(), HasSubstr("force"));
    EXPECT_EQ(Stats(model).sequences_active(), 1);  // the refusal changed nothing
    int64_t closed = 0;
    ASSERT_TRUE(Unregister(model, /*force=*/true, &closed).ok()) << i;
    EXPECT_EQ(closed, 1);
    EXPECT_EQ(SeriesOfPool(*server_, model), 0) << model;
  }
  EXPECT_LE(OpenDescriptors(), before + 4);
  EXPECT_EQ(server_->service().registry().size(), 0);
  // The id can be taken again, with a fresh pool.
  ASSERT_TRUE(RegisterStatus("m0").ok());
  EXPECT_EQ(Stats("m0").sequences_active(), 0);
  EXPECT_EQ(Unregister("nope", true).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(HardeningTest, MaxModelsIsAnsweredWithResourceExhausted) {
  ServerOptions options = LoopbackOptions();
  options.max_models = 2;
  Restart(options);
  ASSERT_TRUE(RegisterStatus("a").ok());
  ASSERT_TRUE(RegisterStatus("b").ok());
  const grpc::Status full = RegisterStatus("c");
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("max_models"));
  ASSERT_TRUE(Unregister("a", false).ok());
  EXPECT_TRUE(RegisterStatus("c").ok());
}

// Any /entrokv* segment used to be read, another model's arena included.
TEST_F(HardeningTest, ArenasAreNeverReadAsStatistics) {
  Register("victim");
  Register("m");
  Open("m", "s", 400);
  grpc::ClientContext context;
  v1::GetModelRequest request;
  request.set_model_id("victim");
  v1::GetModelResponse victim;
  ASSERT_TRUE(stub_->GetModel(&context, request, &victim).ok());
  const v1::PoolStats before = Stats("m");
  for (const std::string model : {"victim", "m"}) {  // another model's arena, and its own
    const std::string arena =
        model == "m" ? server_->service().registry().Find("m").value()->state().arena().name
                     : victim.pool().arena_name();
    const grpc::Status status = ShmDecide("m", "s", 400, arena);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("arena"));
  }
  EXPECT_EQ(Stats("m").DebugString(), before.DebugString());
  // An ordinary worker segment still decides.
  const std::string segment = MakeSegment("ok", 400);
  const grpc::Status ok = ShmDecide("m", "s", 400, segment);
  ::shm_unlink(segment.c_str());
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

// A daemon running as root used to read other users' 0600 segments for anyone.
TEST_F(HardeningTest, SegmentsOfOtherUsersNeedAllowedShmUids) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a segment to another uid";
  constexpr uid_t kOther = 4242;
  Register("m");
  Open("m", "s", 400);
  const std::string segment = MakeSegment("foreign", 400);
  const int fd = ::shm_open(segment.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fchown(fd, kOther, kOther), 0);
  ::close(fd);
  const grpc::Status refused = ShmDecide("m", "s", 400, segment);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("allowed_shm_uids"));

  ServerOptions options = LoopbackOptions();
  options.allowed_shm_uids = {kOther};
  Restart(options);
  Register("m");
  Open("m", "s", 400);
  const grpc::Status allowed = ShmDecide("m", "s", 400, segment);
  ::shm_unlink(segment.c_str());
  EXPECT_TRUE(allowed.ok()) << allowed.error_message();
}

// With --reflection, reflection used to answer without the bearer token.
TEST_F(HardeningTest, ReflectionRequiresTheBearerToken) {
  const std::string path = ::testing::TempDir() + "/entrokv_reflection_token";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("tok-456\n", f);
  std::fclose(f);
  ServerOptions options = LoopbackOptions();
  options.token_file = path;
  options.reflection = true;
  Restart(options);
  const grpc::Status anonymous = CallReflection(*channel_);
  EXPECT_THAT(anonymous.error_code(),
              ::testing::AnyOf(grpc::StatusCode::UNAUTHENTICATED, grpc::StatusCode::CANCELLED))
      << anonymous.error_message();
  EXPECT_EQ(CallReflection(*channel_, "wrong").error_code(), anonymous.error_code());
  const grpc::Status with_token = CallReflection(*channel_, "tok-456");
  EXPECT_TRUE(with_token.ok()) << with_token.error_message();
}

// An OpenSequence whose reply exceeded --max_message_bytes used to answer RESOURCE_EXHAUSTED
// but keep the sequence and its frames; a retry got ALREADY_EXISTS.
TEST_F(HardeningTest, OpenSequenceChangesNothingWhenItsReplyCannotBeSent) {
  ServerOptions options = LoopbackOptions();
  options.max_message_bytes = 64 << 10;
  Restart(options);
  Register("m", 64 << 20);
  const v1::PoolStats before = Stats("m");
  // 16,000 tokens: 1000 pages x 8 (layer, group) frames in the reply.
  const grpc::Status status = OpenStatus("m", "big", 16000);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("max_message_bytes"));
  EXPECT_EQ(Stats("m").DebugString(), before.DebugString());
  Open("m", "big", 160);  // the id is free; a smaller prompt fits
  ExpectInvariants("m");
}

// The value of entrokv_rpc_requests_total{method, code}.
double RpcCount(const Server& server, const std::string& method, const std::string& code) {
  const std::optional<prometheus::ClientMetric> series =
      FindSeries(server, "entrokv_rpc_requests_total", {{"method", method}, {"code", code}});
  return series.has_value() ? series->counter.value : -1;
}

// A 1 MB policy name used to come back in the message and break the client's trailer limit.
TEST_F(HardeningTest, ErrorMessagesEchoABoundedPartOfTheInput) {
  Register("m");
  Open("m", "s", 100);
  v1::DecideRequest request = DecideAll("m", "s", 100, 2, 3);
  request.mutable_policy()->set_name(std::string(1 << 20, 'x'));
  grpc::ClientContext context;
  v1::DecideResponse response;
  const grpc::Status status = stub_->Decide(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("policy.name"));
  EXPECT_THAT(status.error_message(), HasSubstr("..."));
  EXPECT_LT(status.error_message().size(), 1000u);
}

// budget.allocator came back whole: 2,018 characters of a 2,000-character name.
TEST_F(HardeningTest, AnUnknownAllocatorIsEchoedWithinTheLimit) {
  Register("m");
  Open("m", "s", 100);
  v1::DecideRequest request = DecideAll("m", "s", 100, 2, 3);
  request.mutable_budget()->set_fraction(0.5);  // the allocator spreads a fraction over layers
  request.mutable_budget()->set_allocator(std::string(2000, 'a'));
  grpc::ClientContext context;
  v1::DecideResponse response;
  const grpc::Status status = stub_->Decide(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("budget.allocator"));
  EXPECT_THAT(status.error_message(), HasSubstr(std::string(200, 'a') + "..."));
  EXPECT_THAT(status.error_message(), ::testing::Not(HasSubstr(std::string(201, 'a'))));
  // A short unknown name is echoed whole, and the known ones still work.
  request.mutable_budget()->set_allocator("adaptive");
  grpc::ClientContext short_context;
  const grpc::Status unknown = stub_->Decide(&short_context, request, &response);
  EXPECT_THAT(unknown.error_message(),
              HasSubstr("'adaptive' is not one of uniform, pyramid, mass"));
  request.mutable_budget()->set_allocator("pyramid");
  grpc::ClientContext known_context;
  const grpc::Status known = stub_->Decide(&known_context, request, &response);
  EXPECT_TRUE(known.ok()) << known.error_message();
}

// An unparsable message in the middle of a DecideStream used to be dropped, and the stream
// ended OK.
TEST_F(HardeningTest, AnUnparsableStreamMessageEndsTheStreamWithInvalidArgument) {
  Register("m");
  Open("m", "s", 100);
  v1::DecideLayerRequest good;
  good.set_model_id("m");
  good.set_sequence_id("s");
  good.mutable_budget()->set_pages_per_group(7);
  good.mutable_layer()->set_layer(0);
  *good.mutable_layer()->mutable_statistic() =
      BytesStatistic(RandomStatistic(kHeads, 100, 9), kHeads, 100, v1::DTYPE_BFLOAT16);
  v1::DecideLayerRequest bad = good;
  bad.set_model_id("\xc3\x28");  // not UTF-8: a proto3 string that does not parse
  grpc::ClientContext context;
  auto stream = stub_->DecideStream(&context);
  v1::LayerDecision decision;
  ASSERT_TRUE(stream->Write(good));
  ASSERT_TRUE(stream->Read(&decision));
  EXPECT_EQ(decision.layer(), 0);
  (void)stream->Write(bad);
  (void)stream->WritesDone();
  while (stream->Read(&decision)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("message 1"));
}

// An unparsable unary request used to get UNIMPLEMENTED with no message, and no metric.
TEST_F(HardeningTest, UnparsableUnaryRequestsAreInvalidArgumentAndCounted) {
  const double before = RpcCount(*server_, "GetModel", "INVALID_ARGUMENT");
  ASSERT_GE(before, 0);
  grpc::ClientContext context;
  v1::GetModelRequest request;
  request.set_model_id("\xc3\x28");
  v1::GetModelResponse response;
  const grpc::Status status = stub_->GetModel(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("GetModel"));
  EXPECT_EQ(RpcCount(*server_, "GetModel", "INVALID_ARGUMENT"), before + 1);
}

// Samples of entrokv_decision_duration_seconds{phase="score"}: one per layer scored.
uint64_t LayersScored(const Server& server) {
  const std::optional<prometheus::ClientMetric> series =
      FindSeries(server, "entrokv_decision_duration_seconds", {{"phase", "score"}});
  return series.has_value() ? series->histogram.sample_count : 0;
}

// A 26-layer request whose client had given up used to score every layer, holding
// the only worker. The deadline is a fifth of what the whole job takes, measured first.
TEST_F(HardeningTest, ADeadlineStopsScoringBetweenLayers) {
  constexpr int kDeepLayers = 26;
  constexpr int kDeepHeads = 32;
  constexpr int64_t kTokens = 32768;
  ServerOptions options = LoopbackOptions();
  options.worker_threads = 1;
  Restart(options);
  {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    ASSERT_TRUE(stub_
                    ->RegisterModel(&context,
                                    RegisterRequest("deep", kDeepLayers, kDeepHeads, 8, 512 << 20),
                                    &response)
                    .ok());
  }
  Open("deep", "a", kTokens);
  Open("deep", "b", kTokens);
  const std::string segment = "/entrokv-deep-" + std::to_string(::getpid());
  const std::string values = Encode(RandomStatistic(kDeepHeads, kTokens, 21), v1::DTYPE_BFLOAT16);
  ASSERT_TRUE(WriteSegment(segment, values)) << segment;
  const auto request = [&](const std::string& sequence, int layers) {
    v1::DecideRequest decide;
    decide.set_model_id("deep");
    decide.set_sequence_id(sequence);
    decide.mutable_budget()->set_pages_per_group(64);
    for (int layer = 0; layer < layers; ++layer) {
      v1::Statistic* stat = decide.add_layers()->mutable_statistic();
      decide.mutable_layers(layer)->set_layer(layer);
      stat->set_dtype(v1::DTYPE_BFLOAT16);
      stat->set_query_heads(kDeepHeads);
      stat->set_tokens(kTokens);
      stat->mutable_shared_memory()->set_segment(segment);
      stat->mutable_shared_memory()->set_length_bytes(values.size());
    }
    return decide;
  };
  const auto decide = [&](const v1::DecideRequest& decide_request, int64_t timeout_ms) {
    grpc::ClientContext context;
    if (timeout_ms > 0) {
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(timeout_ms));
    }
    v1::DecideResponse response;
    return stub_->Decide(&context, decide_request, &response);
  };
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(decide(request("a", kDeepLayers), 0).ok());
  const int64_t whole_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - start)
                               .count();
  const uint64_t before = LayersScored(*server_);
  EXPECT_EQ(before, static_cast<uint64_t>(kDeepLayers));
  const grpc::Status late = decide(request("b", kDeepLayers), std::max<int64_t>(1, whole_ms / 5));
  EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The single worker takes this one only once the cancelled job has let go of it.
  ASSERT_TRUE(decide(request("a", 1), 0).ok());
  ::shm_unlink(segment.c_str());
  const uint64_t cancelled_layers = LayersScored(*server_) - before - 1;
  EXPECT_LT(cancelled_layers, static_cast<uint64_t>(kDeepLayers))
      << "whole job " << whole_ms << " ms";
  RecordProperty("whole_job_ms", static_cast<int>(whole_ms));
  RecordProperty("layers_scored_after_deadline", static_cast<int>(cancelled_layers));
  EXPECT_EQ(Stats("deep").sequences_active(), 2);
  ExpectInvariants("deep");
}

// 2-byte frames in a 256 MiB pool used to make 134M frames of bookkeeping, and sequences per
// model were unbounded.
TEST_F(HardeningTest, PoolFramesAndSequencesPerModelAreBounded) {
  ServerOptions options = LoopbackOptions();
  options.max_pool_frames = 1000;
  options.max_sequences_per_model = 2;
  Restart(options);
  {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    const grpc::Status status = stub_->RegisterModel(
        &context, RegisterRequest("tiny", 1, 1, 1, uint64_t{256} << 20), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(), HasSubstr("max_pool_frames"));
  }
  EXPECT_EQ(server_->service().registry().size(), 0);
  Register("m", 1 << 16);
  Open("m", "a", 16);
  Open("m", "b", 16);
  const v1::PoolStats before = Stats("m");
  const grpc::Status status = OpenStatus("m", "c", 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("max_sequences_per_model"));
  EXPECT_EQ(Stats("m").DebugString(), before.DebugString());
}

}  // namespace
}  // namespace entrokv::service
