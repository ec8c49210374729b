// Loopback load: N concurrent DecideStream workers send per-layer bfloat16 statistics of the
// Qwen2.5-1.5B shape (28 layers, 12 query heads, 2 KV groups) at T = 32768 to an in-process
// entrokvd on 127.0.0.1:0, inline (`bytes`) or by shared-memory reference. Reports decisions/s,
// p50/p99 per-layer latency, and the ratio to the in-process core time (the daemon's scorer on the
// same statistic, same options, one thread).
//
// Usage: service_load_bench [seconds_per_run=2] [out_prefix=bench/results/service_load]
// ENTROKV_BENCH_STATE_DIR=dir runs the daemon with --state_dir=dir (an empty directory); its arena
// stays in /dev/shm as /entrokv.d<instance>.* (kept for a restart): remove it with the directory.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/scoring/decision.h"
#include "core/scoring/fused_scorer.h"
#include "core/util/dtype.h"
#include "core/util/json.h"
#include "entrokv/v1/cache_manager.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "service/server.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = entrokv::v1;

constexpr int kLayers = 28;
constexpr int kHeads = 12;
constexpr int kGroups = 2;
constexpr int64_t kTokens = 32768;
constexpr int kPageSize = 16;
constexpr double kFraction = 0.2;

struct RunResult {
  std::string source;
  int streams = 0;
  int64_t decisions = 0;
  double seconds = 0;
  double p50_ms = 0;
  double p99_ms = 0;
};

std::vector<std::string> MakeStatistics() {
  std::mt19937 rng(20240601);
  std::exponential_distribution<float> draw(1.0f);
  std::vector<std::string> layers(kLayers);
  for (std::string& layer : layers) {
    layer.resize(static_cast<size_t>(kHeads) * kTokens * 2);
    for (int64_t i = 0; i < kHeads * kTokens; ++i) {
      const uint16_t bits = entrokv::FloatToBFloat16(draw(rng) * draw(rng));
      std::memcpy(&layer[i * 2], &bits, 2);
    }
  }
  return layers;
}

// Median of several passes over all layers of the scorer the daemon runs (FusedScorer, with
// the measurements on), per layer, in ms.
double CoreMsPerLayer(const std::vector<std::string>& layers) {
  entrokv::PolicyOptions options;
  options.page_size = kPageSize;
  options.protections.tail_page = true;
  const entrokv::Policy& policy = **entrokv::FindPolicy("page_entrokv");
  const int64_t quota = static_cast<int64_t>(kFraction * kTokens / kPageSize);
  std::vector<double> passes;
  entrokv::FusedScorer scorer(options);
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = Clock::now();
    for (const std::string& layer : layers) {
      const entrokv::LayerRequest request = entrokv::LayerRequestFor(
          *entrokv::StatisticView::Create(layer.data(), entrokv::DType::kBFloat16, kHeads, kTokens),
          kHeads, kGroups, kTokens, quota);
      if (!scorer.DecideLayer(policy, request).ok()) std::abort();
    }
    passes.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count() /
                     kLayers);
  }
  std::sort(passes.begin(), passes.end());
  return passes[passes.size() / 2];
}

