// entrokv replay: a simulated worker, end to end against a running entrokvd. For each policy it
// opens N sequences of T tokens, streams every layer's statistic from the simulator through
// DecideStream as prefill would, lets the daemon apply each decision, and reports what the pool
// kept.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/args.h"
#include "client/cli/command.h"
#include "client/cli/server_args.h"
#include "client/cpp/client.h"
#include "core/pool/geometry.h"
#include "core/scoring/budget.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/pages.h"
#include "core/scoring/policy.h"
#include "core/util/json.h"
#include "core/util/status_macros.h"
#include "sim/needles.h"
#include "sim/presets.h"
#include "sim/workload.h"
#include "wire/convert.h"

namespace entrokv::cli {
namespace {

struct ReplayOptions {
  sim::ModelPreset preset;
  std::string model_id;
  int64_t tokens = 0;
  double budget = 0;
  int page_size = 16;
  std::vector<std::string> policies;
  v1::SelectionScope scope = v1::SELECTION_SCOPE_UNSPECIFIED;  // auto: the pool's default
  std::optional<FrameLayout> register_layout;       // asked for; nullopt: the daemon's default
  v1::FrameLayout layout = v1::FRAME_LAYOUT_GROUP;  // the pool's, once registered
  int sequences = 1;
  int concurrency = 1;
  uint64_t seed = 1;
  bool keep_open = false;
  bool json = false;
  bool progress = false;
};

// What one policy's replay measured, summed over its sequences.
struct PolicyReport {
  std::string policy;
  int64_t frames_used_baseline = 0;  // pool before the replay opened anything
  int64_t frames_used_before = 0;    // after the appends, before any eviction
  int64_t frames_used_after = 0;     // after every decision was applied
  // baseline + sequences * sum_l K_l frames of the pool's layout (x G in the GROUP layout)
  int64_t planned_frames = 0;
  // LAYER layout: baseline + the frames per-group selection keeps (or, in layer scope, would
  // have kept): the distinct pages of the groups' own selections, summed over every layer.
  int64_t group_scope_frames = 0;
  v1::SelectionScope scope = v1::SELECTION_SCOPE_UNSPECIFIED;  // as the daemon decided
  int64_t frames_freed = 0;                                    // reported by the decisions
  int64_t group_decisions = 0;
  int64_t kept_pages = 0;  // summed over every (sequence, layer, group)
  double shadow_uor_sum = 0;
  double retained_mass_sum = 0;
  // A needle target: a (sequence, layer, group, needle) whose group has a retrieval head that
  // looks at that needle, the cells where keeping the needle matters.
  int64_t needle_targets = 0;
  int64_t needle_targets_kept = 0;      // ... whose every page was kept
  int64_t needles = 0;                  // (sequence, needle) with at least one target
  int64_t needles_kept_everywhere = 0;  // ... kept at every one of its targets
  double seconds = 0;
};

// The id of the replay's i-th sequence of `policy`; open, decide and close must agree on it.
std::string SequenceId(const ReplayOptions& options, const std::string& policy, int i) {
  return absl::StrCat("replay-", policy, "-", options.seed, "-", i);
}

absl::Status ReplaySequence(Client& client, const ReplayOptions& options, const std::string& policy,
                            int index, std::mutex& mutex, PolicyReport& report) {
  const sim::ModelPreset& preset = options.preset;
  sim::WorkloadOptions workload;
  workload.tokens = options.tokens;
  workload.seed = options.seed + static_cast<uint64_t>(index);
  // The generator gives a policy that wants ACCUMULATED (h2o) that kind, every other policy
  // LAST_ROW, as `entrokv eval` does. The names were checked against the registry already.
  ASSIGN_OR_RETURN(const Policy* registered, FindPolicy(policy));
  workload.kind = registered->statistic() == StatisticKind::kAccumulated
                      ? StatisticKind::kAccumulated
                      : StatisticKind::kLastRow;
  const sim::WorkloadGenerator generator(preset, workload);
  // Needle targets are measured on the LAST_ROW statistic, as `entrokv eval` measures them,
  // also when the policy decides on another kind.
  const bool other_kind = workload.kind != StatisticKind::kLastRow;
  std::vector<float> last_row_values(
      other_kind ? static_cast<size_t>(preset.query_heads * options.tokens) : 0);
  const std::string sequence_id = SequenceId(options, policy, index);

  std::vector<float> values(static_cast<size_t>(preset.query_heads * options.tokens));
  auto stream = client.OpenDecideStream();
  const int groups = preset.kv_groups;
  const auto& needles = generator.needles();
  std::vector<char> has_target(needles.size(), 0);
  std::vector<char> kept_everywhere(needles.size(), 1);
  PolicyReport local;
  for (int layer = 0; layer < preset.layers; ++layer) {
    generator.GenerateLayer(layer, values);
    v1::DecideLayerRequest request;
    request.set_model_id(options.model_id);
    request.set_sequence_id(sequence_id);
    request.mutable_layer()->set_layer(layer);
    v1::Statistic* statistic = request.mutable_layer()->mutable_statistic();
    statistic->set_dtype(v1::DTYPE_FLOAT32);
    statistic->set_query_heads(preset.query_heads);
    statistic->set_tokens(options.tokens);
    statistic->set_kind(wire::ToProto(workload.kind));
    statistic->set_data(values.data(), values.size() * sizeof(float));
    request.mutable_budget()->set_fraction(options.budget);
    request.mutable_policy()->set_name(policy);
    request.mutable_policy()->set_scope(options.scope);
    v1::LayerDecision decision;
    if (!stream->Write(request) || !stream->Read(&decision)) break;  // Finish() says why
    // The needles each group targets, by the definition `entrokv eval` uses (sim/needles.h).
    if (other_kind) generator.GenerateLayer(layer, StatisticKind::kLastRow, last_row_values);
    const std::vector<std::vector<int>> targets =
        sim::NeedleTargets(other_kind ? last_row_values : values, preset.query_heads, groups,
                           options.tokens, needles, sim::kRetrievalHeadMass);
    local.frames_freed += decision.freed_frames_size();
    local.group_scope_frames += decision.group_scope_union_pages();
    local.scope = decision.scope();
    for (const v1::GroupDecision& group : decision.groups()) {
      ++local.group_decisions;
      local.kept_pages += group.kept_pages_size();
      local.shadow_uor_sum += group.has_shadow_uor() ? group.shadow_uor() : 1.0;
      local.retained_mass_sum += group.has_retained_mass() ? group.retained_mass() : 0.0;
      for (const int n : targets[static_cast<size_t>(group.group())]) {
        const bool kept =
            sim::NeedleKept(needles[static_cast<size_t>(n)], options.page_size,
                            std::span<const int32_t>(group.kept_pages().data(),
                                                     static_cast<size_t>(group.kept_pages_size())));
        ++local.needle_targets;
        local.needle_targets_kept += kept;
        has_target[static_cast<size_t>(n)] = 1;
        kept_everywhere[static_cast<size_t>(n)] &= kept;
      }
    }
  }
  RETURN_IF_ERROR(stream->Finish());
  for (size_t n = 0; n < needles.size(); ++n) {
    local.needles += has_target[n];
    local.needles_kept_everywhere += has_target[n] && kept_everywhere[n];
  }
  std::lock_guard<std::mutex> lock(mutex);
  report.frames_freed += local.frames_freed;
  report.group_scope_frames += local.group_scope_frames;
  report.scope = local.scope;
  report.group_decisions += local.group_decisions;
  report.kept_pages += local.kept_pages;
  report.shadow_uor_sum += local.shadow_uor_sum;
  report.retained_mass_sum += local.retained_mass_sum;
  report.needle_targets += local.needle_targets;
  report.needle_targets_kept += local.needle_targets_kept;
  report.needles += local.needles;
  report.needles_kept_everywhere += local.needles_kept_everywhere;
  return absl::OkStatus();
}

// Runs `work(i)` for i in [0, count) on `threads` threads; the first error wins.
absl::Status ParallelFor(int count, int threads, const std::function<absl::Status(int)>& work,
                         const std::function<void(int)>& progress) {
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  std::mutex mutex;
  absl::Status first_error;
  std::vector<std::thread> pool;
  for (int t = 0; t < std::min(threads, count); ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < count; i = next++) {
        const absl::Status status = work(i);
        std::lock_guard<std::mutex> lock(mutex);
        if (!status.ok() && first_error.ok()) first_error = status;
        progress(++done);
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
  return first_error;
}

absl::StatusOr<int64_t> UsedFrames(Client& client, const std::string& model_id) {
  v1::GetPoolStatsRequest request;
  request.set_model_id(model_id);
  ASSIGN_OR_RETURN(v1::PoolStats stats, client.GetPoolStats(request));
  return stats.used_frames();
}

// Registers the model (or checks the one registered under its id) and returns its pool's frame
// layout, in whose frames the replay counts.
absl::StatusOr<v1::FrameLayout> EnsureModel(Client& client, const ReplayOptions& options) {
  const sim::ModelPreset& preset = options.preset;
  wire::PoolRequest pool;
  pool.geometry.layers = preset.layers;
  pool.geometry.query_heads = preset.query_heads;
  pool.geometry.kv_groups = preset.kv_groups;
  pool.geometry.head_dim = preset.head_dim;
  pool.geometry.page_size = options.page_size;
  pool.geometry.element_bytes = 2;
  // Room for every sequence of one policy at full length, in the GROUP layout.
  const int64_t frames = static_cast<int64_t>(options.sequences) * preset.layers *
                         preset.kv_groups * PageCount(options.tokens, options.page_size);
  pool.capacity_bytes =
      static_cast<uint64_t>(frames) * FrameBytes(pool.geometry, FrameLayout::kGroup);
  pool.layout = options.register_layout;
  auto registered = client.RegisterModel(wire::ToRegisterRequest(options.model_id, pool));
  if (registered.ok()) return registered->pool().frame_layout();
  if (registered.status().code() != absl::StatusCode::kAlreadyExists) return registered.status();
  v1::GetModelRequest get;
  get.set_model_id(options.model_id);
  ASSIGN_OR_RETURN(v1::GetModelResponse existing, client.GetModel(get));
  const v1::ModelGeometry& have = existing.pool().geometry();
  if (have.layers() != preset.layers || have.query_heads() != preset.query_heads ||
      have.kv_groups() != preset.kv_groups || have.page_size() != options.page_size ||
      (options.register_layout.has_value() &&
       existing.pool().frame_layout() != wire::ToProto(*options.register_layout))) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", options.model_id,
                     " is registered with another geometry or frame layout; pass --model-id"));
  }
  return existing.pool().frame_layout();
}

