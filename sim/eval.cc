// The evaluation matrix. For every layer the statistic is produced once (generated or read from
// the trace); then every page size, budget and policy decides that layer through DecideLayer,
// and every number in results.csv is counted from those decisions: nothing is assumed, not even
// the pooled policies' UOR of 1. The head-independent per-head sets are recomputed here (the
// policy returns only their union) because the certificates need the pairwise Jaccard values.
#include "sim/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/scoring/budget.h"
#include "core/scoring/decision.h"
#include "core/scoring/entropy.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/metrics.h"
#include "core/scoring/pages.h"
#include "core/scoring/policy.h"
#include "core/scoring/selection.h"
#include "core/scoring/weights.h"
#include "core/util/status_macros.h"
#include "sim/closed_form.h"
#include "sim/needles.h"
#include "sim/workload.h"

namespace entrokv::sim {
namespace {

enum HeadClass { kSinkClass = 0, kRetrievalClass = 1, kOtherClass = 2, kClassCount = 3 };
constexpr const char* kClassNames[kClassCount] = {"sink", "retrieval", "other"};

// The statistic of every layer, from a generator or a loaded trace. Owns both.
class LayerSource {
 public:
  static absl::StatusOr<std::unique_ptr<LayerSource>> Open(const EvalOptions& options) {
    auto source = std::unique_ptr<LayerSource>(new LayerSource());
    if (!options.trace_dir.empty()) {
      ASSIGN_OR_RETURN(Trace trace, ReadTrace(options.trace_dir));
      source->trace_ = std::make_unique<Trace>(std::move(trace));
      source->model_ = source->trace_->meta.model;
      source->tokens_ = source->trace_->meta.tokens;
      source->needles_ = source->trace_->meta.needles;
      source->kind_ = source->trace_->meta.kind;
      source->source_ = source->trace_->meta.source.empty() ? "trace" : source->trace_->meta.source;
      return source;
    }
    ASSIGN_OR_RETURN(source->model_, FindPreset(options.model));
    WorkloadOptions workload;
    workload.tokens = options.tokens;
    workload.seed = options.seed;
    workload.sink_tokens = options.sink_tokens;
    RETURN_IF_ERROR(ValidateWorkloadOptions(workload));
    source->generator_ = std::make_unique<WorkloadGenerator>(source->model_, workload);
    source->tokens_ = options.tokens;
    source->needles_ = source->generator_->needles();
    source->source_ = absl::StrCat("synthetic (entrokv-sim, seed ", options.seed, ")");
    return source;
  }

  [[nodiscard]] bool has_accumulated() const {
    return generator_ != nullptr || !trace_->accumulated.empty();
  }
  // The scored statistic of `layer` into *out ([H_Q, T]).
  void Load(int layer, std::vector<float>* out) const {
    out->resize(static_cast<size_t>(int64_t{model_.query_heads} * tokens_));
    if (generator_ != nullptr) {
      generator_->GenerateLayer(layer, StatisticKind::kLastRow, *out);
    } else {
      const std::span<const float> data = trace_->Layer(layer);
      out->assign(data.begin(), data.end());
    }
  }
  // ACCUMULATED if there is one; REQUIRES: has_accumulated().
  void LoadAccumulated(int layer, std::vector<float>* out) const {
    out->resize(static_cast<size_t>(int64_t{model_.query_heads} * tokens_));
    if (generator_ != nullptr) {
      generator_->GenerateLayer(layer, StatisticKind::kAccumulated, *out);
    } else {
      const std::span<const float> data = trace_->AccumulatedLayer(layer);
      out->assign(data.begin(), data.end());
    }
  }

  const ModelPreset& model() const { return model_; }
  int64_t tokens() const { return tokens_; }
  const std::vector<NeedleSpan>& needles() const { return needles_; }
  StatisticKind kind() const { return kind_; }
  const std::string& source() const { return source_; }

