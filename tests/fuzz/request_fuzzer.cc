// Every request validator: fuzzed serialized requests of every RPC, parsed as gRPC would, then
// run through the handlers' own bodies (CacheManagerService::Do*, and FindModel plus
// Decider::Decide / DecideLayer for the two decision calls) against a real service with a small
// model and an open sequence; no gRPC server. Checked after every request: a refused request
// changed nothing (every model's stats and block tables), used + free == capacity, and an error
// message stays short (it travels in a trailer).
//
// Input: up to 8 requests, each a selector byte (the RPC), then a u16-length-prefixed
// serialized request. A statistic's shared_memory.segment "$stat" names this target's own
// segment of positive float32 values (its real name carries the process id).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/util/log.h"
#include "entrokv/v1/cache_manager.pb.h"
#include "service/arena_names.h"
#include "service/cache_manager_service.h"
#include "service/metrics.h"
#include "service/options.h"
#include "service/worker_pool.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_input.h"

namespace entrokv::fuzz {
namespace {

namespace v1 = ::entrokv::v1;
using service::CacheManagerService;

constexpr size_t kStatBytes = 1 << 16;
constexpr size_t kMaxMessageChars = 2048;

// The statistic segment, made once per process and removed at exit.
const std::string& StatSegment() {
  static const std::string* name = [] {
    auto* made = new std::string(absl::StrCat("/entrokv_fuzz_request.", ::getpid()));
    const int fd = ::shm_open(made->c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::ftruncate(fd, kStatBytes) != 0) std::abort();
    std::vector<float> values(kStatBytes / sizeof(float));
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.001f * static_cast<float>(i % 997);
    if (::pwrite(fd, values.data(), kStatBytes, 0) != static_cast<ssize_t>(kStatBytes)) {
      std::abort();
    }
    ::close(fd);
    std::atexit([] { ::shm_unlink(StatSegment().c_str()); });
    return made;
  }();
  return *name;
}

void UseStatSegment(v1::LayerStatistic& layer) {
  if (layer.has_statistic() && layer.statistic().has_shared_memory() &&
      layer.statistic().shared_memory().segment() == "$stat") {
    layer.mutable_statistic()->mutable_shared_memory()->set_segment(StatSegment());
  }
}

// Everything a request may change, as text: each model's pool stats and sequences with their
// block tables.
std::string Snapshot(CacheManagerService& service) {
  std::string out;
  for (const std::shared_ptr<service::Model>& model : service.registry().All()) {
    const PoolStats stats = model->state().Stats();
    absl::StrAppend(&out, model->id(), " used=", stats.used_frames, " free=", stats.free_frames,
                    " sequences=", stats.sequences_active, " lost=", stats.sequences_lost, "\n");
    for (const SequenceInfo& info : model->state().ListSequences(/*with_block_tables=*/true)) {
      absl::StrAppend(&out, "  ", info.id, " length=", info.length, ":");
      for (const auto& layer : info.block_tables) {
        for (const auto& group : layer) {
          for (const FrameId frame : group) absl::StrAppend(&out, " ", frame);
          out += " |";
        }
      }
      out += "\n";
    }
  }
  return out;
}

void CheckPools(CacheManagerService& service) {
  for (const std::shared_ptr<service::Model>& model : service.registry().All()) {
    const PoolStats stats = model->state().Stats();
    FUZZ_CHECK(stats.used_frames + stats.free_frames == stats.capacity_frames,
               absl::StrCat(model->id(), ": ", stats.used_frames, " + ", stats.free_frames,
                            " != ", stats.capacity_frames));
  }
}

template <typename Request>
bool Parse(const std::string& bytes, Request* request) {
  return request->ParseFromString(bytes);  // what gRPC does before a handler runs
}

// Runs one request; nullopt when it does not parse (gRPC refuses it before any handler).
std::optional<absl::Status> Run(CacheManagerService& service, uint8_t selector,
                                const std::string& bytes) {
  const auto never_cancelled = [] { return false; };
  switch (selector % 14) {
    case 0: {
      v1::RegisterModelRequest request;
      v1::RegisterModelResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoRegisterModel(request, &response);
    }
    case 1: {
      v1::GetModelRequest request;
      v1::GetModelResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoGetModel(request, &response);
    }
    case 2: {
      v1::ListModelsRequest request;
      v1::ListModelsResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoListModels(request, &response);
    }
    case 3: {
      v1::OpenSequenceRequest request;
      v1::OpenSequenceResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoOpenSequence(request, &response);
    }
    case 4: {
      v1::AppendTokensRequest request;
      v1::AppendTokensResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoAppendTokens(request, &response);
    }
    case 5: {
      v1::DecideRequest request;
      v1::DecideResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      for (v1::LayerStatistic& layer : *request.mutable_layers()) UseStatSegment(layer);
      absl::StatusOr<std::shared_ptr<service::Model>> model = service.FindModel(request.model_id());
      if (!model.ok()) return model.status();
      return service.decider().Decide(**model, request, never_cancelled, &response);
    }
    case 6: {
      v1::DecideLayerRequest request;
      v1::LayerDecision response;
      if (!Parse(bytes, &request)) return std::nullopt;
      if (request.has_layer()) UseStatSegment(*request.mutable_layer());
      absl::StatusOr<std::shared_ptr<service::Model>> model = service.FindModel(request.model_id());
      if (!model.ok()) return model.status();
      return service.decider().DecideLayer(**model, request, never_cancelled, &response);
    }
    case 7: {
      v1::CloseSequenceRequest request;
      v1::CloseSequenceResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoCloseSequence(request, &response);
    }
    case 8: {
      v1::GetPoolStatsRequest request;
      v1::PoolStats response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoGetPoolStats(request, &response);
    }
    case 9: {
      v1::ListSequencesRequest request;
      v1::ListSequencesResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoListSequences(request, &response);
    }
    case 10: {
      v1::UnregisterModelRequest request;
      v1::UnregisterModelResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoUnregisterModel(request, &response);
    }
    case 11: {
      v1::TruncateSequenceRequest request;
      v1::TruncateSequenceResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoTruncateSequence(request, &response);
    }
    case 12: {
      v1::SwapOutSequenceRequest request;
      v1::SwapOutSequenceResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoSwapOutSequence(request, &response);
    }
    default: {
      v1::ResumeSequenceRequest request;
      v1::ResumeSequenceResponse response;
      if (!Parse(bytes, &request)) return std::nullopt;
      return service.DoResumeSequence(request, &response);
    }
  }
}

// The service every input starts from: model "m" (2 layers, 4 query heads in 2 KV groups,
// 4-token pages, 2048 frames) with sequence "s" of 10 tokens.
struct World {
  World() {
    absl::StatusOr<std::unique_ptr<service::ArenaNamer>> locked =
        service::ArenaNamer::ForState(absl::StrCat("f", ::getpid()));
    FUZZ_CHECK(locked.ok(), locked.status().ToString());
    namer = *std::move(locked);
    options.pool_capacity_bytes = int64_t{1} << 20;
    options.max_models = 4;
    options.max_sequences_per_model = 64;
    service = std::make_unique<CacheManagerService>(options, "", &metrics, &workers);
    service->registry().UseArenaNames(namer.get());
    v1::RegisterModelRequest model;
    model.set_model_id("m");
    model.mutable_geometry()->set_layers(2);
    model.mutable_geometry()->set_query_heads(4);
    model.mutable_geometry()->set_kv_groups(2);
    model.mutable_geometry()->set_head_dim(8);
    model.mutable_geometry()->set_page_size(4);
    model.mutable_geometry()->set_element_bytes(2);
    model.set_capacity_bytes(2048 * 128);
    v1::RegisterModelResponse registered;
    v1::OpenSequenceRequest sequence;
    sequence.set_model_id("m");
    sequence.set_sequence_id("s");
    sequence.set_initial_tokens(10);
    v1::OpenSequenceResponse opened;
    if (!service->DoRegisterModel(model, &registered).ok() ||
        !service->DoOpenSequence(sequence, &opened).ok()) {
      std::abort();
    }
  }
  ~World() {
    service.reset();
    namer->RemoveUnused({});
  }

