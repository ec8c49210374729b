// report.md is generated from the same EvalResults the CSV files hold, so every number in it
// can be traced to a row. Tables use the reference page size (EvalOptions::reference_page_size
// when evaluated) unless they say otherwise.
#include "sim/report.h"

#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/scoring/metrics.h"
#include "core/util/status_macros.h"
#include "sim/closed_form.h"

extern char** environ;

namespace entrokv::sim {
namespace {

std::string Num(double value) {
  if (std::isnan(value)) return "";
  return absl::StrFormat("%.9g", value);
}
std::string Fixed(double value, int digits = 3) {
  if (std::isnan(value)) return "-";
  return absl::StrFormat("%.*f", digits, value);
}
std::string Percent(double fraction) { return absl::StrFormat("%g%%", fraction * 100.0); }

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

std::string Join(const std::string& dir, const std::string& file) {
  return (std::filesystem::path(dir) / file).string();
}

class Tables {
 public:
  // The tables show `reference_page` when it was evaluated, else the smallest page size.
  Tables(const EvalResults& results, int reference_page) : results_(results) {
    for (const EvalRow& row : results.rows) {
      if (std::find(policies_.begin(), policies_.end(), row.policy) == policies_.end()) {
        policies_.push_back(row.policy);
      }
      budgets_.insert(row.budget);
      page_sizes_.insert(row.page_size);
    }
    reference_page_ =
        page_sizes_.count(reference_page) != 0 ? reference_page : *page_sizes_.begin();
  }

  const EvalRow* Find(const std::string& policy, double budget, int page_size) const {
    for (const EvalRow& row : results_.rows) {
      if (row.policy == policy && row.budget == budget && row.page_size == page_size) return &row;
    }
    return nullptr;
  }
  bool HasPolicy(const std::string& name) const {
    return std::find(policies_.begin(), policies_.end(), name) != policies_.end();
  }

  // A policy x budget table of one field at the reference page size.
  template <typename Field>
  std::string PolicyByBudget(Field field, int digits = 3) const {
    std::string out = "| policy |";
    for (const double budget : budgets_) absl::StrAppend(&out, " ", Percent(budget), " |");
    absl::StrAppend(&out, "\n|---|");
    for (size_t i = 0; i < budgets_.size(); ++i) absl::StrAppend(&out, "---|");
    absl::StrAppend(&out, "\n");
    for (const std::string& policy : policies_) {
      absl::StrAppend(&out, "| ", policy, " |");
      for (const double budget : budgets_) {
        const EvalRow* row = Find(policy, budget, reference_page_);
        absl::StrAppend(&out, " ", row == nullptr ? "-" : Fixed(field(*row), digits), " |");
      }
      absl::StrAppend(&out, "\n");
    }
    return out;
  }

  const std::vector<std::string>& policies() const { return policies_; }
  const std::set<double>& budgets() const { return budgets_; }
  const std::set<int>& page_sizes() const { return page_sizes_; }
  int reference_page() const { return reference_page_; }