 private:
  LayerSource() = default;
  std::unique_ptr<WorkloadGenerator> generator_;
  std::unique_ptr<Trace> trace_;
  ModelPreset model_;
  int64_t tokens_ = 0;
  std::vector<NeedleSpan> needles_;
  StatisticKind kind_ = StatisticKind::kLastRow;
  std::string source_;
};

// Running sums of one results.csv row.
struct Cell {
  int64_t planned = 0;
  int64_t kept = 0;
  int64_t groups = 0;
  int64_t exact = 0;
  double uor_sum = 0.0;
  double uor_min = 1e300;
  double uor_max = 0.0;
  int64_t uor_above_one = 0;
  double mass_sum = 0.0;
  int64_t targets = 0;
  int64_t targets_kept = 0;
  std::vector<char> needle_all_targets;
  std::vector<char> needle_all_layers;
  double jaccard_sum = 0.0;
  double bonferroni_sum = 0.0;
  double lower_sum = 0.0;
  double upper_sum = 0.0;
  int64_t violations = 0;
};

// One variant of the selection-scope analysis and its running sums, per budget.
struct ScopeVariant {
  const Policy* policy = nullptr;
  SelectionScope scope = SelectionScope::kGroup;
  LayerCombine combine = kDefaultLayerCombine;
  struct Sums {
    int64_t planned = 0;
    int64_t kept = 0;
    int64_t groups = 0;
    double mass_sum = 0.0;
    int64_t targets = 0;
    int64_t targets_kept = 0;
    std::vector<char> needle_all_targets;
  };
  std::vector<Sums> per_budget;
};

struct WeightSums {
  double sum = 0.0;
  int64_t count = 0;
  void Add(double value) {
    sum += value;
    ++count;
  }
  double Mean() const { return count == 0 ? 0.0 : sum / static_cast<double>(count); }
};

std::string AlphaLabel(double alpha) {
  return alpha >= 1e300 ? std::string("inf") : absl::StrCat(alpha);
}

// The per-layer head measurements the sink analysis and the needle targets need.
struct HeadFacts {
  std::vector<int> head_class;  // HeadClass per head
  // targets[g] = needles some retrieval head of group g looks at.
  std::vector<std::vector<int>> targets;
};

HeadFacts MeasureHeads(std::span<const float> layer, const ModelPreset& model, int64_t tokens,
                       const std::vector<NeedleSpan>& needles, const EvalOptions& options) {
  HeadFacts facts;
  const int r = model.group_size();
  facts.targets.resize(static_cast<size_t>(model.kv_groups));
  for (int h = 0; h < model.query_heads; ++h) {
    const std::span<const float> row =
        layer.subspan(static_cast<size_t>(h * tokens), static_cast<size_t>(tokens));
    double total = 0.0;
    for (const float value : row) total += value;
    total = std::max(total, 1e-300);
    double sink = 0.0;
    for (int64_t t = 0; t < std::min<int64_t>(options.sink_tokens, tokens); ++t) sink += row[t];
    int head_class = sink / total >= options.sink_head_mass ? kSinkClass : kOtherClass;
    std::vector<int>& group_targets = facts.targets[static_cast<size_t>(h / r)];
    for (const int j : NeedlesLookedAt(row, needles, options.retrieval_head_mass)) {
      if (head_class != kSinkClass) head_class = kRetrievalClass;
      if (std::find(group_targets.begin(), group_targets.end(), j) == group_targets.end()) {
        group_targets.push_back(j);
      }
    }
    facts.head_class.push_back(head_class);
  }
  return facts;
}

// Head weights under raw and sink-isolated entropy: class means, tau and alpha sweeps.
class WeightAnalysis {
 public:
  explicit WeightAnalysis(const EvalOptions& options)
      : options_(options),
        tau_max_(options.tau_sweep.size() * 2),
        alpha_max_(options.alpha_sweep.size() * 2),
        alpha_retrieval_(options.alpha_sweep.size() * 2) {}

  void AddLayer(std::span<const float> layer, const ModelPreset& model, int64_t tokens,
                const HeadFacts& facts) {
    const int r = model.group_size();
    for (int g = 0; g < model.kv_groups; ++g) {
      std::vector<std::span<const float>> rows;
      bool has_sink = false;
      bool has_retrieval = false;
      for (int i = 0; i < r; ++i) {
        const int h = g * r + i;
        rows.push_back(layer.subspan(static_cast<size_t>(h * tokens), static_cast<size_t>(tokens)));
        has_sink |= facts.head_class[static_cast<size_t>(h)] == kSinkClass;
        has_retrieval |= facts.head_class[static_cast<size_t>(h)] == kRetrievalClass;
      }
      const bool mixed = has_sink && has_retrieval;
      bool default_done = false;
      for (size_t a = 0; a < options_.alpha_sweep.size(); ++a) {
        const bool is_default = options_.alpha_sweep[a] == options_.alpha;
        AddGroup(rows, facts, g, r, options_.alpha_sweep[a], static_cast<int>(a), is_default,
                 mixed);
        default_done |= is_default;
      }
      if (!default_done) AddGroup(rows, facts, g, r, options_.alpha, -1, true, mixed);
    }
  }

