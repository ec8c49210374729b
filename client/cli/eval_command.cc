// `entrokv eval`: the evaluation report. A thin flag wrapper over sim/eval.h.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/args.h"
#include "client/cli/command.h"
#include "core/scoring/policy.h"
#include "sim/eval.h"
#include "sim/presets.h"
#include "sim/trace.h"
#include "sim/workload.h"

namespace entrokv::cli {
namespace {

constexpr char kCommand[] = "eval";

absl::StatusOr<std::vector<double>> ParseDoubles(const std::string& flag, const std::string& text) {
  std::vector<double> values;
  for (const absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    double value = 0.0;
    if (!absl::SimpleAtod(part, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", part, "' is not a number"));
    }
    values.push_back(value);
  }
  if (values.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty list"));
  return values;
}

absl::StatusOr<std::vector<int>> ParseInts(const std::string& flag, const std::string& text) {
  std::vector<int> values;
  for (const absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", part, "' is not an integer"));
    }
    values.push_back(value);
  }
  if (values.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty list"));
  return values;
}

absl::StatusOr<sim::EvalOptions> OptionsFromFlags(const ArgParser& parser) {
  sim::EvalOptions options;
  options.model = parser.Get("model");
  options.trace_dir = parser.Get("trace");
  options.out_dir = parser.Get("out");
  if (options.out_dir.empty()) return absl::InvalidArgumentError("--out: required");
  if (options.model.empty() == options.trace_dir.empty()) {
    return absl::InvalidArgumentError("--model: give exactly one of --model and --trace");
  }
  absl::StatusOr<int64_t> tokens = parser.GetInt("tokens");
  if (!tokens.ok()) return tokens.status();
  options.tokens = *tokens;
  absl::StatusOr<int64_t> seed = parser.GetInt("seed");
  if (!seed.ok()) return seed.status();
  options.seed = static_cast<uint64_t>(*seed);
  if (parser.Given("policies")) {
    options.policies = absl::StrSplit(parser.Get("policies"), ',', absl::SkipEmpty());
  }
  absl::StatusOr<std::vector<double>> budgets = ParseDoubles("budgets", parser.Get("budgets"));
  if (!budgets.ok()) return budgets.status();
  options.budgets = *budgets;
  absl::StatusOr<std::vector<int>> sizes = ParseInts("page-sizes", parser.Get("page-sizes"));
  if (!sizes.ok()) return sizes.status();
  options.page_sizes = *sizes;
  absl::StatusOr<int64_t> reference = parser.GetInt("reference-page-size");
  if (!reference.ok()) return reference.status();
  options.reference_page_size = static_cast<int>(*reference);
  absl::StatusOr<double> tau = parser.GetDouble("tau");
  if (!tau.ok()) return tau.status();
  options.tau = *tau;
  absl::StatusOr<double> alpha = parser.GetDouble("alpha");
  if (!alpha.ok()) return alpha.status();
  options.alpha = *alpha;
  absl::StatusOr<int64_t> sinks = parser.GetInt("sink-tokens");
  if (!sinks.ok()) return sinks.status();
  options.sink_tokens = static_cast<int>(*sinks);
  options.plots = parser.GetFlag("plots");
  options.python = parser.Get("python");
  options.plot_script = parser.Get("plot-script");
  return options;
}

}  // namespace

int RunEval(const std::vector<std::string>& args) {
  ArgParser parser(kCommand,
                   "--model PRESET|--trace DIR --out DIR [options]\n"
                   "Runs every policy x budget x page size and writes results.csv, "
                   "uor_groups.csv, heads.csv, closed_form.csv, report.md and PNG plots.");
  parser.Option(
      "model", "",
      absl::StrCat("synthetic workload preset: ", absl::StrJoin(sim::PresetNames(), ", ")));
  parser.Option("trace", "", "trace directory (stats.npy + trace.json) instead of --model");
  parser.Option("out", "", "output directory (created)");
  parser.Option("tokens", "8192", "sequence length T of the synthetic workload");
  parser.Option("seed", "1", "workload seed");
  parser.Option("policies", "",
                absl::StrCat("comma list; default all: ", absl::StrJoin(PolicyNames(), ",")));
  parser.Option("budgets", "0.02,0.05,0.1,0.2,0.4", "comma list of fractions of T x L");
  parser.Option("page-sizes", "8,16,32,64", "comma list of page sizes B");
  parser.Option("reference-page-size", "16",
                "page size of the selection-scope analysis and the report's tables, when it is "
                "one of --page-sizes");
  parser.Option("tau", "0.5", "head-weight temperature");
  parser.Option("alpha", "2", "Renyi order of the entropy");
  parser.Option("sink-tokens", "4", "sink tokens left out of the entropy");
  parser.Flag("plots", true, "draw the PNGs with matplotlib");
  parser.Option("python", "/usr/bin/python3", "python with matplotlib, for the plots");
  parser.Option("plot-script", "",
                "plot script; default eval_plots.py beside the binary (the build copies it there)");
  parser.Option("save-trace", "", "also write the synthetic workload as a trace to this dir");
  parser.Flag("progress", true, "progress line on stderr");

  const absl::StatusOr<bool> parsed = parser.Parse(args);
  if (!parsed.ok()) return UsageError(kCommand, parsed.status());
  if (!*parsed) return kExitOk;  // --help
  absl::StatusOr<sim::EvalOptions> options = OptionsFromFlags(parser);
  if (!options.ok()) return UsageError(kCommand, options.status());
  if (absl::Status valid = sim::ValidateEvalOptions(*options); !valid.ok()) {
    return UsageError(kCommand, valid);
  }

  if (parser.Given("save-trace")) {
    if (options->model.empty()) {
      return UsageError(kCommand,
                        absl::InvalidArgumentError("--save-trace: needs --model, not --trace"));
    }
    absl::StatusOr<sim::ModelPreset> preset = sim::FindPreset(options->model);
    if (!preset.ok()) return UsageError(kCommand, preset.status());
    sim::WorkloadOptions workload;
    workload.tokens = options->tokens;
    workload.seed = options->seed;
    workload.sink_tokens = options->sink_tokens;
    if (absl::Status valid = sim::ValidateWorkloadOptions(workload); !valid.ok()) {
      return UsageError(kCommand, valid);
    }
    const absl::Status saved = sim::WriteSyntheticTrace(
        parser.Get("save-trace"), sim::WorkloadGenerator(*preset, workload), true);
    if (!saved.ok()) {
      std::fprintf(stderr, "entrokv eval: %s\n", std::string(saved.message()).c_str());
      return kExitServerError;
    }
  }

  const bool show_progress = parser.GetFlag("progress");
  const absl::StatusOr<sim::EvalOutcome> outcome =
      sim::RunEvaluation(*options, [&](const sim::EvalProgress& progress) {
        if (!show_progress) return;
        std::fprintf(stderr, "\rentrokv eval: layer %d/%d  %.1f s", progress.layer, progress.layers,
                     progress.seconds);
        if (progress.layer == progress.layers) std::fprintf(stderr, "\n");
        std::fflush(stderr);
      });
  if (!outcome.ok()) {
    // Bad inputs (an unreadable or inconsistent trace) are usage errors; the rest is ours.
    const absl::StatusCode code = outcome.status().code();
    if (code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
        code == absl::StatusCode::kFailedPrecondition) {
      return UsageError(kCommand, outcome.status());
    }
    std::fprintf(stderr, "entrokv eval: %s\n", std::string(outcome.status().message()).c_str());
    return kExitServerError;
  }
  if (!outcome->plots_ok && options->plots) {
    std::fprintf(stderr, "entrokv eval: plots not drawn: %s (CSV and report.md written)\n",
                 outcome->plot_message.c_str());
  }
  std::printf("wrote %s/{%s} in %.1f s (%zu rows)\n", options->out_dir.c_str(),
              absl::StrJoin(outcome->files, ",").c_str(), outcome->results.seconds,
              outcome->results.rows.size());
  return kExitOk;
}

}  // namespace entrokv::cli
