// The error codes of the wire contract (docs/service.md, "Errors") with the pool unchanged
// afterwards, and the reliability properties an in-process daemon can show (docs/reliability.md).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"
#include "tests/service/test_support.h"
#include "tests/support/http_get.h"

namespace entrokv::service {
namespace {

using ::entrokv::service::testing::BytesStatistic;
using ::entrokv::service::testing::CallReflection;
using ::entrokv::service::testing::Encode;
using ::entrokv::service::testing::HealthCheck;
using ::entrokv::service::testing::kGroups;
using ::entrokv::service::testing::kHeads;
using ::entrokv::service::testing::kLayers;
using ::entrokv::service::testing::LoopbackOptions;
using ::entrokv::service::testing::MakeChannel;
using ::entrokv::service::testing::RandomStatistic;
using ::entrokv::service::testing::RegisterRequest;
using ::entrokv::service::testing::ServiceTest;
using ::entrokv::testing::HttpGet;
using ::testing::HasSubstr;

struct ErrorCase {
  std::string name;
  std::function<grpc::Status(v1::CacheManager::Stub&)> call;
  grpc::StatusCode code;
  std::string field;
};

v1::DecideRequest OneLayer(int64_t tokens, v1::DType dtype = v1::DTYPE_FLOAT32) {
  v1::DecideRequest request;
  request.set_model_id("m");
  request.set_sequence_id("s");
  request.mutable_budget()->set_pages_per_group(2);
  v1::LayerStatistic* in = request.add_layers();
  in->set_layer(0);
  *in->mutable_statistic() =
      BytesStatistic(RandomStatistic(kHeads, tokens, 3), kHeads, tokens, dtype);
  return request;
}

grpc::Status Decide(v1::CacheManager::Stub& stub, const v1::DecideRequest& request) {
  grpc::ClientContext context;
  v1::DecideResponse response;
  return stub.Decide(&context, request, &response);
}

// Everything a client can observe of the pool, serialized, for before/after comparisons.
std::string Snapshot(v1::CacheManager::Stub& stub) {
  grpc::ClientContext stats_context;
  v1::GetPoolStatsRequest stats_request;
  stats_request.set_model_id("m");
  v1::PoolStats stats;
  EXPECT_TRUE(stub.GetPoolStats(&stats_context, stats_request, &stats).ok());
  // A refused admission is counted (entrokv_admissions_total): the count is what it changes,
  // never the pool.
  stats.clear_admissions_delayed_total();
  stats.clear_admissions_refused_total();
  grpc::ClientContext list_context;
  v1::ListSequencesRequest list_request;
  list_request.set_model_id("m");
  list_request.set_include_block_tables(true);
  v1::ListSequencesResponse list;
  EXPECT_TRUE(stub.ListSequences(&list_context, list_request, &list).ok());
  return stats.SerializeAsString() + "|" + list.SerializeAsString();
}

std::vector<ErrorCase> ErrorCases() {
  std::vector<ErrorCase> cases;
  auto add = [&cases](std::string name, grpc::StatusCode code, std::string field,
                      std::function<grpc::Status(v1::CacheManager::Stub&)> call) {
    cases.push_back({std::move(name), std::move(call), code, std::move(field)});
  };
  using C = grpc::StatusCode;
  auto reg = [](v1::RegisterModelRequest request) {
    return [request](v1::CacheManager::Stub& stub) {
      grpc::ClientContext context;
      v1::RegisterModelResponse response;
      return stub.RegisterModel(&context, request, &response);
    };
  };
  add("register empty id", C::INVALID_ARGUMENT, "model_id",
      reg(RegisterRequest("", kLayers, kHeads, kGroups, 1 << 20)));
  add("register duplicate", C::ALREADY_EXISTS, "model_id",
      reg(RegisterRequest("m", kLayers, kHeads, kGroups, 1 << 20)));
  add("register heads not a multiple", C::INVALID_ARGUMENT, "query_heads",
      reg(RegisterRequest("x", kLayers, 3, 2, 1 << 20)));
  add("register huge layers", C::INVALID_ARGUMENT, "geometry.layers",
      reg(RegisterRequest("x", std::numeric_limits<int>::max(), kHeads, kGroups, 1 << 20)));
  add("register beyond the daemon capacity", C::RESOURCE_EXHAUSTED, "capacity_bytes",
      reg(RegisterRequest("x", kLayers, kHeads, kGroups, uint64_t{1} << 40)));
  add("get unknown model", C::NOT_FOUND, "model_id", [](v1::CacheManager::Stub& stub) {
    grpc::ClientContext context;
    v1::GetModelRequest request;
    request.set_model_id("nope");
    v1::GetModelResponse response;
    return stub.GetModel(&context, request, &response);
  });
  auto open = [](std::string id, int64_t tokens, std::string parent = "") {
    return [=](v1::CacheManager::Stub& stub) {
      grpc::ClientContext context;
      v1::OpenSequenceRequest request;
      request.set_model_id("m");
      request.set_sequence_id(id);
      request.set_initial_tokens(tokens);
      request.set_parent_sequence_id(parent);
      v1::OpenSequenceResponse response;
      return stub.OpenSequence(&context, request, &response);
    };
  };
  add("open duplicate", C::ALREADY_EXISTS, "s", open("s", 10));
  add("open empty id", C::INVALID_ARGUMENT, "sequence_id", open("", 10));
  add("open negative tokens", C::INVALID_ARGUMENT, "initial_tokens", open("t", -1));
  add("open more than the pool holds", C::RESOURCE_EXHAUSTED, "", open("t", 1 << 20));
  add("fork unknown parent", C::NOT_FOUND, "", open("t", 0, "ghost"));
  auto append = [](std::string id, int64_t tokens) {
    return [=](v1::CacheManager::Stub& stub) {
      grpc::ClientContext context;
      v1::AppendTokensRequest request;
      request.set_model_id("m");
      request.set_sequence_id(id);
      request.set_tokens(tokens);
      v1::AppendTokensResponse response;
      return stub.AppendTokens(&context, request, &response);
    };
  };
  add("append zero", C::INVALID_ARGUMENT, "tokens", append("s", 0));
  add("append unknown", C::NOT_FOUND, "", append("ghost", 1));
  add("append beyond the pool", C::RESOURCE_EXHAUSTED, "", append("s", 1 << 20));
  auto decide = [](std::function<void(v1::DecideRequest&)> mutate) {
    return [mutate](v1::CacheManager::Stub& stub) {
      v1::DecideRequest request = OneLayer(100);
      mutate(request);
      return Decide(stub, request);
    };
  };
  add("decide unknown sequence", C::NOT_FOUND, "",
      decide([](v1::DecideRequest& r) { r.set_sequence_id("ghost"); }));
  add("decide unknown model", C::NOT_FOUND, "model_id",
      decide([](v1::DecideRequest& r) { r.set_model_id("ghost"); }));
  add("decide no budget", C::INVALID_ARGUMENT, "budget",
      decide([](v1::DecideRequest& r) { r.clear_budget(); }));
  add("decide zero pages", C::INVALID_ARGUMENT, "pages_per_group",
      decide([](v1::DecideRequest& r) { r.mutable_budget()->set_pages_per_group(0); }));
  add("decide no layers", C::INVALID_ARGUMENT, "layers",
      decide([](v1::DecideRequest& r) { r.clear_layers(); }));
  add("decide unspecified dtype", C::INVALID_ARGUMENT, "dtype", decide([](v1::DecideRequest& r) {
        r.mutable_layers(0)->mutable_statistic()->set_dtype(v1::DTYPE_UNSPECIFIED);
      }));
  add("decide short data", C::INVALID_ARGUMENT, "data", decide([](v1::DecideRequest& r) {
        r.mutable_layers(0)->mutable_statistic()->mutable_data()->resize(10);
      }));
  add("decide dtype does not match the bytes", C::INVALID_ARGUMENT, "data",
      decide([](v1::DecideRequest& r) {
        r.mutable_layers(0)->mutable_statistic()->set_dtype(v1::DTYPE_BFLOAT16);
      }));
  add("decide wrong heads", C::INVALID_ARGUMENT, "query_heads", decide([](v1::DecideRequest& r) {
        r.mutable_layers(0)->mutable_statistic()->set_query_heads(2);
      }));
  add("decide overflowing tokens", C::INVALID_ARGUMENT, "tokens", decide([](v1::DecideRequest& r) {
        r.mutable_layers(0)->mutable_statistic()->set_tokens(int64_t{1} << 62);
      }));
  // Every handler shares one token bound, [.., 2^31 - 1]: 2^31 is out of range everywhere.
  add("decide tokens one past the bound", C::INVALID_ARGUMENT, "2147483647",
      decide([](v1::DecideRequest& r) {
        r.mutable_layers(0)->mutable_statistic()->set_tokens(int64_t{1} << 31);
      }));
  add("open tokens one past the bound", C::INVALID_ARGUMENT, "2147483647",
      open("t", int64_t{1} << 31));
  add("append tokens one past the bound", C::INVALID_ARGUMENT, "2147483647",
      append("s", int64_t{1} << 31));
  add("decide tokens differ from the sequence", C::FAILED_PRECONDITION, "tokens",
      [](v1::CacheManager::Stub& stub) { return Decide(stub, OneLayer(99)); });
  add("decide layer out of range", C::INVALID_ARGUMENT, "layer",
      decide([](v1::DecideRequest& r) { r.mutable_layers(0)->set_layer(kLayers); }));
  add("decide duplicate layer", C::INVALID_ARGUMENT, "twice",
      decide([](v1::DecideRequest& r) { *r.add_layers() = r.layers(0); }));
  add("decide unknown policy", C::INVALID_ARGUMENT, "policy.name",
      decide([](v1::DecideRequest& r) { r.mutable_policy()->set_name("nope"); }));
  add("decide bad tau", C::INVALID_ARGUMENT, "policy.tau",
      decide([](v1::DecideRequest& r) { r.mutable_policy()->set_tau(-1); }));
  add("decide no cached weights", C::FAILED_PRECONDITION, "use_cached_weights",
      decide([](v1::DecideRequest& r) { r.set_use_cached_weights(true); }));
  auto poison = [](float value) {
    return [value](v1::DecideRequest& r) {
      // Layer 1 is bad, layer 0 good: nothing may be applied.
      v1::LayerStatistic* bad = r.add_layers();
      *bad = r.layers(0);
      bad->set_layer(1);
      std::vector<float> values = RandomStatistic(kHeads, 100, 4);
      values[123] = value;
      bad->mutable_statistic()->set_data(Encode(values, v1::DTYPE_FLOAT32));
    };
  };
  add("decide NaN in the second layer", C::INVALID_ARGUMENT, "layers[1]",
      decide(poison(std::nanf(""))));
  add("decide negative value", C::INVALID_ARGUMENT, "layers[1]", decide(poison(-1.0f)));
  add("decide bad segment name", C::INVALID_ARGUMENT, "segment", decide([](v1::DecideRequest& r) {
        v1::Statistic* stat = r.mutable_layers(0)->mutable_statistic();
        stat->mutable_shared_memory()->set_segment("/etc-passwd");
        stat->mutable_shared_memory()->set_length_bytes(kHeads * 100 * 4);
      }));
  add("decide missing segment", C::NOT_FOUND, "segment", decide([](v1::DecideRequest& r) {
        v1::Statistic* stat = r.mutable_layers(0)->mutable_statistic();
        stat->mutable_shared_memory()->set_segment("/entrokv-no-such-segment");
        stat->mutable_shared_memory()->set_length_bytes(kHeads * 100 * 4);
      }));
  add("close unknown", C::NOT_FOUND, "", [](v1::CacheManager::Stub& stub) {
    grpc::ClientContext context;
    v1::CloseSequenceRequest request;
    request.set_model_id("m");
    request.set_sequence_id("ghost");
    v1::CloseSequenceResponse response;
    return stub.CloseSequence(&context, request, &response);
  });
  add("list unknown model", C::NOT_FOUND, "model_id", [](v1::CacheManager::Stub& stub) {
    grpc::ClientContext context;
    v1::ListSequencesRequest request;
    request.set_model_id("ghost");
    v1::ListSequencesResponse response;
    return stub.ListSequences(&context, request, &response);
  });
  return cases;
}

TEST_F(ServiceTest, EveryErrorCodeLeavesThePoolUnchanged) {
  Register("m", 1 << 20);
  Open("m", "s", 100);
  for (const ErrorCase& c : ErrorCases()) {
    const std::string before = Snapshot(*stub_);
    const grpc::Status status = c.call(*stub_);
    EXPECT_EQ(status.error_code(), c.code) << c.name << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.field)) << c.name;
    EXPECT_EQ(Snapshot(*stub_), before) << c.name;
  }
  ExpectInvariants("m");
}