  void Emit(std::vector<HeadRow>* out) const {
    const char* variants[2] = {"raw", "isolated"};
    for (int c = 0; c < kClassCount; ++c) {
      for (int v = 0; v < 2; ++v) {
        out->push_back({"class_weight", kClassNames[c], variants[v], "mean_weight",
                        class_weight_[c][v].Mean()});
        out->push_back({"class_weight", kClassNames[c], variants[v], "heads",
                        static_cast<double>(class_weight_[c][v].count)});
        out->push_back({"mixed_group_weight", kClassNames[c], variants[v], "mean_weight",
                        mixed_weight_[c][v].Mean()});
        out->push_back({"mixed_group_weight", kClassNames[c], variants[v], "heads",
                        static_cast<double>(mixed_weight_[c][v].count)});
      }
    }
    for (size_t k = 0; k < options_.tau_sweep.size(); ++k) {
      for (int v = 0; v < 2; ++v) {
        out->push_back({"tau_sweep", absl::StrCat(options_.tau_sweep[k]), variants[v],
                        "max_weight_mean", tau_max_[k * 2 + v].Mean()});
      }
    }
    for (size_t a = 0; a < options_.alpha_sweep.size(); ++a) {
      for (int v = 0; v < 2; ++v) {
        out->push_back({"alpha_sweep", AlphaLabel(options_.alpha_sweep[a]), variants[v],
                        "max_weight_mean", alpha_max_[a * 2 + v].Mean()});
        out->push_back({"alpha_sweep", AlphaLabel(options_.alpha_sweep[a]), variants[v],
                        "retrieval_weight_mixed", alpha_retrieval_[a * 2 + v].Mean()});
      }
    }
  }

 private:
  // One group at one order: `sweep` indexes alpha_sweep (-1: not in it); the default order
  // also feeds the class means and the tau sweep.
  void AddGroup(const std::vector<std::span<const float>>& rows, const HeadFacts& facts, int g,
                int r, double alpha_value, int sweep, bool is_default, bool mixed) {
    const double alpha = alpha_value >= 1e300 ? kAlphaInfinity : alpha_value;
    for (int variant = 0; variant < 2; ++variant) {  // 0 raw, 1 isolated
      std::vector<double> entropies;
      for (const auto row : rows) {
        entropies.push_back(
            SinkIsolatedEntropy(row, variant == 0 ? 0 : options_.sink_tokens, alpha));
      }
      const std::vector<double> weights = EntropyWeights(entropies, options_.tau);
      if (sweep >= 0) {
        const auto index = static_cast<size_t>(sweep * 2 + variant);
        alpha_max_[index].Add(*std::max_element(weights.begin(), weights.end()));
        if (mixed) {
          for (int i = 0; i < r; ++i) {
            if (facts.head_class[static_cast<size_t>(g * r + i)] == kRetrievalClass) {
              alpha_retrieval_[index].Add(weights[static_cast<size_t>(i)]);
            }
          }
        }
      }
      if (!is_default) continue;
      for (int i = 0; i < r; ++i) {
        const int c = facts.head_class[static_cast<size_t>(g * r + i)];
        class_weight_[c][variant].Add(weights[static_cast<size_t>(i)]);
        if (mixed) mixed_weight_[c][variant].Add(weights[static_cast<size_t>(i)]);
      }
      for (size_t k = 0; k < options_.tau_sweep.size(); ++k) {
        const std::vector<double> swept = EntropyWeights(entropies, options_.tau_sweep[k]);
        tau_max_[k * 2 + variant].Add(*std::max_element(swept.begin(), swept.end()));
      }
    }
  }