  service::ServerOptions options;
  service::ServiceMetrics metrics;
  service::WorkerPool workers{1, 1};
  std::unique_ptr<service::ArenaNamer> namer;
  std::unique_ptr<CacheManagerService> service;
};

}  // namespace
}  // namespace entrokv::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace entrokv;
  static const bool quiet = [] {
    SetMinLogLevel(LogLevel::kError);  // registrations log at INFO
    return true;
  }();
  (void)quiet;
  fuzz::FuzzInput input(data, size);
  fuzz::World world;
  for (int i = 0; i < 8 && input.remaining() > 0; ++i) {
    const uint8_t selector = input.TakeByte();
    const std::string bytes = input.TakeLengthPrefixed();
    const std::string before = fuzz::Snapshot(*world.service);
    const std::optional<absl::Status> status = fuzz::Run(*world.service, selector, bytes);
    fuzz::CheckPools(*world.service);
    if (!status.has_value() || status->ok()) continue;
    FUZZ_CHECK(status->message().size() <= fuzz::kMaxMessageChars,
               absl::StrCat("a ", status->message().size(),
                            "-character error message: ", status->message().substr(0, 300)));
    FUZZ_CHECK(fuzz::Snapshot(*world.service) == before,
               absl::StrCat("refused with ", status->ToString(), " but the state changed:\n",
                            before, "->\n", fuzz::Snapshot(*world.service)));
  }
  return 0;
}