absl::StatusOr<PolicyReport> ReplayPolicy(Client& client, const ReplayOptions& options,
                                          const std::string& policy) {
  const sim::ModelPreset& preset = options.preset;
  PolicyReport report;
  report.policy = policy;
  ASSIGN_OR_RETURN(const BudgetPlan plan,
                   PlanBudget(FractionBudget(preset.layers, preset.kv_groups, options.page_size,
                                             options.tokens, options.budget)));
  ASSIGN_OR_RETURN(report.frames_used_baseline, UsedFrames(client, options.model_id));
  // A LAYER-layout frame holds every group of a page, so the plan's layer-pages are its frames.
  const int64_t frames_per_layer_page =
      options.layout == v1::FRAME_LAYOUT_LAYER ? 1 : preset.kv_groups;
  report.planned_frames = report.frames_used_baseline + static_cast<int64_t>(options.sequences) *
                                                            frames_per_layer_page *
                                                            plan.layer_pages;
  auto progress = [&](absl::string_view phase) {
    return [&, phase](int done) {
      if (options.progress) {
        std::fprintf(stderr, "\r%-18s %-8s %d/%d sequences   ", policy.c_str(),
                     std::string(phase).c_str(), done, options.sequences);
      }
    };
  };
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(ParallelFor(
      options.sequences, options.concurrency,
      [&](int i) -> absl::Status {
        v1::OpenSequenceRequest open;
        open.set_model_id(options.model_id);
        open.set_sequence_id(SequenceId(options, policy, i));
        RETURN_IF_ERROR(client.OpenSequence(open).status());
        v1::AppendTokensRequest append;
        append.set_model_id(options.model_id);
        append.set_sequence_id(open.sequence_id());
        append.set_tokens(options.tokens);
        return client.AppendTokens(append).status();
      },
      progress("append")));
  ASSIGN_OR_RETURN(report.frames_used_before, UsedFrames(client, options.model_id));
  std::mutex mutex;
  RETURN_IF_ERROR(ParallelFor(
      options.sequences, options.concurrency,
      [&](int i) { return ReplaySequence(client, options, policy, i, mutex, report); },
      progress("decide")));
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.group_scope_frames += report.frames_used_baseline;
  ASSIGN_OR_RETURN(report.frames_used_after, UsedFrames(client, options.model_id));
  if (!options.keep_open) {
    RETURN_IF_ERROR(ParallelFor(
        options.sequences, options.concurrency,
        [&](int i) {
          v1::CloseSequenceRequest close;
          close.set_model_id(options.model_id);
          close.set_sequence_id(SequenceId(options, policy, i));
          return client.CloseSequence(close).status();
        },
        progress("close")));
  }
  if (options.progress) std::fprintf(stderr, "\r%-60s\r", "");
  return report;
}