  const EvalOptions& options_;
  WeightSums class_weight_[kClassCount][2];
  WeightSums mixed_weight_[kClassCount][2];
  std::vector<WeightSums> tau_max_;
  std::vector<WeightSums> alpha_max_;
  std::vector<WeightSums> alpha_retrieval_;
};

// Head-independent per-head sets of one group: UOR and the certificates, checked.
UorSample AnalyseHeadIndependent(const std::vector<std::vector<float>>& page_maxima, int g, int r,
                                 int64_t quota, int64_t pages) {
  std::vector<std::vector<int32_t>> sets;
  for (int i = 0; i < r; ++i) {
    sets.push_back(SelectTopPages(page_maxima[static_cast<size_t>(g * r + i)], quota));
  }
  const int64_t k = std::min(quota, pages);
  UorSample sample;
  sample.group = g;
  sample.uor = UnionOverheadRatio(sets, k);
  const JaccardSummary jaccard = PairwiseJaccard(sets);
  sample.jaccard_mean = jaccard.mean_similarity;
  sample.jaccard_max = jaccard.max_similarity;
  sample.bonferroni = BonferroniLowerBound(r, jaccard.mean_similarity);
  if (r >= 2) {
    const UorBounds bounds = SandwichBounds(r, jaccard.mean_similarity, jaccard.max_similarity);
    sample.sandwich_lower = bounds.lower;
    sample.sandwich_upper = bounds.upper;
  } else {
    sample.sandwich_lower = sample.sandwich_upper = 1.0;
  }
  return sample;
}

// The policies to evaluate: the ones named, in their order, or every registered one.
absl::StatusOr<std::vector<const Policy*>> SelectedPolicies(const EvalOptions& options) {
  std::vector<const Policy*> policies;
  const std::vector<absl::string_view> names =
      options.policies.empty()
          ? PolicyNames()
          : std::vector<absl::string_view>(options.policies.begin(), options.policies.end());
  for (const absl::string_view name : names) {
    ASSIGN_OR_RETURN(const Policy* policy, FindPolicy(name));
    policies.push_back(policy);
  }
  return policies;
}

// The core planner's plan for every (page size, budget) cell, page size major.
absl::StatusOr<std::vector<BudgetPlan>> PlanEveryCell(const EvalOptions& options,
                                                      const ModelPreset& model, int64_t tokens) {
  std::vector<BudgetPlan> plans;
  for (const int page_size : options.page_sizes) {
    for (const double budget : options.budgets) {
      BudgetRequest request;
      request.layers = model.layers;
      request.kv_groups = model.kv_groups;
      request.page_size = page_size;
      request.tokens = tokens;
      request.fraction = budget;
      ASSIGN_OR_RETURN(BudgetPlan plan, PlanBudget(request));
      plans.push_back(std::move(plan));
    }
  }
  return plans;
}

// Adds one (layer, group) decision to its cell: cardinality and UOR, retained mass of the group
// mean, needles kept (targets and all layers) and, for the union policy, the certificates
// checked against the head-independent sample of the same group.
void AddGroupDecision(const std::vector<int32_t>& kept, int64_t expected,
                      std::span<const float> group_mean, int page_size,
                      const std::vector<NeedleSpan>& needles, const std::vector<int>& group_targets,
                      bool exact_budget, const UorSample& sample, Cell& cell) {
  const auto count = static_cast<int64_t>(kept.size());
  const double uor = static_cast<double>(count) / static_cast<double>(expected);
  cell.planned += expected;
  cell.kept += count;
  ++cell.groups;
  cell.exact += count == expected ? 1 : 0;
  cell.uor_sum += uor;
  cell.uor_min = std::min(cell.uor_min, uor);
  cell.uor_max = std::max(cell.uor_max, uor);
  cell.uor_above_one += count > expected ? 1 : 0;
  cell.mass_sum += RetainedMass(group_mean, page_size, kept);
  for (size_t j = 0; j < needles.size(); ++j) {
    const bool needle_kept = NeedleKept(needles[j], page_size, kept);
    if (!needle_kept) cell.needle_all_layers[j] = 0;
    if (std::find(group_targets.begin(), group_targets.end(), static_cast<int>(j)) !=
        group_targets.end()) {
      ++cell.targets;
      cell.targets_kept += needle_kept ? 1 : 0;
      if (!needle_kept) cell.needle_all_targets[j] = 0;
    }
  }
  if (!exact_budget) {
    cell.jaccard_sum += sample.jaccard_mean;
    cell.bonferroni_sum += sample.bonferroni;
    cell.lower_sum += sample.sandwich_lower;
    cell.upper_sum += sample.sandwich_upper;
    constexpr double kSlack = 1e-9;
    // The union the policy kept must be the union of the per-head sets, and every
    // certificate must hold on it.
    if (std::abs(uor - sample.uor) > kSlack || uor < sample.bonferroni - kSlack ||
        uor < sample.sandwich_lower - kSlack || uor > sample.sandwich_upper + kSlack) {
      ++cell.violations;
    }
  }
}

// One results.csv row from a finished cell (the caller fills statistic, budget and page size).
EvalRow RowOf(const Cell& cell, const std::vector<NeedleSpan>& needles,
              const std::vector<char>& needle_has_target, const Policy& policy) {
  EvalRow row;
  row.policy = std::string(policy.name());
  row.planned_frames = cell.planned;
  row.kept_frames = cell.kept;
  row.groups = cell.groups;
  row.exact_groups = cell.exact;
  const double n = static_cast<double>(std::max<int64_t>(cell.groups, 1));
  row.uor_mean = cell.uor_sum / n;
  row.uor_min = cell.groups == 0 ? 0.0 : cell.uor_min;
  row.uor_max = cell.uor_max;
  row.uor_above_one = static_cast<double>(cell.uor_above_one) / n;
  row.retained_mass = cell.mass_sum / n;
  row.needle_target_rate = cell.targets == 0 ? 0.0
                                             : static_cast<double>(cell.targets_kept) /
                                                   static_cast<double>(cell.targets);
  int64_t with_target = 0;
  int64_t all_targets = 0;
  int64_t all_layers = 0;
  for (size_t j = 0; j < needles.size(); ++j) {
    all_layers += cell.needle_all_layers[j];
    if (needle_has_target[j]) {
      ++with_target;
      all_targets += cell.needle_all_targets[j];
    }
  }
  row.needle_all_targets =
      with_target == 0 ? 0.0 : static_cast<double>(all_targets) / static_cast<double>(with_target);
  row.needle_all_layers =
      needles.empty() ? 0.0 : static_cast<double>(all_layers) / static_cast<double>(needles.size());
  if (!policy.exact_budget()) {
    row.jaccard_mean = cell.jaccard_sum / n;
    row.bonferroni_mean = cell.bonferroni_sum / n;
    row.sandwich_lower_mean = cell.lower_sum / n;
    row.sandwich_upper_mean = cell.upper_sum / n;
    row.bound_violations = cell.violations;
  }
  return row;
}

// Whether `policy` scores ACCUMULATED here: when it wants it and the source has one. Every other
// policy that reads a statistic scores the source's own (a policy that wants WINDOW_MEAN,
// snapkv, too: a source holds one recent statistic, LAST_ROW when generated).
bool ScoresAccumulated(const Policy& policy, bool source_has_accumulated) {
  return source_has_accumulated && policy.statistic() == StatisticKind::kAccumulated;
}

// The name of the statistic `policy` is given, for results.csv.
std::string GivenStatisticName(const Policy& policy, const LayerSource& source) {
  if (!policy.needs_statistic()) return "none";
  return std::string(StatisticKindName(ScoresAccumulated(policy, source.has_accumulated())
                                           ? StatisticKind::kAccumulated
                                           : source.kind()));
}

// One layer's statistics as the policies are given them. Views of the caller's buffers.
struct LayerStatistics {
  StatisticView own;                         // the source's statistic
  std::optional<StatisticView> accumulated;  // when a policy wants it and the source has it