TEST_F(ServiceTest, SharedMemoryStatisticDecidesLikeBytes) {
  Register("m");
  Open("m", "a", 400);
  Open("m", "b", 400);
  const std::vector<float> values = RandomStatistic(kHeads, 400, 11);
  const std::string encoded = Encode(values, v1::DTYPE_BFLOAT16);
  const std::string name = "/entrokv-test-" + std::to_string(::getpid());
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 64 + encoded.size()), 0);
  ASSERT_EQ(::pwrite(fd, encoded.data(), encoded.size(), 64), static_cast<ssize_t>(encoded.size()));
  ::close(fd);

  v1::DecideRequest by_bytes;
  by_bytes.set_model_id("m");
  by_bytes.set_sequence_id("a");
  by_bytes.mutable_budget()->set_pages_per_group(6);
  v1::LayerStatistic* in = by_bytes.add_layers();
  in->set_layer(2);
  *in->mutable_statistic() = BytesStatistic(values, kHeads, 400, v1::DTYPE_BFLOAT16);
  v1::DecideRequest by_shm = by_bytes;
  by_shm.set_sequence_id("b");
  v1::SharedMemoryRegion* region =
      by_shm.mutable_layers(0)->mutable_statistic()->mutable_shared_memory();
  region->set_segment(name);
  region->set_offset_bytes(64);
  region->set_length_bytes(encoded.size());

  grpc::ClientContext c1, c2;
  v1::DecideResponse r1, r2;
  ASSERT_TRUE(stub_->Decide(&c1, by_bytes, &r1).ok());
  const grpc::Status status = stub_->Decide(&c2, by_shm, &r2);
  ::shm_unlink(name.c_str());
  ASSERT_TRUE(status.ok()) << status.error_message();
  for (int g = 0; g < kGroups; ++g) {
    EXPECT_EQ(r1.layers(0).groups(g).kept_pages().size(), 6);
    EXPECT_THAT(r2.layers(0).groups(g).kept_pages(),
                ::testing::ElementsAreArray(r1.layers(0).groups(g).kept_pages()));
  }
}

