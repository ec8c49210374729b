#include "bench/load/load_generator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/load/daemon_probe.h"
#include "bench/load/worker.h"
#include "core/util/json.h"
#include "google/protobuf/stubs/logging.h"

namespace entrokv::bench {
namespace {

using Clock = std::chrono::steady_clock;

// "host:port" on the loopback interface; the port, or an error.
absl::StatusOr<int> LoopbackPort(const std::string& target) {
  const size_t colon = target.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(target.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--target: '", target, "' is not host:port"));
  }
  const std::string host = target.substr(0, colon);
  if (host != "localhost" && host != "[::1]" && !absl::StartsWith(host, "127.")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--target: '", host,
                     "' is not a loopback address; the load generator drives a local "
                     "daemon only (127.0.0.0/8, [::1], localhost)"));
  }
  return port;
}

// The models every worker shares, registered before the workers start.
struct SharedModel {
  std::string id;
  Shape shape;
  uint64_t capacity_bytes;
};

absl::Status RegisterShared(v1::CacheManager::Stub& stub, const LoadOptions& options,
                            const SharedModel& model) {
  const v1::RegisterModelRequest request =
      RegisterRequestFor(model.id, model.shape, model.capacity_bytes);
  grpc::ClientContext context;
  PrepareCall(&context, options, std::chrono::seconds(30));
  v1::RegisterModelResponse response;
  const grpc::Status status = stub.RegisterModel(&context, request, &response);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("RegisterModel ", model.id, ": ",
                                               status.error_message(), " (code ",
                                               static_cast<int>(status.error_code()), ")"));
  }
  return absl::OkStatus();
}

// After the run: the shared pools hold nothing (every worker closed its sequences); each goes.
int64_t CheckAndRemoveShared(v1::CacheManager::Stub& stub, const LoadOptions& options,
                             const std::string& id, RunContext& context, int64_t* checked) {
  auto prepare = [&](grpc::ClientContext* c) { PrepareCall(c, options, std::chrono::seconds(30)); };
  int64_t leaked = 0;
  {
    grpc::ClientContext c;
    prepare(&c);
    v1::GetPoolStatsRequest request;
    request.set_model_id(id);
    v1::PoolStats stats;
    const grpc::Status status = stub.GetPoolStats(&c, request, &stats);
    ++*checked;
    if (!status.ok()) {
      context.Problem(absl::StrCat("final GetPoolStats ", id, ": ", status.error_message()));
    } else if (stats.used_frames() != 0 || stats.sequences_active() != 0 ||
               stats.free_frames() != stats.capacity_frames()) {
      leaked = std::max<int64_t>(stats.used_frames(), 0);
      context.Problem(absl::StrCat("leak: shared model ", id, " ends with ", stats.used_frames(),
                                   " used frames, ", stats.free_frames(), " free of ",
                                   stats.capacity_frames(), ", ", stats.sequences_active(),
                                   " sequences, after every sequence was closed"));
    }
  }
  grpc::ClientContext c;
  prepare(&c);
  v1::UnregisterModelRequest request;
  request.set_model_id(id);
  request.set_force(true);
  v1::UnregisterModelResponse response;
  (void)stub.UnregisterModel(&c, request, &response);
  return leaked;
}

KindLatency Summarize(const std::string& kind, std::vector<float>& samples) {
  KindLatency out;
  out.kind = kind;
  out.calls = static_cast<int64_t>(samples.size());
  if (samples.empty()) return out;
  std::sort(samples.begin(), samples.end());
  const auto at = [&](double q) {
    return samples[std::min(samples.size() - 1, static_cast<size_t>(q * samples.size()))];
  };
  out.p50_ms = at(0.50);
  out.p99_ms = at(0.99);
  out.max_ms = samples.back();
  return out;
}