double Ratio(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

using wire::LayoutName;
using wire::ScopeName;

// The group-scope frames column: meaningful in the LAYER layout only, where a page is one frame.
std::string GroupScopeFrames(const ReplayOptions& options, const PolicyReport& report) {
  if (options.layout != v1::FRAME_LAYOUT_LAYER) return "-";
  return absl::StrCat(report.group_scope_frames);
}

void PrintTable(const ReplayOptions& options, const std::vector<PolicyReport>& reports) {
  std::printf(
      "replay of %s: %d sequences x %lld tokens, budget %.0f%%, page size %d, %s frame layout\n",
      options.preset.name.c_str(), options.sequences, static_cast<long long>(options.tokens),
      options.budget * 100, options.page_size, LayoutName(options.layout).c_str());
  std::printf("%-17s %6s %13s %13s %13s %12s %12s %11s %15s %11s %9s\n", "policy", "scope",
              "frames before", "frames after", "planned", "group scope", "pages/group",
              "shadow UOR", "needle targets", "retained", "time (s)");
  for (const PolicyReport& r : reports) {
    std::printf("%-17s %6s %13lld %13lld %13lld %12s %12.1f %11.3f %14.1f%% %10.1f%% %9.2f\n",
                r.policy.c_str(), ScopeName(r.scope).c_str(),
                static_cast<long long>(r.frames_used_before),
                static_cast<long long>(r.frames_used_after),
                static_cast<long long>(r.planned_frames), GroupScopeFrames(options, r).c_str(),
                Ratio(r.kept_pages, r.group_decisions), Ratio(r.shadow_uor_sum, r.group_decisions),
                100 * Ratio(r.needle_targets_kept, r.needle_targets),
                100 * Ratio(r.retained_mass_sum, r.group_decisions), r.seconds);
  }
  std::printf(
      "frames: pool frames in use (in the layout's frames); planned: what the budget allows (an\n"
      "exact policy ends there); group scope: the frames per-group selection keeps in the layer\n"
      "layout (what layer scope saves); scope: one page set per layer and group, or per layer.\n"
      "needle targets: share of (sequence, layer, group, needle) cells with a retrieval head on\n"
      "that needle whose needle pages were kept; retained: share of the head-mean attention "
      "kept.\n");
}

void PrintJson(const ReplayOptions& options, const std::vector<PolicyReport>& reports) {
  Json policies = Json::array();
  for (const PolicyReport& r : reports) {
    policies.push_back(
        {{"policy", r.policy},
         {"frame_layout", LayoutName(options.layout)},
         {"scope", ScopeName(r.scope)},
         {"sequences", options.sequences},
         {"tokens", options.tokens},
         {"budget", options.budget},
         {"frames_used_baseline", r.frames_used_baseline},
         {"frames_before", r.frames_used_before},
         {"frames_used_after", r.frames_used_after},
         {"planned_frames", r.planned_frames},
         // LAYER layout only (-1 otherwise): the frames per-group selection keeps there
         {"group_scope_frames",
          options.layout == v1::FRAME_LAYOUT_LAYER ? r.group_scope_frames : int64_t{-1}},
         {"frames_freed", r.frames_freed},
         {"pages_kept_per_group", RoundTo(Ratio(r.kept_pages, r.group_decisions), 6)},
         {"shadow_uor", RoundTo(Ratio(r.shadow_uor_sum, r.group_decisions), 6)},
         {"needle_targets_kept", RoundTo(Ratio(r.needle_targets_kept, r.needle_targets), 6)},
         {"needles_kept_at_every_target", RoundTo(Ratio(r.needles_kept_everywhere, r.needles), 6)},
         {"retained_mass", RoundTo(Ratio(r.retained_mass_sum, r.group_decisions), 6)},
         {"seconds", RoundTo(r.seconds, 3)}});
  }
  const Json out = {{"model", options.preset.name}, {"policies", std::move(policies)}};
  std::printf("%s\n", DumpJson(out).c_str());
}

absl::StatusOr<ReplayOptions> ParseOptions(const ArgParser& args) {
  ReplayOptions options;
  ASSIGN_OR_RETURN(options.preset, sim::FindPreset(args.Get("model")));
  options.model_id = args.Given("model-id") ? args.Get("model-id") : options.preset.name;
  ASSIGN_OR_RETURN(options.tokens, args.GetInt("tokens"));
  if (options.tokens < 1) return absl::InvalidArgumentError("--tokens: must be positive");
  ASSIGN_OR_RETURN(options.budget, args.GetDouble("budget"));
  RETURN_IF_ERROR(ValidateBudgetFraction("--budget", options.budget));
  ASSIGN_OR_RETURN(const int64_t page_size, args.GetInt("page-size"));
  if (page_size < 1) return absl::InvalidArgumentError("--page-size: must be positive");
  options.page_size = static_cast<int>(page_size);
  for (absl::string_view name : absl::StrSplit(args.Get("policy"), ',', absl::SkipEmpty())) {
    RETURN_IF_ERROR(FindPolicy(name).status());
    options.policies.emplace_back(name);
  }
  if (options.policies.empty()) return absl::InvalidArgumentError("--policy: name a policy");
  ASSIGN_OR_RETURN(const int64_t sequences, args.GetInt("sequences"));
  ASSIGN_OR_RETURN(const int64_t concurrency, args.GetInt("concurrency"));
  if (sequences < 1 || sequences > 4096) {
    return absl::InvalidArgumentError("--sequences: must be in [1, 4096]");
  }
  if (concurrency < 1 || concurrency > 256) {
    return absl::InvalidArgumentError("--concurrency: must be in [1, 256]");
  }
  options.sequences = static_cast<int>(sequences);
  options.concurrency = static_cast<int>(concurrency);
  ASSIGN_OR_RETURN(const int64_t seed, args.GetInt("seed"));
  options.seed = static_cast<uint64_t>(seed);
  const std::string scope = args.Get("scope");
  if (scope != "auto") {  // auto: left unspecified, for the daemon to resolve
    const absl::StatusOr<SelectionScope> parsed = ParseSelectionScope("--scope", scope);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--scope: '", scope, "' is not one of auto, group, layer"));
    }
    options.scope = wire::ToProto(*parsed);
  }
  const std::string layout = args.Get("frame-layout");
  if (!layout.empty()) {
    const absl::StatusOr<FrameLayout> parsed = ParseFrameLayout(layout);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--frame-layout: '", layout, "' is not one of group, layer"));
    }
    options.register_layout = *parsed;
  }
  options.keep_open = args.GetFlag("keep-open");
  options.json = args.GetFlag("json");
  options.progress = !options.json && isatty(STDERR_FILENO);
  return options;
}

}  // namespace

