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

#include "absl/strings/str_cat.h"
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

bool Contains(const std::vector<int32_t>& sorted, int32_t page) {
  return std::binary_search(sorted.begin(), sorted.end(), page);
}

bool NeedleKept(const NeedleSpan& needle, int page_size, const std::vector<int32_t>& kept) {
  for (int64_t page = needle.begin / page_size; page <= (needle.end - 1) / page_size; ++page) {
    if (!Contains(kept, static_cast<int32_t>(page))) return false;
  }
  return true;
}

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
    for (size_t j = 0; j < needles.size(); ++j) {
      double mass = 0.0;
      for (int64_t t = needles[j].begin; t < needles[j].end; ++t) mass += row[t];
      if (mass / total >= options.retrieval_head_mass) {
        if (head_class != kSinkClass) head_class = kRetrievalClass;
        std::vector<int>& group_targets = facts.targets[static_cast<size_t>(h / r)];
        if (std::find(group_targets.begin(), group_targets.end(), static_cast<int>(j)) ==
            group_targets.end()) {
          group_targets.push_back(static_cast<int>(j));
        }
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

}  // namespace

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
  const int r = model.group_size();
  const std::vector<NeedleSpan>& needles = source->needles();

  EvalResults results;
  results.model = model;
  results.tokens = tokens;
  results.seed = options.seed;
  results.source = source->source();
  results.needles = needles;

  std::vector<const Policy*> policies;
  if (options.policies.empty()) {
    for (const absl::string_view name : PolicyNames()) {
      ASSIGN_OR_RETURN(const Policy* policy, FindPolicy(name));
      policies.push_back(policy);
    }
  } else {
    for (const std::string& name : options.policies) {
      ASSIGN_OR_RETURN(const Policy* policy, FindPolicy(name));
      policies.push_back(policy);
    }
  }
  if (source->kind() != StatisticKind::kLastRow) {
    results.notes.push_back(absl::StrCat("the trace's statistic is ",
                                         StatisticKindName(source->kind()),
                                         "; the policies score it as given"));
  }
  const bool use_accumulated = source->has_accumulated();
  if (!use_accumulated) {
    results.notes.push_back(
        "h2o scores the trace's own statistic: the trace has no "
        "accumulated.npy");
  }

  // Plans per (page size, budget), all from the core planner.
  const size_t budget_count = options.budgets.size();
  const size_t size_count = options.page_sizes.size();
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

  std::vector<Cell> cells(policies.size() * size_count * budget_count);
  auto cell_at = [&](size_t p, size_t s, size_t b) -> Cell& {
    return cells[(p * budget_count + b) * size_count + s];
  };
  for (Cell& cell : cells) {
    cell.needle_all_targets.assign(needles.size(), 1);
    cell.needle_all_layers.assign(needles.size(), 1);
  }
  std::vector<char> needle_has_target(needles.size(), 0);
  WeightAnalysis weights(options);

  // The scope analysis: each named policy in group scope and in layer scope with every
  // combine, then head_independent (whose layer scope is its union over the layer's heads).
  std::vector<ScopeVariant> scope_variants;
  for (const std::string& name : options.scope_policies) {
    ASSIGN_OR_RETURN(const Policy* policy, FindPolicy(name));
    scope_variants.push_back({policy, SelectionScope::kGroup, kDefaultLayerCombine, {}});
    for (const LayerCombine combine :
         {LayerCombine::kMassMax, LayerCombine::kEntropyWeighted, LayerCombine::kMassMean}) {
      scope_variants.push_back({policy, SelectionScope::kLayer, combine, {}});
    }
  }
  if (!scope_variants.empty()) {
    ASSIGN_OR_RETURN(const Policy* independent, FindPolicy("head_independent"));
    scope_variants.push_back({independent, SelectionScope::kGroup, kDefaultLayerCombine, {}});
  }
  for (ScopeVariant& variant : scope_variants) {
    variant.per_budget.resize(budget_count);
    for (auto& sums : variant.per_budget) sums.needle_all_targets.assign(needles.size(), 1);
  }
  const auto scope_size =
      static_cast<size_t>(std::find(options.page_sizes.begin(), options.page_sizes.end(), 16) -
                          options.page_sizes.begin());
  const size_t scope_size_index = scope_size < size_count ? scope_size : 0;

  std::vector<float> layer;
  std::vector<float> accumulated;
  std::vector<std::vector<float>> group_mean(static_cast<size_t>(model.kv_groups));
  for (int l = 0; l < model.layers; ++l) {
    source->Load(l, &layer);
    const bool any_h2o = std::any_of(policies.begin(), policies.end(),
                                     [](const Policy* p) { return p->name() == "h2o"; });
    if (any_h2o && use_accumulated) source->LoadAccumulated(l, &accumulated);
    ASSIGN_OR_RETURN(const StatisticView view, StatisticView::Create(layer.data(), DType::kFloat32,
                                                                     model.query_heads, tokens));
    RETURN_IF_ERROR(view.ValidateValues());
    std::optional<StatisticView> accumulated_view;
    if (any_h2o && use_accumulated) {
      ASSIGN_OR_RETURN(accumulated_view, StatisticView::Create(accumulated.data(), DType::kFloat32,
                                                               model.query_heads, tokens));
    }
    const HeadFacts facts = MeasureHeads(layer, model, tokens, needles, options);
    for (const auto& group_targets : facts.targets) {
      for (const int j : group_targets) needle_has_target[static_cast<size_t>(j)] = 1;
    }
    weights.AddLayer(layer, model, tokens, facts);
    // Retained mass is always measured on the LAST_ROW group mean, whatever a policy scored.
    for (int g = 0; g < model.kv_groups; ++g) {
      std::vector<float>& mean = group_mean[static_cast<size_t>(g)];
      mean.assign(static_cast<size_t>(tokens), 0.0f);
      for (int i = 0; i < r; ++i) {
        const float* row = layer.data() + static_cast<size_t>((g * r + i) * tokens);
        for (int64_t t = 0; t < tokens; ++t) mean[static_cast<size_t>(t)] += row[t] / r;
      }
    }

    for (size_t s = 0; s < size_count; ++s) {
      const int page_size = options.page_sizes[s];
      const int64_t pages = PageCount(tokens, page_size);
      std::vector<std::vector<float>> page_maxima;
      for (int h = 0; h < model.query_heads; ++h) {
        page_maxima.push_back(
            PageMaxima(std::span<const float>(layer).subspan(static_cast<size_t>(h * tokens),
                                                             static_cast<size_t>(tokens)),
                       page_size));
      }
      PolicyOptions policy_options;
      policy_options.page_size = page_size;
      policy_options.sink_tokens = options.sink_tokens;
      policy_options.tau = options.tau;
      policy_options.alpha = options.alpha;
      for (size_t b = 0; b < budget_count; ++b) {
        const int64_t quota = plans[s * budget_count + b].pages_per_layer[static_cast<size_t>(l)];
        const int64_t expected = std::min(quota, pages);
        std::vector<UorSample> samples;
        for (int g = 0; g < model.kv_groups; ++g) {
          UorSample sample = AnalyseHeadIndependent(page_maxima, g, r, quota, pages);
          sample.budget = options.budgets[b];
          sample.page_size = page_size;
          sample.layer = l;
          samples.push_back(sample);
          results.uor_samples.push_back(sample);
        }
        for (size_t p = 0; p < policies.size(); ++p) {
          const Policy& policy = *policies[p];
          const bool h2o = policy.name() == "h2o" && accumulated_view.has_value();
          LayerRequest request;
          if (policy.needs_statistic()) request.statistic = h2o ? *accumulated_view : view;
          request.query_heads = model.query_heads;
          request.kv_groups = model.kv_groups;
          request.tokens = tokens;
          request.quota_pages = quota;
          request.measure = false;
          ASSIGN_OR_RETURN(const LayerDecision decision,
                           DecideLayer(policy, policy_options, request));
          Cell& cell = cell_at(p, s, b);
          std::vector<char> layer_kept(needles.size(), 1);
          for (int g = 0; g < model.kv_groups; ++g) {
            const std::vector<int32_t>& kept = decision.groups[static_cast<size_t>(g)].kept_pages;
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
            cell.mass_sum += RetainedMass(group_mean[static_cast<size_t>(g)], page_size, kept);
            for (size_t j = 0; j < needles.size(); ++j) {
              const bool needle_kept = NeedleKept(needles[j], page_size, kept);
              if (!needle_kept) cell.needle_all_layers[j] = 0;
              const auto& group_targets = facts.targets[static_cast<size_t>(g)];
              if (std::find(group_targets.begin(), group_targets.end(), static_cast<int>(j)) !=
                  group_targets.end()) {
                ++cell.targets;
                cell.targets_kept += needle_kept ? 1 : 0;
                if (!needle_kept) cell.needle_all_targets[j] = 0;
              }
            }
            if (!policy.exact_budget()) {
              const UorSample& sample = samples[static_cast<size_t>(g)];
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
        }
      }
    }
    // Selection scope, as a LAYER-layout pool keeps it: the distinct pages over the groups.
    if (!scope_variants.empty()) {
      const int page_size = options.page_sizes[scope_size_index];
      const int64_t pages = PageCount(tokens, page_size);
      PolicyOptions policy_options;
      policy_options.page_size = page_size;
      policy_options.sink_tokens = options.sink_tokens;
      policy_options.tau = options.tau;
      policy_options.alpha = options.alpha;
      for (size_t b = 0; b < budget_count; ++b) {
        const int64_t quota =
            plans[scope_size_index * budget_count + b].pages_per_layer[static_cast<size_t>(l)];
        for (ScopeVariant& variant : scope_variants) {
          const Policy& policy = *variant.policy;
          const bool h2o = policy.name() == "h2o" && accumulated_view.has_value();
          LayerRequest request;
          if (policy.needs_statistic()) request.statistic = h2o ? *accumulated_view : view;
          request.query_heads = model.query_heads;
          request.kv_groups = model.kv_groups;
          request.tokens = tokens;
          request.quota_pages = quota;
          request.measure = false;
          request.scope = variant.scope;
          request.combine = variant.combine;
          ASSIGN_OR_RETURN(const LayerDecision decision,
                           DecideLayer(policy, policy_options, request));
          std::vector<std::vector<int32_t>> per_group;
          for (const GroupDecision& group : decision.groups) per_group.push_back(group.kept_pages);
          const std::vector<int32_t> kept = UnionOfPages(per_group);
          ScopeVariant::Sums& sums = variant.per_budget[b];
          sums.planned += std::min(quota, pages);
          sums.kept += static_cast<int64_t>(kept.size());
          for (int g = 0; g < model.kv_groups; ++g) {
            ++sums.groups;
            sums.mass_sum += RetainedMass(group_mean[static_cast<size_t>(g)], page_size, kept);
            for (const int j : facts.targets[static_cast<size_t>(g)]) {
              const bool needle_kept = NeedleKept(needles[static_cast<size_t>(j)], page_size, kept);
              ++sums.targets;
              sums.targets_kept += needle_kept ? 1 : 0;
              if (!needle_kept) sums.needle_all_targets[static_cast<size_t>(j)] = 0;
            }
          }
        }
      }
    }
    if (progress) {
      progress({l + 1, model.layers,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
    }
  }

  const StatisticKind h2o_kind = use_accumulated ? StatisticKind::kAccumulated : source->kind();
  for (size_t p = 0; p < policies.size(); ++p) {
    for (size_t b = 0; b < budget_count; ++b) {
      for (size_t s = 0; s < size_count; ++s) {
        const Cell& cell = cell_at(p, s, b);
        EvalRow row;
        row.policy = std::string(policies[p]->name());
        row.statistic = std::string(
            StatisticKindName(policies[p]->name() == "h2o" ? h2o_kind : source->kind()));
        if (!policies[p]->needs_statistic()) row.statistic = "none";
        row.budget = options.budgets[b];
        row.page_size = options.page_sizes[s];
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
            with_target == 0 ? 0.0
                             : static_cast<double>(all_targets) / static_cast<double>(with_target);
        row.needle_all_layers =
            needles.empty() ? 0.0
                            : static_cast<double>(all_layers) / static_cast<double>(needles.size());
        if (!policies[p]->exact_budget()) {
          row.jaccard_mean = cell.jaccard_sum / n;
          row.bonferroni_mean = cell.bonferroni_sum / n;
          row.sandwich_lower_mean = cell.lower_sum / n;
          row.sandwich_upper_mean = cell.upper_sum / n;
          row.bound_violations = cell.violations;
        }
        results.rows.push_back(std::move(row));
      }
    }
  }
  for (const ScopeVariant& variant : scope_variants) {
    for (size_t b = 0; b < budget_count; ++b) {
      const ScopeVariant::Sums& sums = variant.per_budget[b];
      ScopeRow row;
      row.policy = std::string(variant.policy->name());
      row.scope = std::string(SelectionScopeName(variant.scope));
      row.combine = variant.scope == SelectionScope::kLayer && variant.policy->exact_budget()
                        ? std::string(LayerCombineName(variant.combine))
                        : "-";
      row.budget = options.budgets[b];
      row.page_size = options.page_sizes[scope_size_index];
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
      results.scope_rows.push_back(std::move(row));
    }
  }
  weights.Emit(&results.head_rows);
  if (options.closed_form_checks) {
    results.closed_form = ClosedFormChecks(options.tau, options.sink_tokens);
  }
  results.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return results;
}

}  // namespace entrokv::sim