TEST_F(ServiceTest, OversizeMessageFailsFastAndTheChannelKeepsWorking) {
  ServerOptions options = LoopbackOptions();
  options.max_message_bytes = 64 << 10;
  Restart(options);
  Register("m");
  Open("m", "s", 100);
  v1::DecideRequest request = OneLayer(100);
  request.mutable_layers(0)->mutable_statistic()->mutable_data()->resize(64 << 10);
  EXPECT_EQ(Decide(*stub_, request).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Decide(*stub_, OneLayer(100)).ok());
}

TEST_F(ServiceTest, DeadlineExceededAppliesNothing) {
  Register("m");
  Open("m", "s", 400);
  const std::string before = Snapshot(*stub_);
  // The decision is held after scoring until the client has seen its deadline pass, so the
  // worker meets an expired call exactly where it would apply: whatever the timing, the call
  // is cancelled there and nothing may change.
  absl::Notification reached;
  absl::Notification client_done;
  std::atomic<bool> server_saw_cancel{false};
  server_->service().decider().SetBeforeApplyHookForTest(
      [&](const std::function<bool()>& cancelled) {
        reached.Notify();
        client_done.WaitForNotification();
        // The client's deadline reaches the server asynchronously: wait until it has (bounded;
        // a wait for a condition, not a guess at a duration).
        const absl::Time limit = absl::Now() + absl::Seconds(30);
        while (!cancelled() && absl::Now() < limit) absl::SleepFor(absl::Milliseconds(1));
        server_saw_cancel = cancelled();
      });
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::DecideResponse response;
  const grpc::Status status = stub_->Decide(&context, DecideAll("m", "s", 400, 4, 1), &response);
  client_done.Notify();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The decision was scored and reached the apply step (a hang here would be a bug: fail).
  ASSERT_TRUE(reached.WaitForNotificationWithTimeout(absl::Seconds(60)));
  server_->WaitIdle();  // and the worker is done with it
  EXPECT_TRUE(server_saw_cancel.load());
  server_->service().decider().SetBeforeApplyHookForTest(nullptr);
  EXPECT_EQ(Snapshot(*stub_), before);
  ExpectInvariants("m");
}