 private:
  const EvalResults& results_;
  std::vector<std::string> policies_;
  std::set<double> budgets_;
  std::set<int> page_sizes_;
  int reference_page_ = 0;
};

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

std::string UnionSection(const EvalResults& results, const Tables& tables) {
  const int page = tables.reference_page();
  std::string out = absl::StrCat(
      "## 1. Union overhead\n\n"
      "`head_independent` lets every head pick its own top-K pages and keeps the union; the "
      "pooled policies pick once per group. UOR = |kept| / K is counted for every (layer, group) "
      "decision, for every policy alike. The certificates (docs/method.md) are computed from the "
      "measured pairwise Jaccard similarities of the per-head sets; *violations* counts "
      "decisions whose UOR falls outside them (must be 0). B = ",
      page,
      ".\n\n| budget | head_independent UOR mean | median | max | share > 1 | "
      "Bonferroni lower (mean) | sandwich lower (mean) | sandwich upper (mean) | violations | "
      "pooled policies: measured UOR (min - max) |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const double budget : tables.budgets()) {
    std::vector<double> samples;
    for (const UorSample& sample : results.uor_samples) {
      if (sample.budget == budget && sample.page_size == page) samples.push_back(sample.uor);
    }
    double pooled_min = 1e300;
    double pooled_max = 0.0;
    int64_t pooled_decisions = 0;
    for (const EvalRow& row : results.rows) {
      if (row.policy == "head_independent" || row.budget != budget || row.page_size != page) {
        continue;
      }
      pooled_min = std::min(pooled_min, row.uor_min);
      pooled_max = std::max(pooled_max, row.uor_max);
      pooled_decisions += row.groups;
    }
    const EvalRow* hi = tables.Find("head_independent", budget, page);
    absl::StrAppend(&out, "| ", Percent(budget), " | ");
    if (hi != nullptr) {
      absl::StrAppend(&out, Fixed(hi->uor_mean), " | ", Fixed(Median(samples)), " | ",
                      Fixed(hi->uor_max), " | ", Fixed(hi->uor_above_one), " | ",
                      Fixed(hi->bonferroni_mean), " | ", Fixed(hi->sandwich_lower_mean), " | ",
                      Fixed(hi->sandwich_upper_mean), " | ", hi->bound_violations, " | ");
    } else {
      absl::StrAppend(&out, "- | - | - | - | - | - | - | - | ");
    }
    absl::StrAppend(&out,
                    pooled_decisions == 0
                        ? std::string("-")
                        : absl::StrCat(Fixed(pooled_min), " - ", Fixed(pooled_max), " over ",
                                       pooled_decisions, " decisions"),
                    " |\n");
  }
  if (tables.HasPolicy("head_independent")) {
    absl::StrAppend(&out, "\nhead_independent mean UOR by page size:\n\n| budget |");
    for (const int size : tables.page_sizes()) absl::StrAppend(&out, " B = ", size, " |");
    absl::StrAppend(&out, "\n|---|");
    for (size_t i = 0; i < tables.page_sizes().size(); ++i) absl::StrAppend(&out, "---|");
    absl::StrAppend(&out, "\n");
    for (const double budget : tables.budgets()) {
      absl::StrAppend(&out, "| ", Percent(budget), " |");
      for (const int size : tables.page_sizes()) {
        const EvalRow* row = tables.Find("head_independent", budget, size);
        absl::StrAppend(&out, " ", row == nullptr ? "-" : Fixed(row->uor_mean), " |");
      }
      absl::StrAppend(&out, "\n");
    }
  }
  absl::StrAppend(&out, "\n![union overhead](uor.png)\n\n");
  return out;
}

std::string NeedleSection(const EvalResults& results, const Tables& tables) {
  std::string out =
      absl::StrCat("## 2. Needle retention\n\n", results.needles.size(), " needles of ",
                   results.needles.empty() ? 0 : results.needles[0].end - results.needles[0].begin,
                   " tokens at depths ");
  std::vector<std::string> depths;
  for (const NeedleSpan& needle : results.needles) {
    depths.push_back(
        absl::StrCat(Percent(needle.depth), " (tokens ", needle.begin, "-", needle.end - 1, ")"));
  }
  absl::StrAppend(
      &out, absl::StrJoin(depths, ", "),
      ". A needle is kept by a (layer, group) decision when every page its span touches is "
      "kept. Its *targets* are the (layer, group) pairs with a head that puts at least the "
      "retrieval share of its row on the needle (measured, so it works on real traces). "
      "B = ",
      tables.reference_page(),
      ".\n\n"
      "Share of (needle, layer, group) targets kept:\n\n",
      tables.PolicyByBudget([](const EvalRow& row) { return row.needle_target_rate; }),
      "\nShare of needles kept at every one of their targets (all layers that look at them):\n\n",
      tables.PolicyByBudget([](const EvalRow& row) { return row.needle_all_targets; }),
      "\nShare of needles kept in every group of every layer (the strict criterion: also the "
      "groups where no head looks at the needle must keep it):\n\n",
      tables.PolicyByBudget([](const EvalRow& row) { return row.needle_all_layers; }),
      "\n![needle retention](needle.png)\n\n");
  return out;
}

std::string MassSection(const Tables& tables) {
  std::string out = absl::StrCat(
      "## 3. Retained attention mass\n\n"
      "Share of the group-mean LAST_ROW attention inside the kept pages, averaged over every "
      "(layer, group) decision (",
      AccumulatedPolicyNames(),
      " selects on its ACCUMULATED statistic but is scored on the same LAST_ROW mass). "
      "head_independent keeps up to r x K pages, so its mass is not at an equal budget. B = ",
      tables.reference_page(), ".\n\n",
      tables.PolicyByBudget([](const EvalRow& row) { return row.retained_mass; }),
      "\n![retained mass](mass.png)\n\n![page size](page_size.png)\n\n");
  return out;
}

std::string SinkSection(const EvalResults& results, const EvalOptions& options) {
  std::map<std::string, double> value;
  for (const HeadRow& row : results.head_rows) {
    value[absl::StrCat(row.analysis, "/", row.x, "/", row.variant, "/", row.metric)] = row.value;
  }
  const int r = results.model.group_size();
  std::string out = absl::StrCat(
      "## 4. Sink masquerade\n\n"
      "Heads are classed by measurement: *sink* puts at least ",
      options.sink_head_mass, " of its row on the first ", options.sink_tokens,
      " tokens, *retrieval* at least ", options.retrieval_head_mass,
      " on one needle. Mean head weight (tau = ", options.tau, ", alpha = ", options.alpha,
      ", uniform = 1/r = ", Fixed(1.0 / r),
      ") with raw entropy (raw_entropy) and sink-isolated entropy (page_entrokv):\n\n"
      "| class | heads | all groups: raw | all groups: isolated | heads in mixed groups | "
      "mixed groups: raw | mixed groups: isolated |\n|---|---|---|---|---|---|---|\n");
  for (const char* name : {"sink", "retrieval", "other"}) {
    const std::string c = name;
    absl::StrAppend(&out, "| ", c, " | ", value["class_weight/" + c + "/raw/heads"], " | ",
                    Fixed(value["class_weight/" + c + "/raw/mean_weight"]), " | ",
                    Fixed(value["class_weight/" + c + "/isolated/mean_weight"]), " | ",
                    value["mixed_group_weight/" + c + "/raw/heads"], " | ",
                    Fixed(value["mixed_group_weight/" + c + "/raw/mean_weight"]), " | ",
                    Fixed(value["mixed_group_weight/" + c + "/isolated/mean_weight"]), " |\n");
  }
  absl::StrAppend(&out,
                  "\n*Mixed groups* hold at least one sink and one retrieval head.\n\n"
                  "Temperature sweep: mean over groups of the largest head weight "
                  "(alpha = ",
                  options.alpha, "):\n\n| tau | raw | isolated |\n|---|---|---|\n");
  for (const double tau : options.tau_sweep) {
    const std::string x = absl::StrCat(tau);
    absl::StrAppend(&out, "| ", x, " | ", Fixed(value["tau_sweep/" + x + "/raw/max_weight_mean"]),
                    " | ", Fixed(value["tau_sweep/" + x + "/isolated/max_weight_mean"]), " |\n");
  }
  absl::StrAppend(&out, "\nOrder sweep (tau = ", options.tau,
                  "): largest head weight, and the retrieval heads' weight in mixed groups:\n\n"
                  "| alpha | max weight raw | max weight isolated | retrieval weight raw | "
                  "retrieval weight isolated |\n|---|---|---|---|---|\n");
  for (const double alpha : options.alpha_sweep) {
    const std::string x = alpha >= 1e300 ? "inf" : absl::StrCat(alpha);
    absl::StrAppend(&out, "| ", x, " | ", Fixed(value["alpha_sweep/" + x + "/raw/max_weight_mean"]),
                    " | ", Fixed(value["alpha_sweep/" + x + "/isolated/max_weight_mean"]), " | ",
                    Fixed(value["alpha_sweep/" + x + "/raw/retrieval_weight_mixed"]), " | ",
                    Fixed(value["alpha_sweep/" + x + "/isolated/retrieval_weight_mixed"]), " |\n");
  }
  absl::StrAppend(&out, "\n![sink masquerade](masquerade.png)\n\n");
  return out;
}

std::string ExactnessSection(const EvalResults& results, const Tables& tables) {
  std::string out =
      "## 5. Exactness\n\n"
      "For every page size and budget the planner's quota K_l is compared with the pages each "
      "decision kept (min(K_l, n) when K_l exceeds the page count).\n\n"
      "| policy | cells with every decision exact | decisions exact | kept / planned frames "
      "(min - max over cells) |\n|---|---|---|---|\n";
  for (const std::string& policy : tables.policies()) {
    int cells = 0;
    int exact_cells = 0;
    int64_t decisions = 0;
    int64_t exact = 0;
    double ratio_min = 1e300;
    double ratio_max = 0.0;
    for (const EvalRow& row : results.rows) {
      if (row.policy != policy) continue;
      ++cells;
      exact_cells += row.exact_groups == row.groups ? 1 : 0;
      decisions += row.groups;
      exact += row.exact_groups;
      const double ratio = static_cast<double>(row.kept_frames) /
                           static_cast<double>(std::max<int64_t>(row.planned_frames, 1));
      ratio_min = std::min(ratio_min, ratio);
      ratio_max = std::max(ratio_max, ratio);
    }
    absl::StrAppend(&out, "| ", policy, " | ", exact_cells, " / ", cells, " | ", exact, " / ",
                    decisions, " | ", Fixed(ratio_min, 4), " - ", Fixed(ratio_max, 4), " |\n");
  }
  return out + "\n";
}

std::string ClosedFormSection(const EvalResults& results) {
  if (results.closed_form.empty()) return "";
  std::string out =
      "## 6. Closed forms\n\n"
      "The needle bound's instantiation (docs/method.md, claim C10: r = 8, tau = 0.5, "
      "eta_ret = ln 2, 1 - eps = 0.95, 4 sinks), computed by NeedleBoundDelta / "
      "MeanPooledNeedle:\n\n"
      "| T | Delta(T) | pooled bound | mean (T -> inf) | ratio |\n|---|---|---|---|---|\n";
  for (const ClosedFormRow& row : results.closed_form) {
    if (row.check != "paper_table") continue;
    absl::StrAppend(&out, "| ", row.tokens, " | ", absl::StrFormat("%.3g", row.delta), " | ",
                    Fixed(row.pooled_bound, 6), " | ", Fixed(row.mean_closed, 6), " | ",
                    absl::StrFormat("%.2fx", row.pooled_bound / row.mean_closed), " |\n");
  }
  absl::StrAppend(
      &out, "\nMean dilution (1 - eps) / r: r = 8 gives ", Fixed(kNeedleMass / 8.0, 5),
      ", r = 6 gives ", Fixed(kNeedleMass / 6.0, 4),
      ".\n\nSingle-group check: one needle head (0.95 on one token, the rest uniform) and r - 1 "
      "uniform siblings, pooled by the core (sink-isolated H_2, tau as evaluated); eta_ret is the "
      "needle head's measured entropy:\n\n"
      "| r | T | eta_ret | Delta(T) | bound (1-eps)-Delta | pooled, measured | holds | "
      "mean, closed form | mean, measured |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const ClosedFormRow& row : results.closed_form) {
    if (row.check != "single_group") continue;
    absl::StrAppend(&out, "| ", row.r, " | ", row.tokens, " | ", Fixed(row.eta, 4), " | ",
                    absl::StrFormat("%.3g", row.delta), " | ", Fixed(row.pooled_bound, 6), " | ",
                    Fixed(row.pooled_measured, 6), " | ",
                    row.pooled_measured >= row.pooled_bound - Float32PoolingTolerance(kNeedleMass)
                        ? "yes"
                        : "**no**",
                    " | ", Fixed(row.mean_closed, 6), " | ", Fixed(row.mean_measured, 6), " |\n");
  }
  return out + "\n";
}

// Where another policy beats page_entrokv at an equal budget (head_independent excluded: it
// keeps more than the budget).
std::string LossSection(const Tables& tables) {
  if (!tables.HasPolicy("page_entrokv")) return "";
  std::string out =
      "## 7. Where page_entrokv loses\n\n"
      "Cells (every page size) where an exact-budget policy scores higher than page_entrokv:\n\n";
  int lines = 0;
  struct Metric {
    const char* name;
    double (*get)(const EvalRow&);
  };
  const Metric metrics[] = {
      {"retained mass", [](const EvalRow& row) { return row.retained_mass; }},
      {"needle targets kept", [](const EvalRow& row) { return row.needle_target_rate; }},
  };
  for (const Metric& metric : metrics) {
    for (const int page_size : tables.page_sizes()) {
      for (const double budget : tables.budgets()) {
        const EvalRow* ours = tables.Find("page_entrokv", budget, page_size);
        if (ours == nullptr) continue;
        std::vector<std::string> winners;
        for (const std::string& policy : tables.policies()) {
          if (policy == "page_entrokv" || policy == "head_independent") continue;
          const EvalRow* row = tables.Find(policy, budget, page_size);
          if (row != nullptr && metric.get(*row) > metric.get(*ours) + 1e-9) {
            winners.push_back(absl::StrCat(policy, " ", Fixed(metric.get(*row))));
          }
        }
        if (winners.empty()) continue;
        ++lines;
        absl::StrAppend(&out, "- ", metric.name, " at ", Percent(budget), ", B = ", page_size,
                        ": page_entrokv ", Fixed(metric.get(*ours)), " < ",
                        absl::StrJoin(winners, ", "), "\n");
      }
    }
  }
  if (lines == 0) absl::StrAppend(&out, "- none on these metrics\n");
  return out + "\n";
}

std::string ScopeSection(const EvalResults& results) {
  if (results.scope_rows.empty()) return "";
  std::string out = absl::StrCat(
      "## 8. Selection scope (LAYER frame layout)\n\n"
      "In the LAYER frame layout (vLLM, SGLang) a page holds every KV group of a layer and stays "
      "while any group keeps it. *group* scope selects per (layer, group) and keeps the union; "
      "*layer* scope combines the groups' page scores into one score per page (mass_max: each "
      "group's scores normalised to its own mass, max over groups; entropy_weighted: their sum "
      "weighted by softmax(-H_g / tau) of the groups' page-score entropies; mass_mean: the plain "
      "mean) and keeps exactly min(K_l, n) pages per layer. head_independent keeps the union "
      "over the layer's heads. Frames, mass and needles are counted on the pages the layout keeps "
      "(the union over the groups), B = ",
      results.scope_rows.front().page_size,
      "; mass and needle targets per (layer, group) as in sections 2-3.\n\n"
      "| policy | scope | combine | budget | frames / planned | retained mass | needle targets "
      "| needles at every target |\n|---|---|---|---|---|---|---|---|\n");
  for (const ScopeRow& row : results.scope_rows) {
    absl::StrAppend(&out, "| ", row.policy, " | ", row.scope, " | ", row.combine, " | ",
                    Percent(row.budget), " | ", row.kept_frames, " / ", row.planned_frames, " (",
                    Fixed(static_cast<double>(row.kept_frames) /
                              static_cast<double>(std::max<int64_t>(row.planned_frames, 1)),
                          2),
                    "x) | ", Fixed(row.retained_mass), " | ", Fixed(row.needle_target_rate), " | ",
                    Fixed(row.needle_all_targets), " |\n");
  }
  absl::StrAppend(&out, "\n![selection scope](scope.png)\n\n");
  return out;
}

}  // namespace

std::string ResultsCsvHeader() {
  return "model,tokens,seed,policy,statistic,budget,page_size,planned_frames,kept_frames,groups,"
         "exact_groups,uor_mean,uor_min,uor_max,uor_above_one,retained_mass,needle_target_rate,"
         "needle_all_targets,needle_all_layers,jaccard_mean,bonferroni_mean,"
         "sandwich_lower_mean,sandwich_upper_mean,bound_violations";
}

absl::StatusOr<std::vector<std::string>> WriteEvalCsv(const EvalResults& results,
                                                      const std::string& out_dir) {
  std::string csv = ResultsCsvHeader() + "\n";
  for (const EvalRow& row : results.rows) {
    absl::StrAppend(&csv, results.model.name, ",", results.tokens, ",", results.seed, ",",
                    row.policy, ",", row.statistic, ",", Num(row.budget), ",", row.page_size, ",",
                    row.planned_frames, ",", row.kept_frames, ",", row.groups, ",",
                    row.exact_groups, ",", Num(row.uor_mean), ",", Num(row.uor_min), ",",
                    Num(row.uor_max), ",", Num(row.uor_above_one), ",", Num(row.retained_mass), ",",
                    Num(row.needle_target_rate), ",", Num(row.needle_all_targets), ",",
                    Num(row.needle_all_layers), ",", Num(row.jaccard_mean), ",",
                    Num(row.bonferroni_mean), ",", Num(row.sandwich_lower_mean), ",",
                    Num(row.sandwich_upper_mean), ",", row.bound_violations, "\n");
  }
  std::string uor =
      "budget,page_size,layer,group,uor,jaccard_mean,jaccard_max,bonferroni,"
      "sandwich_lower,sandwich_upper\n";
  for (const UorSample& s : results.uor_samples) {
    absl::StrAppend(&uor, Num(s.budget), ",", s.page_size, ",", s.layer, ",", s.group, ",",
                    Num(s.uor), ",", Num(s.jaccard_mean), ",", Num(s.jaccard_max), ",",
                    Num(s.bonferroni), ",", Num(s.sandwich_lower), ",", Num(s.sandwich_upper),
                    "\n");
  }
  std::string heads = "analysis,x,variant,metric,value\n";
  for (const HeadRow& row : results.head_rows) {
    absl::StrAppend(&heads, row.analysis, ",", row.x, ",", row.variant, ",", row.metric, ",",
                    Num(row.value), "\n");
  }
  std::string closed =
      "check,tokens,r,eta,delta,pooled_bound,pooled_measured,mean_closed,"
      "mean_measured\n";
  for (const ClosedFormRow& row : results.closed_form) {
    absl::StrAppend(&closed, row.check, ",", row.tokens, ",", row.r, ",", Num(row.eta), ",",
                    Num(row.delta), ",", Num(row.pooled_bound), ",", Num(row.pooled_measured), ",",
                    Num(row.mean_closed), ",", Num(row.mean_measured), "\n");
  }
  std::string scope =
      "model,tokens,seed,policy,scope,combine,budget,page_size,planned_frames,kept_frames,"
      "retained_mass,needle_target_rate,needle_all_targets\n";
  for (const ScopeRow& row : results.scope_rows) {
    absl::StrAppend(&scope, results.model.name, ",", results.tokens, ",", results.seed, ",",
                    row.policy, ",", row.scope, ",", row.combine, ",", Num(row.budget), ",",
                    row.page_size, ",", row.planned_frames, ",", row.kept_frames, ",",
                    Num(row.retained_mass), ",", Num(row.needle_target_rate), ",",
                    Num(row.needle_all_targets), "\n");
  }
  const std::vector<std::pair<std::string, const std::string*>> files = {
      {"results.csv", &csv},
      {"scope.csv", &scope},
      {"uor_groups.csv", &uor},
      {"heads.csv", &heads},
      {"closed_form.csv", &closed}};
  std::vector<std::string> names;
  for (const auto& [name, text] : files) {
    if (absl::Status status = WriteFile(Join(out_dir, name), *text); !status.ok()) return status;
    names.push_back(name);
  }
  return names;
}

absl::Status WriteReportMarkdown(const EvalResults& results, const EvalOptions& options,
                                 const std::string& plot_note, const std::string& out_dir) {
  const Tables tables(results, options.reference_page_size);
  const ModelPreset& model = results.model;
  std::vector<std::string> budgets;
  for (const double budget : tables.budgets()) budgets.push_back(Percent(budget));
  std::string md =
      absl::StrCat("# entrokv evaluation: ", model.name, ", T = ", results.tokens,
                   "\n\n"
                   "- source: ",
                   results.source,
                   "\n"
                   "- geometry: ",
                   model.layers, " layers, ", model.query_heads, " query heads, ", model.kv_groups,
                   " KV groups (r = ", model.group_size(), "), head dim ", model.head_dim,
                   "\n- policies: ", absl::StrJoin(tables.policies(), ", "),
                   "\n- budgets (share of T x L): ", absl::StrJoin(budgets, ", "),
                   "; page sizes: ", absl::StrJoin(tables.page_sizes(), ", "),
                   "; uniform layer allocation\n"
                   "- scoring: tau = ",
                   options.tau, ", alpha = ", options.alpha,
                   ", sink tokens = ", options.sink_tokens, "; ", AccumulatedPolicyNames(),
                   " is given an ACCUMULATED statistic, the others LAST_ROW\n"
                   "- run time: ",
                   absl::StrFormat("%.1f", results.seconds), " s\n");
  for (const std::string& note : results.notes) absl::StrAppend(&md, "- note: ", note, "\n");
  if (!plot_note.empty()) absl::StrAppend(&md, "- plots: not drawn: ", plot_note, "\n");
  absl::StrAppend(&md,
                  "\nEvery number is counted from the decisions the core made "
                  "(PlanBudget, DecideLayer), including the pooled policies' UOR.\n\n",
                  UnionSection(results, tables), NeedleSection(results, tables),
                  MassSection(tables), SinkSection(results, options),
                  ExactnessSection(results, tables), ClosedFormSection(results),
                  LossSection(tables), ScopeSection(results));
  return WriteFile(Join(out_dir, "report.md"), md);
}

std::vector<std::string> PlotFiles() {
  return {"uor.png", "needle.png", "mass.png", "page_size.png", "masquerade.png", "scope.png"};
}

absl::Status RunPlotScript(const std::string& python, const std::string& script,
                           const std::string& out_dir) {
  if (!std::filesystem::exists(script)) {
    return absl::FailedPreconditionError(absl::StrCat("plot script ", script, " not found"));
  }
  std::vector<std::string> args = {python, script, "--out", out_dir};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (const int error = posix_spawn(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
      error != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot start ", python, ": error ", error));
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) {
    return absl::FailedPreconditionError("waitpid failed for the plot script");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        python, " ", script, " failed with status ", WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  }
  return absl::OkStatus();
}

std::string DefaultPlotScript() {
  // Found relative to the running binary, so a moved or installed build still finds it: the build
  // copies the script beside each binary that needs it; an installed tree keeps it in share/.
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  const std::filesystem::path dir =
      error ? std::filesystem::current_path(error) : exe.parent_path();
  const std::filesystem::path candidates[] = {
      dir / kPlotScriptName, dir.parent_path() / "share" / "entrokv" / kPlotScriptName};
  for (const std::filesystem::path& candidate : candidates) {
    if (std::filesystem::exists(candidate, error)) return candidate.string();
  }
  return candidates[0].string();  // so that "not found" names where it was looked for first
}

absl::StatusOr<EvalOutcome> RunEvaluation(const EvalOptions& options,
                                          const EvalProgressFn& progress) {
  RETURN_IF_ERROR(ValidateEvalOptions(options));
  if (options.out_dir.empty())
    return absl::InvalidArgumentError("out: an output directory is needed");
  std::error_code error;
  std::filesystem::create_directories(options.out_dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat(options.out_dir, ": cannot create: ", error.message()));
  }
  EvalOutcome outcome;
  ASSIGN_OR_RETURN(outcome.results, Evaluate(options, progress));
  ASSIGN_OR_RETURN(outcome.files, WriteEvalCsv(outcome.results, options.out_dir));
  if (options.plots) {
    const std::string script =
        options.plot_script.empty() ? DefaultPlotScript() : options.plot_script;
    const absl::Status plotted = RunPlotScript(options.python, script, options.out_dir);
    outcome.plots_ok = plotted.ok();
    if (plotted.ok()) {
      for (const std::string& png : PlotFiles()) outcome.files.push_back(png);
    } else {
      outcome.plot_message = std::string(plotted.message());
    }
  } else {
    outcome.plot_message = "disabled (--no-plots)";
  }
  RETURN_IF_ERROR(
      WriteReportMarkdown(outcome.results, options, outcome.plot_message, options.out_dir));
  outcome.files.push_back("report.md");
  return outcome;
}

}  // namespace entrokv::sim