  // What `policy` scores; none for a policy that reads no statistic.
  [[nodiscard]] std::optional<StatisticView> For(const Policy& policy) const {
    if (!policy.needs_statistic()) return std::nullopt;
    if (ScoresAccumulated(policy, accumulated.has_value())) return accumulated;
    return own;
  }
};

// Layer `layer` of the source into *values (and *accumulated when `with_accumulated`), as the
// views the policies score. INVALID_ARGUMENT for a negative or non-finite value.
absl::StatusOr<LayerStatistics> LoadLayer(const LayerSource& source, int layer,
                                          bool with_accumulated, std::vector<float>* values,
                                          std::vector<float>* accumulated) {
  const int heads = source.model().query_heads;
  source.Load(layer, values);
  ASSIGN_OR_RETURN(const StatisticView own,
                   StatisticView::Create(values->data(), DType::kFloat32, heads, source.tokens()));
  RETURN_IF_ERROR(own.ValidateValues());
  LayerStatistics statistics{own, std::nullopt};
  if (with_accumulated) {
    source.LoadAccumulated(layer, accumulated);
    ASSIGN_OR_RETURN(
        statistics.accumulated,
        StatisticView::Create(accumulated->data(), DType::kFloat32, heads, source.tokens()));
  }
  return statistics;
}

// The core's options for one page size of the evaluation.
PolicyOptions PolicyOptionsAt(const EvalOptions& options, int page_size) {
  PolicyOptions policy_options;
  policy_options.page_size = page_size;
  policy_options.sink_tokens = options.sink_tokens;
  policy_options.tau = options.tau;
  policy_options.alpha = options.alpha;
  return policy_options;
}

// The one request path: `policy` decides one layer with K = `quota` pages on the statistic it is
// given, in `scope` (group scope for the results matrix).
absl::StatusOr<LayerDecision> DecideOneLayer(
    const Policy& policy, const PolicyOptions& policy_options, const LayerStatistics& statistics,
    const ModelPreset& model, int64_t tokens, int64_t quota,
    SelectionScope scope = SelectionScope::kGroup, LayerCombine combine = kDefaultLayerCombine) {
  LayerRequest request;
  request.statistic = statistics.For(policy);
  request.query_heads = model.query_heads;
  request.kv_groups = model.kv_groups;
  request.tokens = tokens;
  request.quota_pages = quota;
  request.measure = false;
  request.scope = scope;
  request.combine = combine;
  return DecideLayer(policy, policy_options, request);
}

// The LAST_ROW group means of one layer: retained mass is measured on them, whatever a policy
// scored.
void GroupMeans(std::span<const float> layer, const ModelPreset& model, int64_t tokens,
                std::vector<std::vector<float>>* means) {
  const int r = model.group_size();
  means->resize(static_cast<size_t>(model.kv_groups));
  for (int g = 0; g < model.kv_groups; ++g) {
    std::vector<float>& mean = (*means)[static_cast<size_t>(g)];
    mean.assign(static_cast<size_t>(tokens), 0.0f);
    for (int i = 0; i < r; ++i) {
      const float* row = layer.data() + static_cast<size_t>((g * r + i) * tokens);
      for (int64_t t = 0; t < tokens; ++t) mean[static_cast<size_t>(t)] += row[t] / r;
    }
  }
}

// Per head, the page maxima of its row at `page_size`.
std::vector<std::vector<float>> HeadPageMaxima(std::span<const float> layer, int query_heads,
                                               int64_t tokens, int page_size) {
  std::vector<std::vector<float>> page_maxima;
  for (int h = 0; h < query_heads; ++h) {
    page_maxima.push_back(PageMaxima(
        layer.subspan(static_cast<size_t>(h * tokens), static_cast<size_t>(tokens)), page_size));
  }
  return page_maxima;
}

// The index into page_sizes of the reference page size; the first page size when it is not
// among them.
size_t ReferencePageIndex(const EvalOptions& options) {
  const auto found = static_cast<size_t>(
      std::find(options.page_sizes.begin(), options.page_sizes.end(), options.reference_page_size) -
      options.page_sizes.begin());
  return found < options.page_sizes.size() ? found : 0;
}

// The variants of the scope analysis: each named policy in group scope and in layer scope with
// every combine, then head_independent (whose layer scope is its union over the layer's heads).
absl::StatusOr<std::vector<ScopeVariant>> ScopeVariantsOf(const EvalOptions& options,
                                                          size_t needles) {
  std::vector<ScopeVariant> variants;
  for (const std::string& name : options.scope_policies) {
    ASSIGN_OR_RETURN(const Policy* policy, FindPolicy(name));
    variants.push_back({policy, SelectionScope::kGroup, kDefaultLayerCombine, {}});
    for (const LayerCombine combine :
         {LayerCombine::kMassMax, LayerCombine::kEntropyWeighted, LayerCombine::kMassMean}) {
      variants.push_back({policy, SelectionScope::kLayer, combine, {}});
    }
  }
  if (!variants.empty()) {
    ASSIGN_OR_RETURN(const Policy* independent, FindPolicy("head_independent"));
    variants.push_back({independent, SelectionScope::kGroup, kDefaultLayerCombine, {}});
  }
  for (ScopeVariant& variant : variants) {
    variant.per_budget.resize(options.budgets.size());
    for (auto& sums : variant.per_budget) sums.needle_all_targets.assign(needles, 1);
  }
  return variants;
}

// One layer as everything the evaluation measures sees it.
struct LayerView {
  int index = 0;
  std::span<const float> values;  // the source's statistic [H_Q, T]
  const LayerStatistics* statistics = nullptr;
  const HeadFacts* facts = nullptr;
  const std::vector<std::vector<float>>* group_means = nullptr;
};

// The results matrix, policies x page sizes x budgets, fed one layer at a time.
class ResultsMatrix {
 public:
  ResultsMatrix(const EvalOptions& options, const std::vector<const Policy*>& policies,
                const std::vector<BudgetPlan>& plans, size_t needles)
      : options_(options),
        policies_(policies),
        plans_(plans),
        cells_(policies.size() * options.page_sizes.size() * options.budgets.size()) {
    for (Cell& cell : cells_) {
      cell.needle_all_targets.assign(needles, 1);
      cell.needle_all_layers.assign(needles, 1);
    }
  }