RunResult Run(const std::string& address, const std::vector<v1::DecideLayerRequest>& requests,
              int streams, double seconds, const std::string& source) {
  std::vector<std::vector<double>> latencies(streams);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  const auto stop = start + std::chrono::duration<double>(seconds);
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      grpc::ChannelArguments args;
      args.SetMaxSendMessageSize(64 << 20);
      args.SetMaxReceiveMessageSize(64 << 20);
      args.SetInt("bench.stream", s);  // one connection per worker, like separate processes
      auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
      auto stub = v1::CacheManager::NewStub(channel);
      grpc::ClientContext context;
      auto stream = stub->DecideStream(&context);
      v1::LayerDecision decision;
      for (int i = 0; Clock::now() < stop; ++i) {
        v1::DecideLayerRequest request = requests[i % kLayers];
        request.set_sequence_id("seq-" + std::to_string(s));
        const auto sent = Clock::now();
        if (!stream->Write(request) || !stream->Read(&decision)) {
          failed = true;
          break;
        }
        latencies[s].push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - sent).count());
      }
      stream->WritesDone();
      const grpc::Status status = stream->Finish();
      if (!status.ok()) {
        std::fprintf(stderr, "stream %d: %s\n", s, status.error_message().c_str());
        failed = true;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  RunResult result;
  result.source = source;
  result.streams = streams;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (const auto& per_stream : latencies)
    all.insert(all.end(), per_stream.begin(), per_stream.end());
  std::sort(all.begin(), all.end());
  result.decisions = static_cast<int64_t>(all.size());
  if (!all.empty()) {
    result.p50_ms = all[all.size() / 2];
    result.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  if (failed) std::fprintf(stderr, "run %s x%d had failures\n", source.c_str(), streams);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  const std::string prefix = argc > 2 ? argv[2] : "bench/results/service_load";

  entrokv::service::ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.pool_capacity_bytes = int64_t{4} << 30;
  options.max_message_bytes = 64 << 20;
  // ENTROKV_BENCH_STATE_DIR: journal to that directory (the cost of --state_dir).
  if (const char* state_dir = std::getenv("ENTROKV_BENCH_STATE_DIR"); state_dir != nullptr) {
    options.state_dir = state_dir;
  }
  auto server = entrokv::service::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  const std::string address = (*server)->address();
  auto stub =
      v1::CacheManager::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  {
    // head_dim 8 keeps the arena small; frame size does not enter the decision's cost.
    v1::RegisterModelRequest request;
    request.set_model_id("qwen2.5-1.5b");
    v1::ModelGeometry* g = request.mutable_geometry();
    g->set_layers(kLayers);
    g->set_query_heads(kHeads);
    g->set_kv_groups(kGroups);
    g->set_head_dim(8);
    g->set_page_size(kPageSize);
    g->set_element_bytes(2);
    request.set_capacity_bytes(uint64_t{3} << 30);
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    if (!stub->RegisterModel(&context, request, &response).ok()) return 1;
  }
  for (int s = 0; s < 8; ++s) {
    v1::OpenSequenceRequest request;
    request.set_model_id("qwen2.5-1.5b");
    request.set_sequence_id("seq-" + std::to_string(s));
    request.set_initial_tokens(kTokens);
    grpc::ClientContext context;
    v1::OpenSequenceResponse response;
    const grpc::Status status = stub->OpenSequence(&context, request, &response);
    if (!status.ok()) {
      std::fprintf(stderr, "open: %s\n", status.error_message().c_str());
      return 1;
    }
  }

  const std::vector<std::string> layers = MakeStatistics();
  const double core_ms = CoreMsPerLayer(layers);

  // The same statistics in one shared-memory segment, layer after layer.
  const std::string segment = "/entrokv-bench-" + std::to_string(::getpid());
  const size_t layer_bytes = layers[0].size();
  const int fd = ::shm_open(segment.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(layer_bytes * kLayers)) != 0) return 1;
  for (int l = 0; l < kLayers; ++l) {
    if (::pwrite(fd, layers[l].data(), layer_bytes, static_cast<off_t>(l * layer_bytes)) !=
        static_cast<ssize_t>(layer_bytes)) {
      return 1;
    }
  }
  ::close(fd);

  std::vector<v1::DecideLayerRequest> by_bytes(kLayers);
  std::vector<v1::DecideLayerRequest> by_shm(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    for (v1::DecideLayerRequest* r : {&by_bytes[l], &by_shm[l]}) {
      r->set_model_id("qwen2.5-1.5b");
      r->mutable_budget()->set_fraction(kFraction);
      r->mutable_layer()->set_layer(l);
      v1::Statistic* stat = r->mutable_layer()->mutable_statistic();
      stat->set_dtype(v1::DTYPE_BFLOAT16);
      stat->set_query_heads(kHeads);
      stat->set_tokens(kTokens);
    }
    by_bytes[l].mutable_layer()->mutable_statistic()->set_data(layers[l]);
    v1::SharedMemoryRegion* region =
        by_shm[l].mutable_layer()->mutable_statistic()->mutable_shared_memory();
    region->set_segment(segment);
    region->set_offset_bytes(l * layer_bytes);
    region->set_length_bytes(layer_bytes);
  }

  std::vector<RunResult> results;
  for (const auto& [source, requests] :
       {std::pair<std::string, const std::vector<v1::DecideLayerRequest>*>{"bytes", &by_bytes},
        {"shared_memory", &by_shm}}) {
    (void)Run(address, *requests, 1, 0.3, source);  // warm-up
    for (int streams : {1, 2, 8})
      results.push_back(Run(address, *requests, streams, seconds, source));
  }
  ::shm_unlink(segment.c_str());
  (*server)->Shutdown(absl::Seconds(1));

  std::string text = absl::StrFormat(
      "entrokvd loopback load: Qwen2.5-1.5B shape (L=%d, H_Q=%d, G=%d), T=%d, bf16, "
      "page_entrokv, budget fraction %.2f, %u hardware threads, %.1f s per run\n"
      "in-process core (FusedScorer as the daemon runs it, one thread): %.3f ms per layer\n\n"
      "%-14s %7s %10s %12s %9s %9s %14s\n",
      kLayers, kHeads, kGroups, kTokens, kFraction, std::thread::hardware_concurrency(), seconds,
      core_ms, "source", "streams", "decisions", "decisions/s", "p50 ms", "p99 ms", "p50/core");
  entrokv::Json runs = entrokv::Json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const RunResult& r = results[i];
    const double rate = r.decisions / r.seconds;
    absl::StrAppendFormat(&text, "%-14s %7d %10d %12.1f %9.3f %9.3f %13.2fx\n", r.source, r.streams,
                          r.decisions, rate, r.p50_ms, r.p99_ms, r.p50_ms / core_ms);
    runs.push_back({{"source", r.source},
                    {"streams", r.streams},
                    {"decisions", r.decisions},
                    {"decisions_per_s", entrokv::RoundTo(rate, 2)},
                    {"p50_ms", entrokv::RoundTo(r.p50_ms, 4)},
                    {"p99_ms", entrokv::RoundTo(r.p99_ms, 4)},
                    {"p50_over_core", entrokv::RoundTo(r.p50_ms / core_ms, 3)}});
  }
  const entrokv::Json json = {{"shape",
                               {{"layers", kLayers},
                                {"query_heads", kHeads},
                                {"kv_groups", kGroups},
                                {"tokens", kTokens},
                                {"dtype", "bfloat16"}}},
                              {"core_ms_per_layer", entrokv::RoundTo(core_ms, 4)},
                              {"hardware_threads", std::thread::hardware_concurrency()},
                              {"runs", std::move(runs)}};
  std::fputs(text.c_str(), stdout);
  std::ofstream(prefix + ".txt") << text;
  std::ofstream(prefix + ".json") << entrokv::DumpJson(json, 2) << "\n";
  return 0;
}
