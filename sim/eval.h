// The evaluation report (`entrokv eval`): every policy x budget x page size on a synthetic
// workload or a trace, measured with the core's own planner and decision path, written as
// CSV files, a Markdown report and (through matplotlib) PNG plots.
#ifndef ENTROKV_SIM_EVAL_H_
#define ENTROKV_SIM_EVAL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sim/presets.h"
#include "sim/trace.h"

namespace entrokv::sim {

struct EvalOptions {
  // Exactly one source: a preset name (synthetic workload) or a trace directory.
  std::string model;
  std::string trace_dir;
  std::string out_dir;    // created if missing
  int64_t tokens = 8192;  // T of the synthetic workload (a trace brings its own)
  uint64_t seed = 1;
  std::vector<std::string> policies;                          // empty: every registered policy
  std::vector<double> budgets = {0.02, 0.05, 0.1, 0.2, 0.4};  // fractions of the sequence
  std::vector<int> page_sizes = {8, 16, 32, 64};
  // The page size of the selection-scope analysis and of report.md's tables, when it is one of
  // page_sizes; otherwise the analysis takes the first page size and the tables the smallest.
  int reference_page_size = 16;
  int sink_tokens = 4;
  double tau = 0.5;
  double alpha = 2.0;
  std::vector<double> tau_sweep = {0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0};
  std::vector<double> alpha_sweep = {0.5, 1.0, 2.0, 4.0, 1e300};  // 1e300 stands for +inf
  // The head classes of the sink analysis are measured, so they work on real traces too: a
  // sink head puts at least this share on the sink tokens, a retrieval head on one needle.
  double sink_head_mass = 0.5;
  double retrieval_head_mass = 0.3;
  bool plots = true;
  std::string python = "/usr/bin/python3";
  std::string plot_script;  // empty: DefaultPlotScript() (beside the binary)
  bool closed_form_checks = true;
  // The selection-scope analysis (scope.csv): these policies in group scope and in layer scope
  // with every combine, plus head_independent, at the reference page size, as a LAYER-layout
  // pool keeps them. Empty: no analysis.
  std::vector<std::string> scope_policies = {"page_entrokv", "mean"};
};

// INVALID_ARGUMENT naming the field.
[[nodiscard]] absl::Status ValidateEvalOptions(const EvalOptions& options);

// The registered policies that want an ACCUMULATED statistic (Policy::statistic()), joined with
// ", ": the names report.md and the notes give.
[[nodiscard]] std::string AccumulatedPolicyNames();

// One row of results.csv: one policy at one budget and page size, over every (layer, group).
struct EvalRow {
  std::string policy;
  // The kind the policy was given: ACCUMULATED when it wants it (Policy::statistic()) and the
  // source has one, "none" when it reads none, the source's own statistic otherwise.
  std::string statistic;
  double budget = 0.0;
  int page_size = 0;
  int64_t planned_frames = 0;  // sum over layers and groups of min(K_l, n)
  int64_t kept_frames = 0;     // counted from the decisions
  int64_t groups = 0;          // (layer, group) decisions
  int64_t exact_groups = 0;    // decisions that kept exactly min(K_l, n) pages
  double uor_mean = 0.0;       // |kept| / min(K_l, n), measured per decision
  double uor_min = 0.0;
  double uor_max = 0.0;
  double uor_above_one = 0.0;       // share of decisions with UOR > 1
  double retained_mass = 0.0;       // mean over decisions of the LAST_ROW group-mean mass kept
  double needle_target_rate = 0.0;  // share of (needle, layer, group) targets kept
  double needle_all_targets = 0.0;  // share of needles kept at every one of their targets
  double needle_all_layers = 0.0;   // share of needles kept in every group of every layer
  // head_independent only (0 otherwise): the union-overhead certificates (docs/method.md),
  // averaged.
  double jaccard_mean = 0.0;
  double bonferroni_mean = 0.0;
  double sandwich_lower_mean = 0.0;
  double sandwich_upper_mean = 0.0;
  int64_t bound_violations = 0;  // decisions whose UOR falls outside a certificate
};

// The head-independent selection of one (budget, page size, layer, group): uor_groups.csv.
struct UorSample {
  double budget = 0.0;
  int page_size = 0;
  int layer = 0;
  int group = 0;
  double uor = 0.0;
  double jaccard_mean = 0.0;
  double jaccard_max = 0.0;
  double bonferroni = 0.0;
  double sandwich_lower = 0.0;
  double sandwich_upper = 0.0;
};

// One variant of the selection-scope analysis at one budget, as the LAYER frame layout keeps it
// (a page stays while any group keeps it): scope.csv.
struct ScopeRow {
  std::string policy;
  std::string scope;    // group | layer
  std::string combine;  // layer scope: mass_max | entropy_weighted | mass_mean; "-" otherwise
  double budget = 0.0;
  int page_size = 0;
  int64_t planned_frames = 0;       // sum over layers of min(K_l, n): P, in layer frames
  int64_t kept_frames = 0;          // sum over layers of the distinct pages kept
  double retained_mass = 0.0;       // mean over (layer, group) of the LAST_ROW group-mean mass
                                    // inside the layer's kept pages
  double needle_target_rate = 0.0;  // share of (needle, layer, group) targets kept
  double needle_all_targets = 0.0;  // share of needles kept at every one of their targets
};

// One measurement of the head-weight analysis: heads.csv.
struct HeadRow {
  std::string analysis;  // class_weight | mixed_group_weight | tau_sweep | alpha_sweep
  std::string x;         // head class, tau or alpha
  std::string variant;   // raw | isolated
  std::string metric;
  double value = 0.0;
};

// One T of the closed-form and single-group needle check: closed_form.csv.
struct ClosedFormRow {
  // "paper_table": the needle bound's instantiation (docs/method.md, C10; eta = ln 2), arithmetic
  // only, no measurement; "single_group": one needle head (0.95 at one token, the rest uniform) and
  // r - 1 uniform siblings pooled by the core, eta measured from the needle head.
  std::string check;
  int64_t tokens = 0;
  int r = 0;
  double delta = 0.0;            // NeedleBoundDelta with the measured eta of the needle head
  double pooled_bound = 0.0;     // (1 - eps) - Delta
  double pooled_measured = 0.0;  // page_entrokv's pooled value at the needle (NaN: none)
  double mean_closed = 0.0;      // MeanPooledNeedle
  double mean_measured = 0.0;    // the mean of the rows at the needle (NaN: none)
  double eta = 0.0;              // eta_ret used in the bound
};

struct EvalResults {
  ModelPreset model;
  int64_t tokens = 0;
  uint64_t seed = 0;
  std::string source;  // "synthetic" or the trace's source
  std::vector<NeedleSpan> needles;
  std::vector<EvalRow> rows;  // policies x budgets x page sizes, in that nesting
  std::vector<UorSample> uor_samples;
  std::vector<HeadRow> head_rows;
  std::vector<ClosedFormRow> closed_form;
  std::vector<ScopeRow> scope_rows;  // variants x budgets, in that nesting
  std::vector<std::string> notes;    // e.g. a policy wants ACCUMULATED and a trace has none
  double seconds = 0.0;
};

struct EvalProgress {
  int layer = 0;  // layers done
  int layers = 0;
  double seconds = 0.0;
};
using EvalProgressFn = std::function<void(const EvalProgress&)>;

// Runs the matrix in memory. Errors from the core (a bad trace) come back as they are.
[[nodiscard]] absl::StatusOr<EvalResults> Evaluate(const EvalOptions& options,
                                                   const EvalProgressFn& progress);

struct EvalOutcome {
  EvalResults results;
  std::vector<std::string> files;  // written, relative to out_dir
  bool plots_ok = false;
  std::string plot_message;  // why the plots are missing, when they are
};

// Evaluate, then write results.csv, uor_groups.csv, heads.csv, closed_form.csv, report.md and
// (options.plots) the PNGs. A failing plot script is reported in plot_message and report.md,
// not as an error; INTERNAL when a file cannot be written.
[[nodiscard]] absl::StatusOr<EvalOutcome> RunEvaluation(const EvalOptions& options,
                                                        const EvalProgressFn& progress);

}  // namespace entrokv::sim

#endif  // ENTROKV_SIM_EVAL_H_