// Protobuf logs every non-UTF-8 string it serializes; the generator sends them on purpose.
void QuietProtobufLog(google::protobuf::LogLevel, const char*, int, const std::string&) {}

}  // namespace

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options) {
  absl::StatusOr<int> port = LoopbackPort(options.target);
  if (!port.ok()) return port.status();
  if (options.workers < 1 || options.workers > 256) {
    return absl::InvalidArgumentError("--workers: must be in [1, 256]");
  }
  if (options.bad_percent < 0 || options.bad_percent > 100) {
    return absl::InvalidArgumentError("--bad_percent: must be in [0, 100]");
  }
  RunContext context;
  context.options = &options;
  context.daemon_pid = options.daemon_pid > 0 ? options.daemon_pid : FindListeningPid(*port);
  if (context.daemon_pid <= 0 || !ProcessAlive(context.daemon_pid)) {
    return absl::NotFoundError(absl::StrCat("no process of ours listens on port ", *port,
                                            "; start entrokvd or pass --daemon_pid"));
  }
  google::protobuf::SetLogHandler(&QuietProtobufLog);
  context.tag = absl::StrCat("lg", ::getpid());
  context.shared_group_model = context.tag + "-shared-group";
  context.shared_layer_model = context.tag + "-shared-layer";
  context.deep_model = context.tag + "-deep";
  const uint64_t scale = static_cast<uint64_t>((options.workers + 7) / 8);
  const std::vector<SharedModel> shared = {
      {context.shared_group_model, kSharedGroupShape, scale * (uint64_t{32} << 20)},
      {context.shared_layer_model, kSharedLayerShape, scale * (uint64_t{8} << 20)},
      {context.deep_model, kDeepShape,
       static_cast<uint64_t>(options.workers) * (uint64_t{2} << 20)}};
  auto stub = v1::CacheManager::NewStub(
      grpc::CreateChannel(options.target, grpc::InsecureChannelCredentials()));
  for (const SharedModel& model : shared) {
    if (absl::Status registered = RegisterShared(*stub, options, model); !registered.ok()) {
      return registered;
    }
  }

  LoadReport report;
  report.seed = options.seed;
  report.workers = options.workers;
  report.daemon_pid = context.daemon_pid;
  report.rss_start_kb = ReadStatusKb(context.daemon_pid, "VmRSS");
  report.rss_max_kb = report.rss_start_kb;
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < options.workers; ++i) {
    workers.push_back(std::make_unique<Worker>(&context, i));
  }
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(options.duration_s));
  std::vector<std::thread> threads;
  for (auto& worker : workers) threads.emplace_back([&worker] { worker->Run(); });
  // Once a second: the daemon's memory, whether it lives, whether the run is over.
  while (!context.stop.load()) {
    std::this_thread::sleep_until(std::min(end, Clock::now() + std::chrono::seconds(1)));
    report.rss_max_kb = std::max(report.rss_max_kb, ReadStatusKb(context.daemon_pid, "VmRSS"));
    if (!ProcessAlive(context.daemon_pid)) {
      if (!context.daemon_dead.exchange(true)) {
        context.Problem(absl::StrCat("crash: entrokvd (pid ", context.daemon_pid, ") is gone"));
      }
      context.stop.store(true);
    }
    if (Clock::now() >= end) context.stop.store(true);
    if (options.on_tick) options.on_tick(context.requests.load());
  }
  for (std::thread& thread : threads) thread.join();
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();

  if (!context.daemon_dead.load()) {
    for (const SharedModel& model : shared) {
      report.leaked_frames +=
          CheckAndRemoveShared(*stub, options, model.id, context, &report.checked);
    }
  }
  if (!ProcessAlive(context.daemon_pid) && !context.daemon_dead.exchange(true)) {
    context.Problem(
        absl::StrCat("crash: entrokvd (pid ", context.daemon_pid, ") is gone after the run"));
  }
  report.crashes = context.daemon_dead.load() ? 1 : 0;
  report.rss_end_kb = ReadStatusKb(context.daemon_pid, "VmRSS");
  report.rss_max_kb = std::max(report.rss_max_kb, report.rss_end_kb);

  std::map<std::string, std::vector<float>> latency;
  for (const auto& worker : workers) {
    const WorkerTally& t = worker->tally();
    report.requests += t.requests;
    report.bad_requests += t.bad_requests;
    report.checked += t.checked;
    report.wrong_answers += t.wrong_answers;
    report.unavailable += t.unavailable;
    report.leaked_frames += t.leaked_frames;
    for (const auto& [kind, samples] : t.latency_ms) {
      latency[kind].insert(latency[kind].end(), samples.begin(), samples.end());
    }
    for (const auto& [name, count] : t.bad_cases) report.bad_cases[name] += count;
  }
  workers.clear();  // removes their segments
  for (auto& [kind, samples] : latency) report.latency.push_back(Summarize(kind, samples));
  report.problems = context.problems();
  return report;
}