int RunReplay(const std::vector<std::string>& argv) {
  ArgParser args("replay", "--model PRESET --tokens T --budget F --policy P[,P...] [options]");
  AddServerOptions(&args);
  args.Option("model", "qwen2.5-1.5b",
              "simulator preset: " + absl::StrJoin(sim::PresetNames(), ", "));
  args.Option("model-id", "", "id to register the model under (default: the preset name)");
  args.Option("tokens", "8192", "tokens T per sequence");
  args.Option("budget", "0.2", "fraction of each sequence to keep, planned per layer");
  args.Option("page-size", "16", "tokens per page B");
  args.Option("policy", "page_entrokv", "policy, or a comma-separated list to compare");
  args.Option("sequences", "1", "sequences N per policy");
  args.Option("concurrency", "1", "concurrent worker streams C");
  args.Option("seed", "1", "simulator seed (sequence i uses seed + i)");
  args.Option("frame-layout", "",
              "frame layout to register the model with: group or layer (default: the daemon's "
              "--frame_layout)");
  args.Option(
      "scope", "auto",
      "selection scope: auto (the daemon's: layer for a layer-layout pool), group or layer");
  args.Flag("keep-open", false, "leave the sequences open instead of closing them");
  args.Flag("json", false, "print one JSON object instead of the table");
  auto parsed = args.Parse(argv);
  if (!parsed.ok()) return UsageError("replay", parsed.status());
  if (!*parsed) return kExitOk;
  auto options = ParseOptions(args);
  if (!options.ok()) return UsageError("replay", options.status());
  auto client_options = ServerOptions(args);
  if (!client_options.ok()) return UsageError("replay", client_options.status());
  Client client(*client_options);
  auto layout = EnsureModel(client, *options);
  if (!layout.ok()) return ServerError("replay", layout.status());
  options->layout = *layout;
  std::vector<PolicyReport> reports;
  for (const std::string& policy : options->policies) {
    auto report = ReplayPolicy(client, *options, policy);
    if (!report.ok()) return ServerError("replay", report.status());
    reports.push_back(*std::move(report));
  }
  if (options->json) {
    PrintJson(*options, reports);
  } else {
    PrintTable(*options, reports);
  }
  return kExitOk;
}

}  // namespace entrokv::cli