  // Every policy decides the layer at every page size and budget; the head-independent samples
  // of every group go to *uor_samples.
  absl::Status AddLayer(const LayerView& layer, const ModelPreset& model, int64_t tokens,
                        const std::vector<NeedleSpan>& needles,
                        std::vector<UorSample>* uor_samples) {
    const int r = model.group_size();
    for (size_t s = 0; s < options_.page_sizes.size(); ++s) {
      const int page_size = options_.page_sizes[s];
      const int64_t pages = PageCount(tokens, page_size);
      const std::vector<std::vector<float>> page_maxima =
          HeadPageMaxima(layer.values, model.query_heads, tokens, page_size);
      const PolicyOptions policy_options = PolicyOptionsAt(options_, page_size);
      for (size_t b = 0; b < options_.budgets.size(); ++b) {
        const int64_t quota = Quota(s, b, layer.index);
        const int64_t expected = std::min(quota, pages);
        std::vector<UorSample> samples;
        for (int g = 0; g < model.kv_groups; ++g) {
          UorSample sample = AnalyseHeadIndependent(page_maxima, g, r, quota, pages);
          sample.budget = options_.budgets[b];
          sample.page_size = page_size;
          sample.layer = layer.index;
          samples.push_back(sample);
          uor_samples->push_back(sample);
        }
        for (size_t p = 0; p < policies_.size(); ++p) {
          const Policy& policy = *policies_[p];
          ASSIGN_OR_RETURN(
              const LayerDecision decision,
              DecideOneLayer(policy, policy_options, *layer.statistics, model, tokens, quota));
          for (int g = 0; g < model.kv_groups; ++g) {
            const auto group = static_cast<size_t>(g);
            AddGroupDecision(decision.groups[group].kept_pages, expected,
                             (*layer.group_means)[group], page_size, needles,
                             layer.facts->targets[group], policy.exact_budget(), samples[group],
                             CellAt(p, s, b));
          }
        }
      }
    }
    return absl::OkStatus();
  }

