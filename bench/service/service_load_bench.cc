// Loopback load against a real entrokvd, started as a child process (what a worker talks to) or
// already running (--target): N concurrent DecideStream workers, one connection each, send
// per-layer bfloat16 statistics of the Qwen2.5-1.5B shape (28 layers, 12 query heads, 2 KV
// groups) at T = 32768, inline (`bytes`) or by shared-memory reference. Measured in the same run,
// so that the ratios compare like with like:
//  - core: the scorer the daemon runs (FusedScorer, measurements on, one thread) in this process,
//    per layer;
//  - round trip: an empty gRPC call (health Check) on the same channel setup, p50;
//  - copy: one memcpy of a layer's statistic, the least a daemon receiving it inline must do;
//  - pread: one pread(2) of it from the segment, the copy the daemon makes of a statistic sent
//    by reference;
//  - for each run, the daemon's CPU time per decision (all its threads);
//  - the `none` runs: decisions by the streaming policy, which reads no statistic, so what the
//    service costs around a decision without scoring or copying.
// and from them the service goals: 1 stream p50 <= core + 1.2 x round trip (shared memory), the
// same + copy (bytes); 8 streams >= 85% of worker_threads / core decisions per second.
//
// Usage: service_load_bench [--seconds=2] [--out=bench/results/service_load]
//        [--entrokvd=PATH | --target=HOST:PORT] [--state_dir=DIR] [--decisions=N] [--runs=...]
// --state_dir starts the daemon journaling to DIR (an empty directory); its arena stays in
// /dev/shm as /entrokv.d<instance>.* (kept for a restart): remove it with the directory.
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
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/service/daemon_child.h"
#include "core/scoring/decision.h"
#include "core/scoring/fused_scorer.h"
#include "core/util/dtype.h"
#include "core/util/json.h"
#include "entrokv/v1/cache_manager.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, entrokvd, ENTROKVD_PATH, "the entrokvd binary to start");
ABSL_FLAG(std::string, target, "",
          "HOST:PORT of a running entrokvd to use instead of starting one");
ABSL_FLAG(
    int, worker_threads, 0,
    "the daemon's --worker_threads (0: one per hardware thread); with --target, what it runs");
ABSL_FLAG(double, seconds, 2.0, "seconds per run");
ABSL_FLAG(int64_t, decisions, 0, "decisions per run instead of --seconds (0: time-bound)");
ABSL_FLAG(std::string, runs,
          "none:1,bytes:1,bytes:2,bytes:8,shared_memory:1,shared_memory:2,shared_memory:8",
          "the runs, SOURCE:STREAMS, comma-separated");
ABSL_FLAG(int, rtt_calls, 3000, "empty round trips measured");
ABSL_FLAG(std::string, state_dir, "", "start the daemon with --state_dir=DIR");
ABSL_FLAG(std::string, out, "bench/results/service_load",
          "write PREFIX.txt and PREFIX.json (empty: print only)");

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = entrokv::v1;

constexpr int kLayers = 28;
constexpr int kHeads = 12;
constexpr int kGroups = 2;
constexpr int64_t kTokens = 32768;
constexpr int kPageSize = 16;
constexpr double kFraction = 0.2;
constexpr int kSequences = 8;  // one per stream of the widest run
// The goals' constants.
constexpr double kRoundTrips = 1.2;
constexpr double kThroughputShare = 0.85;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

double Percentile(const std::vector<double>& sorted, int percent) {
  if (sorted.empty()) return 0.0;
  return sorted[std::min(sorted.size() - 1, sorted.size() * percent / 100)];
}

// What a run's latency is compared with, measured just before it.
struct Reference {
  double core_ms = 0;
  double copy_ms = 0;
  double pread_ms = 0;
  double rtt_p50_ms = 0;
  double rtt_p99_ms = 0;
};