TEST_F(ServiceTest, OverloadIsShedAtOnce) {
  ServerOptions options = LoopbackOptions();
  options.worker_threads = 1;
  options.max_inflight_decisions = 1;
  Restart(options);
  Register("m");
  Open("m", "s", 400);
  // The first decision takes the only slot and is held there; every call arriving meanwhile
  // must be shed with RESOURCE_EXHAUSTED and answered while the first is still held, i.e. at
  // once rather than queued behind it.
  absl::Notification running;
  absl::Notification release;
  server_->service().decider().SetBeforeApplyHookForTest([&](const std::function<bool()>&) {
    running.Notify();
    release.WaitForNotification();
  });
  const v1::DecideRequest request = DecideAll("m", "s", 400, 4, 1);
  grpc::ClientContext first_context;
  v1::DecideResponse first_response;
  grpc::Status first_status;
  absl::Notification first_done;
  stub_->async()->Decide(&first_context, &request, &first_response, [&](grpc::Status status) {
    first_status = std::move(status);
    first_done.Notify();
  });
  running.WaitForNotification();
  constexpr int kShed = 7;
  for (int i = 0; i < kShed; ++i) {
    grpc::ClientContext context;
    v1::DecideResponse response;
    const grpc::Status status = stub_->Decide(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << i;
    EXPECT_THAT(status.error_message(), HasSubstr("max_inflight_decisions")) << i;
  }
  EXPECT_FALSE(first_done.HasBeenNotified()) << "the shed calls waited for the admitted one";
  release.Notify();
  first_done.WaitForNotification();
  server_->service().decider().SetBeforeApplyHookForTest(nullptr);
  EXPECT_TRUE(first_status.ok()) << first_status.error_message();
  ExpectInvariants("m");
}

// A call racing a multi-layer Decide. The pool's decision hook runs the racing
// AppendTokens or CloseSequence right after a decision was applied (outside the pool's lock),
// which is exactly where a per-layer apply let it in between two layers. The decision must be
// all or nothing: either it succeeds with every layer applied and every freed frame in the
// response, or it fails and applied nothing.
TEST_F(ServiceTest, RacingCallSeesADecisionAppliedWhollyOrNotAtAll) {
  enum class Racer { kAppend, kClose };
  for (const Racer racer : {Racer::kAppend, Racer::kClose}) {
    const std::string model = racer == Racer::kAppend ? "append" : "close";
    SCOPED_TRACE(model);
    Register(model);
    const int64_t tokens = 200;  // 13 pages of 16
    Open(model, "s", tokens);
    absl::StatusOr<std::shared_ptr<Model>> found = server_->service().registry().Find(model);
    ASSERT_TRUE(found.ok());
    std::atomic<bool> raced{false};
    grpc::Status race_status;
    (*found)->state().SetDecisionHookForTest([&] {
      if (raced.exchange(true)) return;  // once: the racer's own effects must not recurse
      grpc::ClientContext context;
      if (racer == Racer::kAppend) {
        v1::AppendTokensRequest request;
        request.set_model_id(model);
        request.set_sequence_id("s");
        request.set_tokens(1);
        v1::AppendTokensResponse response;
        race_status = stub_->AppendTokens(&context, request, &response);
      } else {
        v1::CloseSequenceRequest request;
        request.set_model_id(model);
        request.set_sequence_id("s");
        v1::CloseSequenceResponse response;
        race_status = stub_->CloseSequence(&context, request, &response);
      }
    });
    const v1::DecideRequest request = DecideAll(model, "s", tokens, /*pages=*/4, /*seed=*/7);
    grpc::ClientContext context;
    v1::DecideResponse response;
    const grpc::Status status = stub_->Decide(&context, request, &response);
    (*found)->state().SetDecisionHookForTest(nullptr);
    ASSERT_TRUE(raced.load()) << "the hook never ran: no decision was applied";
    EXPECT_TRUE(race_status.ok()) << race_status.error_message();
    const v1::PoolStats stats = Stats(model);
    if (status.ok()) {
      // Every layer applied, and the response accounts for every frame the pool freed.
      ASSERT_EQ(response.layers_size(), kLayers);
      int64_t freed = 0;
      int64_t evicted = 0;
      for (const v1::LayerDecision& layer : response.layers()) {
        freed += layer.freed_frames_size();
        for (const v1::GroupDecision& group : layer.groups()) {
          evicted += group.evicted_pages_size();
        }
      }
      EXPECT_EQ(evicted, kLayers * kGroups * (13 - 4));
      EXPECT_EQ(freed, stats.frames_freed_total());
      EXPECT_EQ(evicted, stats.pages_evicted_total());
    } else {
      // Failed: then nothing was applied.
      EXPECT_EQ(stats.pages_evicted_total(), 0) << status.error_message();
      EXPECT_EQ(stats.frames_freed_total(), 0) << status.error_message();
    }
    ExpectInvariants(model);
  }
}

TEST_F(ServiceTest, ReflectionIsOffByDefaultAndOnWhenAsked) {
  EXPECT_EQ(CallReflection(*channel_).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  ServerOptions options = LoopbackOptions();
  options.reflection = true;
  Restart(options);
  const grpc::Status status = CallReflection(*channel_);
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
}

TEST_F(ServiceTest, BearerTokenIsRequiredExceptForHealth) {
  const std::string path = ::testing::TempDir() + "/entrokv_token";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("tok-123\n", f);
  std::fclose(f);
  ServerOptions options = LoopbackOptions();
  options.token_file = path;
  Restart(options);
  v1::GetModelRequest request;
  request.set_model_id("ghost");
  v1::GetModelResponse response;
  {
    grpc::ClientContext context;
    EXPECT_EQ(stub_->GetModel(&context, request, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer wrong");
    EXPECT_EQ(stub_->GetModel(&context, request, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer tok-123");
    EXPECT_EQ(stub_->GetModel(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);  // authenticated; the model is unknown
  }
  EXPECT_EQ(HealthCheck(*channel_, ""), 1);
}

TEST_F(ServiceTest, DrainingRefusesNewCallsAndFlipsReadinessOnly) {  // in-process
  EXPECT_EQ(HealthCheck(*channel_, ""), 1);
  EXPECT_EQ(HealthCheck(*channel_, kServiceHealthName), 1);
  EXPECT_EQ(HealthCheck(*channel_, kLivenessHealthName), 1);
  server_->BeginDrain();
  EXPECT_EQ(HealthCheck(*channel_, ""), 2);
  EXPECT_EQ(HealthCheck(*channel_, kServiceHealthName), 2);
  EXPECT_EQ(HealthCheck(*channel_, kLivenessHealthName), 1);
  grpc::ClientContext context;
  v1::RegisterModelResponse response;
  EXPECT_EQ(stub_->RegisterModel(&context, RegisterRequest("m", 2, 2, 1, 1 << 20), &response)
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(ServiceTest, MetricSeriesStayBoundedOverManySequences) {
  ServerOptions options = LoopbackOptions();
  options.metrics_listen = "127.0.0.1:0";
  Restart(options);
  Register("m", 16 << 20);
  Open("m", "warm", 64);
  grpc::ClientContext warm_context;
  v1::DecideResponse warm;
  ASSERT_TRUE(stub_
                  ->Decide(
                      &warm_context,
                      [] {
                        v1::DecideRequest r = OneLayer(64);
                        r.set_sequence_id("warm");
                        return r;
                      }(),
                      &warm)
                  .ok());
  auto count_series = [this] {
    const std::string text = HttpGet(server_->metrics_port(), "/metrics").value_or("");
    int series = 0;
    for (size_t at = 0; (at = text.find('\n', at)) != std::string::npos; ++at) {
      if (at + 1 < text.size() && text[at + 1] != '#') ++series;
    }
    return series;
  };
  const int before = count_series();
  ASSERT_GT(before, 100);
  for (int i = 0; i < 2000; ++i) {
    const std::string id = "seq-" + std::to_string(i);
    Open("m", id, 20);
    grpc::ClientContext context;
    v1::CloseSequenceRequest close;
    close.set_model_id("m");
    close.set_sequence_id(id);
    v1::CloseSequenceResponse closed;
    ASSERT_TRUE(stub_->CloseSequence(&context, close, &closed).ok());
  }
  ENTROKV_ASSERT_OK_AND_ASSIGN(const std::string text,
                               HttpGet(server_->metrics_port(), "/metrics"));
  EXPECT_EQ(count_series(), before);
  EXPECT_THAT(text, ::testing::Not(HasSubstr("seq-")));
}

}  // namespace
}  // namespace entrokv::service