std::string FormatTable(const LoadReport& r) {
  const double bad_share = r.requests > 0 ? 100.0 * r.bad_requests / r.requests : 0;
  std::string out = absl::StrFormat(
      "entrokv load generator: seed %u, %d workers, %.1f s, entrokvd pid %d\n"
      "requests %d (%.0f/s), bad %d (%.1f%%), answers checked %d, wrong %d, crashes %d, "
      "unavailable %d, leaked frames %d\n"
      "daemon RSS: start %.1f MiB, end %.1f MiB, max %.1f MiB\n\n"
      "%-16s %9s %10s %10s %10s\n",
      r.seed, r.workers, r.seconds, r.daemon_pid, r.requests,
      r.seconds > 0 ? r.requests / r.seconds : 0, r.bad_requests, bad_share, r.checked,
      r.wrong_answers, r.crashes, r.unavailable, r.leaked_frames, r.rss_start_kb / 1024.0,
      r.rss_end_kb / 1024.0, r.rss_max_kb / 1024.0, "rpc", "calls", "p50 ms", "p99 ms", "max ms");
  for (const KindLatency& k : r.latency) {
    absl::StrAppendFormat(&out, "%-16s %9d %10.3f %10.3f %10.3f\n", k.kind, k.calls, k.p50_ms,
                          k.p99_ms, k.max_ms);
  }
  out += "\nbad requests by case:";
  for (const auto& [name, count] : r.bad_cases) absl::StrAppend(&out, " ", name, "=", count);
  out += "\n";
  for (const std::string& problem : r.problems) absl::StrAppend(&out, "PROBLEM ", problem, "\n");
  return out;
}

std::string FormatJson(const LoadReport& r) {
  Json latency = Json::object();
  for (const KindLatency& k : r.latency) {
    latency[k.kind] = {{"calls", k.calls},
                       {"p50_ms", RoundTo(k.p50_ms, 3)},
                       {"p99_ms", RoundTo(k.p99_ms, 3)},
                       {"max_ms", RoundTo(k.max_ms, 3)}};
  }
  Json bad = Json::object();
  for (const auto& [name, count] : r.bad_cases) bad[name] = count;
  const Json json = {
      {"seed", r.seed},
      {"workers", r.workers},
      {"seconds", RoundTo(r.seconds, 2)},
      {"daemon_pid", r.daemon_pid},
      {"requests", r.requests},
      {"bad_requests", r.bad_requests},
      {"bad_percent", RoundTo(r.requests > 0 ? 100.0 * r.bad_requests / r.requests : 0, 2)},
      {"checked", r.checked},
      {"wrong_answers", r.wrong_answers},
      {"crashes", r.crashes},
      {"unavailable", r.unavailable},
      {"leaked_frames", r.leaked_frames},
      {"rss_kb", {{"start", r.rss_start_kb}, {"end", r.rss_end_kb}, {"max", r.rss_max_kb}}},
      {"latency", latency},
      {"bad_cases", bad},
      {"problems", r.problems}};
  return DumpJson(json, 2);
}

}  // namespace entrokv::bench