  // The rows of results.csv, policies x budgets x page sizes in that nesting.
  void Emit(const LayerSource& source, const std::vector<char>& needle_has_target,
            std::vector<EvalRow>* rows) {
    for (size_t p = 0; p < policies_.size(); ++p) {
      for (size_t b = 0; b < options_.budgets.size(); ++b) {
        for (size_t s = 0; s < options_.page_sizes.size(); ++s) {
          EvalRow row = RowOf(CellAt(p, s, b), source.needles(), needle_has_target, *policies_[p]);
          row.statistic = GivenStatisticName(*policies_[p], source);
          row.budget = options_.budgets[b];
          row.page_size = options_.page_sizes[s];
          rows->push_back(std::move(row));
        }
      }
    }
  }

 private:
  int64_t Quota(size_t s, size_t b, int layer) const {
    return plans_[s * options_.budgets.size() + b].pages_per_layer[static_cast<size_t>(layer)];
  }
  Cell& CellAt(size_t p, size_t s, size_t b) {
    return cells_[(p * options_.budgets.size() + b) * options_.page_sizes.size() + s];
  }

  const EvalOptions& options_;
  const std::vector<const Policy*>& policies_;
  const std::vector<BudgetPlan>& plans_;
  std::vector<Cell> cells_;
};

// The selection-scope analysis at the reference page size, as a LAYER-layout pool keeps it: the
// distinct pages over the groups of a layer.
class ScopeAnalysis {
 public:
  ScopeAnalysis(const EvalOptions& options, std::vector<ScopeVariant> variants,
                const std::vector<BudgetPlan>& plans)
      : options_(options),
        variants_(std::move(variants)),
        plans_(plans),
        size_index_(ReferencePageIndex(options)) {}

  absl::Status AddLayer(const LayerView& layer, const ModelPreset& model, int64_t tokens,
                        const std::vector<NeedleSpan>& needles) {
    if (variants_.empty()) return absl::OkStatus();
    const int page_size = options_.page_sizes[size_index_];
    const int64_t pages = PageCount(tokens, page_size);
    const PolicyOptions policy_options = PolicyOptionsAt(options_, page_size);
    const size_t budgets = options_.budgets.size();
    for (size_t b = 0; b < budgets; ++b) {
      const int64_t quota =
          plans_[size_index_ * budgets + b].pages_per_layer[static_cast<size_t>(layer.index)];
      for (ScopeVariant& variant : variants_) {
        ASSIGN_OR_RETURN(const LayerDecision decision,
                         DecideOneLayer(*variant.policy, policy_options, *layer.statistics, model,
                                        tokens, quota, variant.scope, variant.combine));
        std::vector<std::vector<int32_t>> per_group;
        for (const GroupDecision& group : decision.groups) per_group.push_back(group.kept_pages);
        const std::vector<int32_t> kept = UnionOfPages(per_group);
        ScopeVariant::Sums& sums = variant.per_budget[b];
        sums.planned += std::min(quota, pages);
        sums.kept += static_cast<int64_t>(kept.size());
        for (int g = 0; g < model.kv_groups; ++g) {
          const auto group = static_cast<size_t>(g);
          ++sums.groups;
          sums.mass_sum += RetainedMass((*layer.group_means)[group], page_size, kept);
          for (const int j : layer.facts->targets[group]) {
            const bool needle_kept = NeedleKept(needles[static_cast<size_t>(j)], page_size, kept);
            ++sums.targets;
            sums.targets_kept += needle_kept ? 1 : 0;
            if (!needle_kept) sums.needle_all_targets[static_cast<size_t>(j)] = 0;
          }
        }
      }
    }
    return absl::OkStatus();
  }

  // The rows of scope.csv, variants x budgets in that nesting.
  void Emit(const std::vector<NeedleSpan>& needles, const std::vector<char>& needle_has_target,
            std::vector<ScopeRow>* rows) const {
    for (const ScopeVariant& variant : variants_) {
      for (size_t b = 0; b < options_.budgets.size(); ++b) {
        const ScopeVariant::Sums& sums = variant.per_budget[b];
        ScopeRow row;
        row.policy = std::string(variant.policy->name());
        row.scope = std::string(SelectionScopeName(variant.scope));
        row.combine = variant.scope == SelectionScope::kLayer && variant.policy->exact_budget()
                          ? std::string(LayerCombineName(variant.combine))
                          : "-";
        row.budget = options_.budgets[b];
        row.page_size = options_.page_sizes[size_index_];
        row.planned_frames = sums.planned;
        row.kept_frames = sums.kept;
        row.retained_mass = sums.mass_sum / static_cast<double>(std::max<int64_t>(sums.groups, 1));
        row.needle_target_rate = sums.targets == 0 ? 0.0
                                                   : static_cast<double>(sums.targets_kept) /
                                                         static_cast<double>(sums.targets);
        int64_t with_target = 0;
        int64_t all_targets = 0;
        for (size_t j = 0; j < needles.size(); ++j) {
          if (!needle_has_target[j]) continue;
          ++with_target;
          all_targets += sums.needle_all_targets[j];
        }
        row.needle_all_targets =
            with_target == 0 ? 0.0
                             : static_cast<double>(all_targets) / static_cast<double>(with_target);
        rows->push_back(std::move(row));
      }
    }
  }