struct RunResult {
  std::string source;
  int streams = 0;
  int64_t decisions = 0;
  double seconds = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  // The daemon's CPU time (every thread) per decision, when it is this benchmark's child; the
  // part beyond the core's is what the service adds, whatever the client costs.
  std::optional<double> daemon_cpu_ms;
  bool failed = false;
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
    passes.push_back(Ms(Clock::now() - start) / kLayers);
  }
  return Median(passes);
}

// Median over passes of one memcpy of a layer's statistic (layers in turn, as they arrive).
double CopyMsPerLayer(const std::vector<std::string>& layers) {
  std::vector<char> destination(layers[0].size());
  std::vector<double> passes;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = Clock::now();
    for (const std::string& layer : layers) {
      std::memcpy(destination.data(), layer.data(), layer.size());
      // Keeps the copy from being optimized away.
      asm volatile("" : : "r"(destination.data()) : "memory");
    }
    passes.push_back(Ms(Clock::now() - start) / kLayers);
  }
  return Median(passes);
}

// Median over passes of one pread(2) of a layer's statistic from the shared-memory segment into
// a buffer that is already mapped, as the daemon copies a statistic it is sent by reference.
double PreadMsPerLayer(const std::string& segment, size_t layer_bytes) {
  const int fd = ::shm_open(segment.c_str(), O_RDONLY, 0);
  if (fd < 0) std::abort();
  std::vector<char> destination(layer_bytes);
  std::vector<double> passes;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = Clock::now();
    for (int l = 0; l < kLayers; ++l) {
      if (::pread(fd, destination.data(), layer_bytes, static_cast<off_t>(l * layer_bytes)) !=
          static_cast<ssize_t>(layer_bytes)) {
        std::abort();
      }
    }
    passes.push_back(Ms(Clock::now() - start) / kLayers);
  }
  ::close(fd);
  return Median(passes);
}

// One connection per channel (a distinct argument), like separate worker processes.
std::shared_ptr<grpc::Channel> Connect(const std::string& address, int index) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt("bench.connection", index);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// p50 and p99 (ms) of `calls` health Checks (the daemon's readiness, an empty request) on a
// channel set up like a stream's, after a warm-up; each call waits for its answer, as a
// synchronous unary call does. nullopt when a call fails.
std::optional<std::pair<double, double>> RoundTripMs(const std::string& address, int calls) {
  grpc::GenericStub stub(Connect(address, 1000));
  grpc::CompletionQueue queue;
  std::vector<double> times;
  grpc::Slice nothing("");
  const grpc::ByteBuffer empty(&nothing, 1);  // an empty message, not a missing one
  bool failed = false;
  for (int i = -calls / 10 - 1; i < calls; ++i) {
    grpc::ClientContext context;
    grpc::ByteBuffer reply;
    grpc::Status status;
    const auto sent = Clock::now();
    auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", empty, &queue);
    call->StartCall();
    call->Finish(&reply, &status, &reply);
    void* tag = nullptr;
    bool ok = false;
    if (!queue.Next(&tag, &ok) || !ok || !status.ok()) {
      std::fprintf(stderr, "health Check: %s\n", status.error_message().c_str());
      failed = true;
      break;
    }
    if (i >= 0) times.push_back(Ms(Clock::now() - sent));
  }
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) {
  }
  if (failed) return std::nullopt;
  std::sort(times.begin(), times.end());
  return std::make_pair(Percentile(times, 50), Percentile(times, 99));
}