 private:
  const EvalOptions& options_;
  std::vector<ScopeVariant> variants_;
  const std::vector<BudgetPlan>& plans_;
  size_t size_index_;
};

}  // namespace

std::string AccumulatedPolicyNames() {
  std::vector<absl::string_view> names;
  for (const absl::string_view name : PolicyNames()) {
    if ((*FindPolicy(name))->statistic() == StatisticKind::kAccumulated) names.push_back(name);
  }
  return absl::StrJoin(names, ", ");
}

absl::Status ValidateEvalOptions(const EvalOptions& options) {
  if (options.model.empty() == options.trace_dir.empty()) {
    return absl::InvalidArgumentError("model: give exactly one of a preset or a trace directory");
  }
  if (options.budgets.empty() || options.page_sizes.empty()) {
    return absl::InvalidArgumentError("budgets: need at least one budget and one page size");
  }
  for (const double budget : options.budgets) {
    if (!(budget > 0.0 && budget <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("budgets: ", budget, " is not a fraction in (0, 1]"));
    }
  }
  for (const int page_size : options.page_sizes) {
    if (page_size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_sizes: ", page_size, " is not positive"));
    }
  }
  for (const std::string& name : options.policies) {
    RETURN_IF_ERROR(FindPolicy(name).status());
  }
  if (options.reference_page_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference_page_size: ", options.reference_page_size, " is not positive"));
  }
  if (!(options.tau > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("tau: must be > 0, got ", options.tau));
  }
  if (!(options.alpha > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("alpha: must be > 0, got ", options.alpha));
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalResults> Evaluate(const EvalOptions& options, const EvalProgressFn& progress) {
  RETURN_IF_ERROR(ValidateEvalOptions(options));
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const std::unique_ptr<LayerSource> source, LayerSource::Open(options));
  const ModelPreset& model = source->model();
  const int64_t tokens = source->tokens();
  const std::vector<NeedleSpan>& needles = source->needles();

  EvalResults results;
  results.model = model;
  results.tokens = tokens;
  results.seed = options.seed;
  results.source = source->source();
  results.needles = needles;

  ASSIGN_OR_RETURN(const std::vector<const Policy*> policies, SelectedPolicies(options));
  if (source->kind() != StatisticKind::kLastRow) {
    results.notes.push_back(absl::StrCat("the trace's statistic is ",
                                         StatisticKindName(source->kind()),
                                         "; the policies score it as given"));
  }
  if (!source->has_accumulated()) {
    results.notes.push_back(absl::StrCat(AccumulatedPolicyNames(),
                                         " scores the trace's own statistic: the trace has no "
                                         "accumulated.npy"));
  }
  const bool load_accumulated = source->has_accumulated() &&
                                std::any_of(policies.begin(), policies.end(), [](const Policy* p) {
                                  return ScoresAccumulated(*p, true);
                                });

  // Plans per (page size, budget), all from the core planner.
  ASSIGN_OR_RETURN(const std::vector<BudgetPlan> plans, PlanEveryCell(options, model, tokens));
  ResultsMatrix matrix(options, policies, plans, needles.size());
  ASSIGN_OR_RETURN(std::vector<ScopeVariant> variants, ScopeVariantsOf(options, needles.size()));
  ScopeAnalysis scope(options, std::move(variants), plans);
  WeightAnalysis weights(options);
  std::vector<char> needle_has_target(needles.size(), 0);

  std::vector<float> values;
  std::vector<float> accumulated;
  std::vector<std::vector<float>> group_means;
  for (int l = 0; l < model.layers; ++l) {
    ASSIGN_OR_RETURN(const LayerStatistics statistics,
                     LoadLayer(*source, l, load_accumulated, &values, &accumulated));
    const HeadFacts facts = MeasureHeads(values, model, tokens, needles, options);
    for (const auto& group_targets : facts.targets) {
      for (const int j : group_targets) needle_has_target[static_cast<size_t>(j)] = 1;
    }
    weights.AddLayer(values, model, tokens, facts);
    GroupMeans(values, model, tokens, &group_means);
    const LayerView layer{l, values, &statistics, &facts, &group_means};
    RETURN_IF_ERROR(matrix.AddLayer(layer, model, tokens, needles, &results.uor_samples));
    RETURN_IF_ERROR(scope.AddLayer(layer, model, tokens, needles));
    if (progress) {
      progress({l + 1, model.layers,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
    }
  }

  matrix.Emit(*source, needle_has_target, &results.rows);
  scope.Emit(needles, needle_has_target, &results.scope_rows);
  weights.Emit(&results.head_rows);
  if (options.closed_form_checks) {
    results.closed_form = ClosedFormChecks(options.tau, options.sink_tokens);
  }
  results.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return results;
}

}  // namespace entrokv::sim