// `streams` workers for `seconds`, or `decisions` in all when > 0; stream s decides on seq-s.
RunResult Run(const std::string& address, const std::vector<v1::DecideLayerRequest>& requests,
              int streams, double seconds, int64_t decisions, const std::string& source) {
  std::vector<std::vector<double>> latencies(streams);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  const int64_t per_stream = decisions > 0 ? (decisions + streams - 1) / streams : 0;
  const auto start = Clock::now();
  const auto stop =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      auto stub = v1::CacheManager::NewStub(Connect(address, s));
      grpc::ClientContext context;
      auto stream = stub->DecideStream(&context);
      v1::DecideLayerRequest request;
      v1::LayerDecision decision;
      for (int64_t i = 0; per_stream > 0 ? i < per_stream : Clock::now() < stop; ++i) {
        request = requests[i % kLayers];
        request.set_sequence_id(absl::StrCat("seq-", s));
        const auto sent = Clock::now();
        if (!stream->Write(request) || !stream->Read(&decision)) {
          failed = true;
          break;
        }
        latencies[s].push_back(Ms(Clock::now() - sent));
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
  for (const auto& per : latencies) all.insert(all.end(), per.begin(), per.end());
  std::sort(all.begin(), all.end());
  result.decisions = static_cast<int64_t>(all.size());
  result.p50_ms = Percentile(all, 50);
  result.p99_ms = Percentile(all, 99);
  result.failed = failed;
  if (failed) std::fprintf(stderr, "run %s x%d had failures\n", source.c_str(), streams);
  return result;
}

// Registers the model and opens its sequences; a daemon given with --target may hold them from
// an earlier run (ALREADY_EXISTS), and they are used as they are.
bool Setup(const std::string& address, uint64_t capacity_bytes) {
  auto stub = v1::CacheManager::NewStub(Connect(address, 0));
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
    request.set_capacity_bytes(capacity_bytes);
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    const grpc::Status status = stub->RegisterModel(&context, request, &response);
    if (!status.ok() && status.error_code() != grpc::StatusCode::ALREADY_EXISTS) {
      std::fprintf(stderr, "register: %s\n", status.error_message().c_str());
      return false;
    }
  }
  for (int s = 0; s < kSequences; ++s) {
    v1::OpenSequenceRequest request;
    request.set_model_id("qwen2.5-1.5b");
    request.set_sequence_id(absl::StrCat("seq-", s));
    request.set_initial_tokens(kTokens);
    grpc::ClientContext context;
    v1::OpenSequenceResponse response;
    const grpc::Status status = stub->OpenSequence(&context, request, &response);
    if (!status.ok() && status.error_code() != grpc::StatusCode::ALREADY_EXISTS) {
      std::fprintf(stderr, "open: %s\n", status.error_message().c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Loopback DecideStream load against entrokvd, with the core time, the empty round trip "
      "and the copy of a statistic measured in the same run.");
  absl::ParseCommandLine(argc, argv);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const int64_t fixed_decisions = absl::GetFlag(FLAGS_decisions);
  const std::string prefix = absl::GetFlag(FLAGS_out);
  const int worker_threads = absl::GetFlag(FLAGS_worker_threads) > 0
                                 ? absl::GetFlag(FLAGS_worker_threads)
                                 : static_cast<int>(std::thread::hardware_concurrency());
  std::vector<std::pair<std::string, int>> plan;
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_runs), ',')) {
    const std::vector<std::string> parts = absl::StrSplit(item, ':');
    int streams = 0;
    if (parts.size() != 2 ||
        (parts[0] != "bytes" && parts[0] != "shared_memory" && parts[0] != "none") ||
        !absl::SimpleAtoi(parts[1], &streams) || streams < 1 || streams > kSequences) {
      std::fprintf(stderr, "--runs: '%s' is not bytes|shared_memory|none:1..%d\n",
                   std::string(item).c_str(), kSequences);
      return 2;
    }
    plan.emplace_back(parts[0], streams);
  }

  // Every (sequence, layer) pair holds about kFraction of its pages after its first decision;
  // the pool holds them all at the start. Frames are 16 x 8 x 2 (K, V) x 2 bytes.
  const uint64_t frames = uint64_t{kSequences} * kLayers * kGroups * (kTokens / kPageSize);
  const uint64_t capacity_bytes = (frames + 1024) * kPageSize * 8 * 2 * 2;
  std::unique_ptr<entrokv::bench::DaemonChild> daemon;
  std::string address = absl::GetFlag(FLAGS_target);
  if (address.empty()) {
    std::vector<std::string> args = {"--listen=127.0.0.1:0",
                                     "--metrics_listen=",
                                     absl::StrCat("--pool_capacity_bytes=", 2 * capacity_bytes),
                                     absl::StrCat("--max_message_bytes=", 64 << 20),
                                     absl::StrCat("--worker_threads=", worker_threads),
                                     "--log_level=warning"};
    if (const std::string dir = absl::GetFlag(FLAGS_state_dir); !dir.empty()) {
      args.push_back(absl::StrCat("--state_dir=", dir));
    }
    absl::StatusOr<std::unique_ptr<entrokv::bench::DaemonChild>> started =
        entrokv::bench::DaemonChild::Start(absl::GetFlag(FLAGS_entrokvd), args, 30000);
    if (!started.ok()) {
      std::fprintf(stderr, "%s\n", std::string(started.status().message()).c_str());
      return 1;
    }
    daemon = *std::move(started);
    address = daemon->address();
  }
  if (!Setup(address, capacity_bytes)) return 1;

  const std::vector<std::string> layers = MakeStatistics();
  // The same statistics in one shared-memory segment, layer after layer.
  const std::string segment = absl::StrCat("/entrokv-bench-", ::getpid());
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
  // `none`: the streaming policy, which reads no statistic: what the service costs around a
  // decision (parsing, checks, the worker hop, applying, the reply) with neither scoring nor a
  // statistic's copy.
  std::vector<v1::DecideLayerRequest> by_none(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    by_none[l].set_model_id("qwen2.5-1.5b");
    by_none[l].mutable_budget()->set_fraction(kFraction);
    by_none[l].mutable_policy()->set_name("streaming");
    by_none[l].mutable_layer()->set_layer(l);
  }
  auto requests_of = [&](const std::string& source) -> const std::vector<v1::DecideLayerRequest>& {
    return source == "bytes" ? by_bytes : source == "none" ? by_none : by_shm;
  };

  // Warm-up: every sequence's first decision per layer evicts its pages; the runs then measure
  // the steady state (each decision keeps the pages still held), whatever their order.
  bool failed =
      Run(address, by_shm, kSequences, 0, int64_t{kSequences} * kLayers, "warm-up").failed;

  // Each run is measured beside its own core time, copy time and round trip, taken just before
  // it: on a shared machine they move from one minute to the next, and a ratio means something
  // only between figures of the same moment.
  const int rtt_calls = absl::GetFlag(FLAGS_rtt_calls);
  std::vector<RunResult> results;
  std::vector<Reference> references;
  std::string warmed;
  for (const auto& [source, streams] : plan) {
    if (source != warmed) {  // the connections' and the daemon's warm-up for this source
      failed |= Run(address, requests_of(source), 1, 0.3, fixed_decisions > 0 ? kLayers : 0, source)
                    .failed;
      warmed = source;
    }
    Reference reference;
    reference.core_ms = CoreMsPerLayer(layers);
    reference.copy_ms = CopyMsPerLayer(layers);
    reference.pread_ms = PreadMsPerLayer(segment, layer_bytes);
    const std::optional<std::pair<double, double>> rtt = RoundTripMs(address, rtt_calls);
    if (!rtt.has_value()) return 1;
    std::tie(reference.rtt_p50_ms, reference.rtt_p99_ms) = *rtt;
    references.push_back(reference);
    const double cpu_before = daemon != nullptr ? daemon->CpuSeconds() : -1;
    results.push_back(Run(address, requests_of(source), streams, seconds, fixed_decisions, source));
    RunResult& result = results.back();
    const double cpu_after = daemon != nullptr ? daemon->CpuSeconds() : -1;
    if (cpu_before >= 0 && cpu_after >= 0 && result.decisions > 0) {
      result.daemon_cpu_ms = (cpu_after - cpu_before) * 1000 / result.decisions;
    }
    failed |= result.failed;
  }
  ::shm_unlink(segment.c_str());
  const int exit_status = daemon != nullptr ? daemon->Stop(15000) : 0;

  auto median_of = [&references](double Reference::*field) {
    std::vector<double> values;
    for (const Reference& reference : references) values.push_back(reference.*field);
    return Median(values);
  };
  std::string text = absl::StrFormat(
      "entrokvd loopback load: Qwen2.5-1.5B shape (L=%d, H_Q=%d, G=%d), T=%d, bf16, "
      "page_entrokv, budget fraction %.2f, %u hardware threads, daemon --worker_threads=%d, "
      "%s per run\n"
      "measured before each run (medians over the runs here; each run's own in its row):\n"
      "  core: FusedScorer as the daemon runs it, in this process, one thread: %.3f ms per layer\n"
      "  rtt: empty gRPC round trip (health Check, %d calls, same channel setup): p50 %.1f us, "
      "p99 %.1f us\n"
      "  copy: memcpy of one layer's statistic (%zu bytes): %.3f ms\n"
      "  pread: pread(2) of one layer's statistic from the segment, as the daemon copies it: "
      "%.3f ms\n"
      "cpu ms: the daemon's CPU time (all threads) per decision during the run\n\n"
      "%-14s %7s %10s %12s %8s %8s %8s %7s %8s %15s %9s\n",
      kLayers, kHeads, kGroups, kTokens, kFraction, std::thread::hardware_concurrency(),
      worker_threads,
      fixed_decisions > 0 ? absl::StrCat(fixed_decisions, " decisions")
                          : absl::StrFormat("%.1f s", seconds),
      median_of(&Reference::core_ms), rtt_calls, median_of(&Reference::rtt_p50_ms) * 1000,
      median_of(&Reference::rtt_p99_ms) * 1000, layer_bytes, median_of(&Reference::copy_ms),
      median_of(&Reference::pread_ms), "source", "streams", "decisions", "decisions/s", "p50 ms",
      "p99 ms", "core ms", "rtt us", "p50/core", "(p50-core)/rtt", "cpu ms");
  entrokv::Json runs = entrokv::Json::array();
  std::string goal_text;
  for (size_t i = 0; i < results.size(); ++i) {
    const RunResult& r = results[i];
    const Reference& ref = references[i];
    const double rate = r.decisions / r.seconds;
    const double overhead_rtts = (r.p50_ms - ref.core_ms) / ref.rtt_p50_ms;
    absl::StrAppendFormat(
        &text, "%-14s %7d %10d %12.1f %8.3f %8.3f %8.3f %7.1f %7.2fx %15.2f %9s\n", r.source,
        r.streams, r.decisions, rate, r.p50_ms, r.p99_ms, ref.core_ms, ref.rtt_p50_ms * 1000,
        r.p50_ms / ref.core_ms, overhead_rtts,
        r.daemon_cpu_ms.has_value() ? absl::StrFormat("%.3f", *r.daemon_cpu_ms) : std::string("-"));
    entrokv::Json run = {{"source", r.source},
                         {"streams", r.streams},
                         {"decisions", r.decisions},
                         {"decisions_per_s", entrokv::RoundTo(rate, 2)},
                         {"p50_ms", entrokv::RoundTo(r.p50_ms, 4)},
                         {"p99_ms", entrokv::RoundTo(r.p99_ms, 4)},
                         {"core_ms_per_layer", entrokv::RoundTo(ref.core_ms, 4)},
                         {"copy_ms_per_layer", entrokv::RoundTo(ref.copy_ms, 4)},
                         {"pread_ms_per_layer", entrokv::RoundTo(ref.pread_ms, 4)},
                         {"round_trip_p50_ms", entrokv::RoundTo(ref.rtt_p50_ms, 4)},
                         {"round_trip_p99_ms", entrokv::RoundTo(ref.rtt_p99_ms, 4)},
                         {"p50_over_core", entrokv::RoundTo(r.p50_ms / ref.core_ms, 3)},
                         {"overhead_over_round_trip", entrokv::RoundTo(overhead_rtts, 3)}};
    if (r.daemon_cpu_ms.has_value()) {
      run["daemon_cpu_ms_per_decision"] = entrokv::RoundTo(*r.daemon_cpu_ms, 4);
    }
    // The goals: 1 stream, p50 <= core + 1.2 round trips (+ one copy of the statistic when it
    // comes inline); 8 streams, at least 85% of worker_threads / core decisions per second.
    if (r.source == "none") {
      // No goal: the service's own cost, the floor under the others.
    } else if (r.streams == 1) {
      const bool inline_bytes = r.source == "bytes";
      const double bound =
          ref.core_ms + kRoundTrips * ref.rtt_p50_ms + (inline_bytes ? ref.copy_ms : 0.0);
      run["goal"] = {{"p50_bound_ms", entrokv::RoundTo(bound, 4)}, {"met", r.p50_ms <= bound}};
      absl::StrAppendFormat(
          &goal_text, "  %-14s 1 stream: p50 %.3f ms %s core + 1.2 rtt%s = %.3f ms\n", r.source,
          r.p50_ms, r.p50_ms <= bound ? "<=" : "> ", inline_bytes ? " + copy" : "", bound);
      if (!inline_bytes) {
        // The copy the daemon must make of a statistic sent by reference (it reads it with
        // pread, never maps it): the same bound with that copy in.
        const double with_copy = bound + ref.pread_ms;
        run["goal"]["p50_bound_with_pread_ms"] = entrokv::RoundTo(with_copy, 4);
        run["goal"]["met_with_pread"] = r.p50_ms <= with_copy;
        absl::StrAppendFormat(&goal_text,
                              "  %-14s           with its pread: p50 %.3f ms %s core + pread + "
                              "1.2 rtt = %.3f ms\n",
                              "", r.p50_ms, r.p50_ms <= with_copy ? "<=" : "> ", with_copy);
      }
    } else if (r.streams == kSequences) {
      const double ideal = worker_threads / ref.core_ms * 1000.0;
      run["goal"] = {{"threads_over_core_per_s", entrokv::RoundTo(ideal, 2)},
                     {"share", entrokv::RoundTo(rate / ideal, 3)},
                     {"met", rate >= kThroughputShare * ideal}};
      absl::StrAppendFormat(&goal_text,
                            "  %-14s %d streams: %.1f decisions/s = %.0f%% of threads / core = "
                            "%.1f/s (goal 85%%)\n",
                            r.source, r.streams, rate, 100 * rate / ideal, ideal);
    }
    runs.push_back(std::move(run));
  }
  absl::StrAppend(&text, "\ngoals, each against the core and round trip measured before its run:\n",
                  goal_text);
  if (exit_status != 0) absl::StrAppend(&text, "entrokvd exited with status ", exit_status, "\n");
  const entrokv::Json json = {
      {"shape",
       {{"layers", kLayers},
        {"query_heads", kHeads},
        {"kv_groups", kGroups},
        {"tokens", kTokens},
        {"dtype", "bfloat16"}}},
      {"hardware_threads", std::thread::hardware_concurrency()},
      {"worker_threads", worker_threads},
      {"round_trip_calls", rtt_calls},
      {"median_core_ms_per_layer", entrokv::RoundTo(median_of(&Reference::core_ms), 4)},
      {"median_round_trip_p50_ms", entrokv::RoundTo(median_of(&Reference::rtt_p50_ms), 4)},
      {"median_copy_ms_per_layer", entrokv::RoundTo(median_of(&Reference::copy_ms), 4)},
      {"median_pread_ms_per_layer", entrokv::RoundTo(median_of(&Reference::pread_ms), 4)},
      {"runs", std::move(runs)}};
  std::fputs(text.c_str(), stdout);
  if (!prefix.empty()) {
    std::ofstream(prefix + ".txt") << text;
    std::ofstream(prefix + ".json") << entrokv::DumpJson(json, 2) << "\n";
  }
  return failed || exit_status != 0 ? 1 : 0;
}
