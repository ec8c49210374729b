// entrokv select: the eviction core on a .npy statistic, offline (no daemon).
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/args.h"
#include "client/cli/command.h"
#include "core/io/npy.h"
#include "core/scoring/budget.h"
#include "core/scoring/cover_mix.h"
#include "core/scoring/decision.h"
#include "core/scoring/group_quotas.h"
#include "core/scoring/key_scores.h"
#include "core/scoring/layer_quotas.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/policy.h"
#include "core/scoring/statistic.h"
#include "core/util/dtype.h"
#include "core/util/json.h"
#include "core/util/status_macros.h"

namespace entrokv::cli {
namespace {

// The options of --keys-mix-rule cover alone.
constexpr std::array<const char*, 5> kCoverOptions = {"cover-mass", "cover-question-kernel",
                                                      "cover-keys-kernel", "cover-question-forward",
                                                      "cover-rank-sinks"};

struct LoadedStatistic {
  NpyArray array;
  DType dtype;
  int layers;
  int query_heads;
  int64_t tokens;
  int kv_groups = 0;  // a keys file's G; 0: --kv-heads says
};

absl::StatusOr<LoadedStatistic> LoadStatistic(const std::string& path,
                                              const std::string& dtype_flag) {
  ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  LoadedStatistic loaded{};
  if (array.type == NpyType::kUInt16) {
    if (dtype_flag != "bf16") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": uint16 data is read as bfloat16 only with --dtype bf16"));
    }
    loaded.dtype = DType::kBFloat16;
  } else {
    if (dtype_flag == "bf16") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": --dtype bf16 needs bfloat16 stored as uint16 ('<u2')"));
    }
    loaded.dtype = array.type == NpyType::kFloat32 ? DType::kFloat32 : DType::kFloat16;
  }
  if (array.shape.size() == 2) {
    loaded.layers = 1;
    loaded.query_heads = static_cast<int>(array.shape[0]);
    loaded.tokens = array.shape[1];
  } else if (array.shape.size() == 3) {
    loaded.layers = static_cast<int>(array.shape[0]);
    loaded.query_heads = static_cast<int>(array.shape[1]);
    loaded.tokens = array.shape[2];
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": shape has ", array.shape.size(), " dimensions; expected [H_Q, T] or [L, H_Q, T]"));
  }
  if (loaded.layers <= 0 || loaded.query_heads <= 0 || loaded.tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": every dimension must be positive"));
  }
  loaded.array = std::move(array);
  return loaded;
}

// Widens row `row` (T x D elements) of a keys array to float.
void KeysRow(const NpyArray& array, DType dtype, int64_t row, int64_t tokens, int head_dim,
             std::vector<float>& keys) {
  WidenToFloat(array.bytes.data() + row * tokens * head_dim * DTypeBytes(dtype), dtype,
               tokens * head_dim, keys.data());
}

// --query-mean / --query-covariance: float32 [H_Q, D...] or [L, H_Q, D...] with `trailing`
// dimensions of D each, as [L][H_Q][D^trailing] values; `layers` L of the keys. With `rank`
// (--query-covariance-factor, [H_Q, p, D]): the first trailing dimension is any p in [1, D],
// returned there.
absl::StatusOr<std::vector<float>> LoadQueryStatistic(const std::string& flag,
                                                      const std::string& path, int trailing,
                                                      int64_t layers, int head_dim,
                                                      int* query_heads, int* rank = nullptr) {
  ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  if (array.type != NpyType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " must be float32"));
  }
  const size_t dims = static_cast<size_t>(trailing) + 1;
  if (array.shape.size() == dims) array.shape.insert(array.shape.begin(), layers);
  bool fits = array.shape.size() == dims + 1 && array.shape[0] == layers && array.shape[1] > 0;
  for (size_t d = 2; fits && d < array.shape.size(); ++d) {
    fits = array.shape[d] == head_dim ||
           (rank != nullptr && d == 2 && array.shape[d] >= 1 && array.shape[d] <= head_dim);
  }
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " must be ",
                                                   rank != nullptr ? "[H_Q, p, D] (p in [1, D])"
                                                   : trailing == 1 ? "[H_Q, D]"
                                                                   : "[H_Q, D, D]",
                                                   " or with the keys' ", layers,
                                                   " layers first, D = ", head_dim));
  }
  *query_heads = static_cast<int>(array.shape[1]);
  if (rank != nullptr) *rank = static_cast<int>(array.shape[2]);
  std::vector<float> values(array.bytes.size() / sizeof(float));
  std::memcpy(values.data(), array.bytes.data(), array.bytes.size());
  for (const float value : values) {
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds ", value));
    }
  }
  return values;
}

// --keys: a [G, T, D] or [L, G, T, D] file of keys (float32 or float16) scored as the daemon
// scores a keys statistic (core/scoring/key_scores.h). keydiff and norm: one row per KV group,
// [L, G, T] float32, with one query head per group (a group's heads carry the same scores in the
// daemon). expected_attention: one row per query head of --query-mean (and --query-covariance),
// [L, H_Q, T], the heads of group g being rows [g r, (g + 1) r).
absl::StatusOr<LoadedStatistic> LoadKeys(const ArgParser& args) {
  const std::string path = args.Get("keys");
  const bool expected = args.Get("key-score") == "expected_attention";
  std::optional<KeyScore> score;
  if (!expected) {
    ASSIGN_OR_RETURN(score, ParseKeyScore(args.Get("key-score")));
    for (const char* flag : {"query-mean", "query-covariance", "query-covariance-factor"}) {
      if (args.Given(flag)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag, ": only with --key-score expected_attention"));
      }
    }
  } else if (!args.Given("query-mean")) {
    return absl::InvalidArgumentError(
        "--query-mean: --key-score expected_attention needs the queries' mean [H_Q, D]");
  }
  ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  if (array.type == NpyType::kUInt16) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": keys must be float32 or float16"));
  }
  if (array.shape.size() == 3) array.shape.insert(array.shape.begin(), 1);
  if (array.shape.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": shape has ", array.shape.size(),
                     " dimensions; expected [G, T, D] or [L, G, T, D]"));
  }
  for (const int64_t size : array.shape) {
    if (size <= 0) return absl::InvalidArgumentError(absl::StrCat(path, ": empty dimension"));
  }
  const int64_t layers = array.shape[0];
  const int64_t groups = array.shape[1];
  const int64_t tokens = array.shape[2];
  const auto head_dim = static_cast<int>(array.shape[3]);
  const DType dtype = array.type == NpyType::kFloat32 ? DType::kFloat32 : DType::kFloat16;
  std::vector<float> keys(static_cast<size_t>(tokens * head_dim));
  const std::vector<uint8_t> present(static_cast<size_t>(tokens), 1);
  int heads = static_cast<int>(groups);
  std::vector<float> mean;
  std::vector<float> covariance;  // or a factor of factor_rank rows per head
  int factor_rank = 0;
  if (expected) {
    ASSIGN_OR_RETURN(mean, LoadQueryStatistic("--query-mean", args.Get("query-mean"), 1, layers,
                                              head_dim, &heads));
    if (heads % groups != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--query-mean: ", heads, " query heads are not a multiple of the keys' ",
                       groups, " KV groups"));
    }
    if (args.Given("query-covariance")) {
      int covariance_heads = 0;
      ASSIGN_OR_RETURN(covariance,
                       LoadQueryStatistic("--query-covariance", args.Get("query-covariance"), 2,
                                          layers, head_dim, &covariance_heads));
      if (covariance_heads != heads) {
        return absl::InvalidArgumentError(
            absl::StrCat("--query-covariance: ", covariance_heads, " heads, the mean has ", heads));
      }
    }
    if (args.Given("query-covariance-factor")) {
      if (args.Given("query-covariance")) {
        return absl::InvalidArgumentError(
            "--query-covariance-factor: not with --query-covariance (give one of the two)");
      }
      int factor_heads = 0;
      ASSIGN_OR_RETURN(
          covariance,
          LoadQueryStatistic("--query-covariance-factor", args.Get("query-covariance-factor"), 2,
                             layers, head_dim, &factor_heads, &factor_rank));
      if (factor_heads != heads) {
        return absl::InvalidArgumentError(absl::StrCat("--query-covariance-factor: ", factor_heads,
                                                       " heads, the mean has ", heads));
      }
    }
  }
  NpyArray scores{.type = NpyType::kFloat32, .shape = {layers, heads, tokens}, .bytes = {}};
  scores.bytes.resize(static_cast<size_t>(layers * heads * tokens) * sizeof(float));
  auto* out = reinterpret_cast<float*>(scores.bytes.data());
  const int per_group = heads / static_cast<int>(groups);
  const auto d = static_cast<size_t>(head_dim);
  for (int64_t row = 0; row < layers * groups; ++row) {
    KeysRow(array, dtype, row, tokens, head_dim, keys);
    if (score.has_value()) {
      ScoreKeys(*score, keys, head_dim, present,
                std::span<float>(out + row * tokens, static_cast<size_t>(tokens)));
      continue;
    }
    for (int i = 0; i < per_group; ++i) {
      const auto head = static_cast<size_t>(row * per_group + i);  // layer-major, then head
      const size_t matrix = (factor_rank > 0 ? static_cast<size_t>(factor_rank) : d) * d;
      ScoreExpectedAttention(
          keys, head_dim, present, std::span<const float>(mean).subspan(head * d, d),
          covariance.empty() ? std::span<const float>()
                             : std::span<const float>(covariance).subspan(head * matrix, matrix),
          std::span<float>(out + static_cast<int64_t>(head) * tokens, static_cast<size_t>(tokens)),
          factor_rank);
    }
  }
  return LoadedStatistic{.array = std::move(scores),
                         .dtype = DType::kFloat32,
                         .layers = static_cast<int>(layers),
                         .query_heads = heads,
                         .tokens = tokens,
                         .kv_groups = static_cast<int>(groups)};
}

// {"layers":[{"layer":0,"groups":[{"group":0,"kept_pages":[...],"weights":[...],
// "entropies":[...],"uor":1.75}]}]} on one line (README); "uor" is null where nothing was
// measured (--allocator mass: the scorer kept every page).
void PrintJson(const std::vector<LayerDecision>& layers) {
  Json out_layers = Json::array();
  for (size_t l = 0; l < layers.size(); ++l) {
    Json groups = Json::array();
    for (size_t g = 0; g < layers[l].groups.size(); ++g) {
      const GroupDecision& group = layers[l].groups[g];
      groups.push_back(
          {{"group", g},
           {"kept_pages", group.kept_pages},
           {"weights", group.weights},
           {"entropies", group.entropies},
           {"uor", group.shadow_uor.has_value() ? Json(*group.shadow_uor) : Json(nullptr)}});
    }
    out_layers.push_back({{"layer", l},
                          {"groups", std::move(groups)},
                          {"scope", std::string(SelectionScopeName(layers[l].scope))},
                          {"union_pages", layers[l].union_pages},
                          {"group_scope_union_pages", layers[l].group_scope_union_pages}});
  }
  std::printf("%s\n", DumpJson(Json{{"layers", std::move(out_layers)}}).c_str());
}

void PrintTable(const std::vector<LayerDecision>& layers, absl::string_view policy) {
  long long kept = 0;   // NOLINT(runtime/int): printf's %lld
  long long pages = 0;  // NOLINT(runtime/int)
  for (const LayerDecision& layer : layers) {
    for (const GroupDecision& group : layer.groups) {
      kept += static_cast<long long>(group.kept_pages.size());  // NOLINT(runtime/int)
      pages += layer.page_count;
    }
  }
  std::printf("policy %s, %s scope, %lld of %lld pages kept over every layer and group\n",
              std::string(policy).c_str(),
              std::string(SelectionScopeName(layers.front().scope)).c_str(), kept, pages);
  std::printf("%5s %5s %5s %8s %9s  %s\n", "layer", "group", "kept", "uor", "retained", "weights");
  for (size_t l = 0; l < layers.size(); ++l) {
    for (size_t g = 0; g < layers[l].groups.size(); ++g) {
      const GroupDecision& group = layers[l].groups[g];
      std::vector<std::string> weights;
      for (const double w : group.weights) weights.push_back(absl::StrFormat("%.3f", w));
      // "-": not measured (--allocator mass).
      const auto measured = [](std::optional<double> value) {
        return value.has_value() ? absl::StrFormat("%.3f", *value) : std::string("-");
      };
      std::printf("%5zu %5zu %5zu %8s %9s  %s\n", l, g, group.kept_pages.size(),
                  measured(group.shadow_uor).c_str(), measured(group.retained_mass).c_str(),
                  absl::StrJoin(weights, " ").c_str());
    }
  }
}

// --stats with --keys: each head's row of the statistic and of the keys' scores (`keys`, float32
// rows as LoadKeys makes them), each scaled to its share (--keys-weight on the keys') and
// combined by --keys-mix-rule (MixRows, as the daemon mixes a keys mix), or ordered by page
// with the cover rule (CoverThenFill under `policy` and `options`, as the daemon orders them).
// Returns the keys' rows, mixed.
absl::StatusOr<LoadedStatistic> MixStatistic(const ArgParser& args, const LoadedStatistic& stats,
                                             LoadedStatistic keys, const Policy& policy,
                                             const PolicyOptions& options) {
  if (args.Get("key-score") != "expected_attention" && stats.query_heads != keys.query_heads &&
      stats.query_heads % keys.kv_groups == 0) {
    // keydiff and norm score one row per KV group: each of the group's heads gets it, as the
    // daemon gives a group's scores to its heads.
    const int per_group = stats.query_heads / keys.kv_groups;
    const auto tokens = static_cast<size_t>(keys.tokens);
    const auto* groups = reinterpret_cast<const float*>(keys.array.bytes.data());
    std::vector<uint8_t> heads(static_cast<size_t>(keys.layers) *
                               static_cast<size_t>(stats.query_heads) * tokens * sizeof(float));
    auto* out = reinterpret_cast<float*>(heads.data());
    for (int row = 0; row < keys.layers * keys.kv_groups; ++row) {
      for (int i = 0; i < per_group; ++i) {
        std::copy_n(groups + static_cast<size_t>(row) * tokens, tokens,
                    out + (static_cast<size_t>(row) * per_group + i) * tokens);
      }
    }
    keys.array.bytes = std::move(heads);
    keys.query_heads = stats.query_heads;
  }
  if (stats.layers != keys.layers || stats.query_heads != keys.query_heads ||
      stats.tokens != keys.tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--keys: scores ", keys.layers, " layers x ",
                                                   keys.query_heads, " query heads x ", keys.tokens,
                                                   " tokens, --stats has ", stats.layers, " x ",
                                                   stats.query_heads, " x ", stats.tokens));
  }
  const std::string rule_name = args.Get("keys-mix-rule");
  if (rule_name != "average" && rule_name != "max" && rule_name != "cover") {
    return absl::InvalidArgumentError(
        absl::StrCat("--keys-mix-rule: must be average, max or cover, got \"", rule_name, "\""));
  }
  const bool cover = rule_name == "cover";
  for (const char* option : kCoverOptions) {
    if (args.Given(option) && !cover) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", option, ": only with --keys-mix-rule cover"));
    }
  }
  if (cover && args.Given("keys-weight")) {
    return absl::InvalidArgumentError(
        "--keys-weight: not with --keys-mix-rule cover (it orders pages, it adds no scores)");
  }
  CoverMix cover_mix;
  if (cover) {
    ASSIGN_OR_RETURN(cover_mix.mass, args.GetDouble("cover-mass"));
    ASSIGN_OR_RETURN(const int64_t question_kernel, args.GetInt("cover-question-kernel"));
    ASSIGN_OR_RETURN(const int64_t keys_kernel, args.GetInt("cover-keys-kernel"));
    RETURN_IF_ERROR(ValidateNeighbourhoodKernel("--cover-question-kernel", question_kernel));
    RETURN_IF_ERROR(ValidateNeighbourhoodKernel("--cover-keys-kernel", keys_kernel));
    cover_mix.question_kernel = static_cast<int>(question_kernel);
    cover_mix.keys_kernel = static_cast<int>(keys_kernel);
    cover_mix.question_forward = args.GetFlag("cover-question-forward");
    cover_mix.rank_sinks = args.GetFlag("cover-rank-sinks");
    RETURN_IF_ERROR(ValidateCoverMix("--cover-", cover_mix));
    RETURN_IF_ERROR(ValidateCoverPolicy("--keys-mix-rule", policy, options));
  }
  ASSIGN_OR_RETURN(const double weight, args.GetDouble("keys-weight"));
  if (!(weight > 0.0 && weight < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keys-weight: must be in (0, 1), got ", weight));
  }
  const MixRule rule = rule_name == "max" ? MixRule::kMax : MixRule::kAverage;
  const int64_t layer_elements = stats.query_heads * stats.tokens;
  auto* rows = reinterpret_cast<float*>(keys.array.bytes.data());
  for (int layer = 0; layer < stats.layers; ++layer) {
    ASSIGN_OR_RETURN(StatisticView view,
                     StatisticView::Create(stats.array.bytes.data() +
                                               layer * layer_elements * DTypeBytes(stats.dtype),
                                           stats.dtype, stats.query_heads, stats.tokens));
    const std::span<float> mixed(rows + layer * layer_elements,
                                 static_cast<size_t>(layer_elements));
    const absl::Status status =
        cover ? CoverThenFill(view, cover_mix, stats.query_heads / keys.kv_groups,
                              options.page_size, CoverSpanOf(options, stats.tokens), mixed)
              : MixRows(view, weight, rule, mixed);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("--stats: layer ", layer, ": ", status.message()));
    }
  }
  return keys;
}

absl::StatusOr<std::vector<LayerDecision>> Run(const ArgParser& args) {
  if (!args.Given("stats") && !args.Given("keys")) {
    return absl::InvalidArgumentError("give --stats, --keys, or both (a keys mix)");
  }
  std::vector<const char*> mix_options = {"keys-weight", "keys-mix-rule"};
  mix_options.insert(mix_options.end(), kCoverOptions.begin(), kCoverOptions.end());
  for (const char* mix_option : mix_options) {
    if (args.Given(mix_option) && !(args.Given("stats") && args.Given("keys"))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", mix_option, ": only with both --stats and --keys"));
    }
  }
  if (!args.Given("kv-heads") && !args.Given("keys")) {
    return absl::InvalidArgumentError("--kv-heads is required");
  }
  if (args.Given("pages") == args.Given("budget")) {
    return absl::InvalidArgumentError("give exactly one of --pages and --budget");
  }
  if (args.Given("allocator") && !args.Given("budget")) {
    return absl::InvalidArgumentError(
        "--allocator: only with --budget (it spreads it over the "
        "layers)");
  }
  if (args.Given("layer-floor") && args.Get("allocator") != "mass") {
    return absl::InvalidArgumentError("--layer-floor: only with --allocator mass");
  }
  const std::string format = args.Get("format");
  if (format != "json" && format != "table") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format: '", format, "' is not one of json, table"));
  }
  ASSIGN_OR_RETURN(const Policy* policy, FindPolicy(args.Get("policy")));
  int64_t kv_groups = 0;
  if (args.Given("kv-heads")) {
    ASSIGN_OR_RETURN(kv_groups, args.GetInt("kv-heads"));
  }
  ASSIGN_OR_RETURN(const int64_t page_size, args.GetInt("page-size"));
  ASSIGN_OR_RETURN(const int64_t sink_tokens, args.GetInt("sink-tokens"));
  PolicyOptions options;
  options.page_size = static_cast<int>(page_size);
  options.sink_tokens = static_cast<int>(sink_tokens);
  ASSIGN_OR_RETURN(options.tau, args.GetDouble("tau"));
  ASSIGN_OR_RETURN(options.alpha, args.GetDouble("alpha"));
  options.protections.tail_page = args.GetFlag("protect-tail");
  RETURN_IF_ERROR(ParseNeighbourhood(args, &options));
  RETURN_IF_ERROR(ValidatePolicyOptions(options));
  ASSIGN_OR_RETURN(const SelectionScope scope, ParseSelectionScope("--scope", args.Get("scope")));
  ASSIGN_OR_RETURN(const LayerCombine combine, ParseLayerCombine("--combine", args.Get("combine")));
  ASSIGN_OR_RETURN(options.group_floor, args.GetDouble("group-floor"));
  RETURN_IF_ERROR(ValidateGroupFloor("--group-floor", options.group_floor));
  RETURN_IF_ERROR(ValidateGroupQuotas("--group-floor", *policy, options, scope));
  ASSIGN_OR_RETURN(
      LoadedStatistic loaded,
      args.Given("keys") ? LoadKeys(args) : LoadStatistic(args.Get("stats"), args.Get("dtype")));
  if (args.Given("keys") && args.Given("stats")) {
    ASSIGN_OR_RETURN(const LoadedStatistic stats,
                     LoadStatistic(args.Get("stats"), args.Get("dtype")));
    ASSIGN_OR_RETURN(loaded, MixStatistic(args, stats, std::move(loaded), *policy, options));
  }
  if (args.Given("keys")) {
    if (args.Given("kv-heads") && kv_groups != loaded.kv_groups) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-heads: ", kv_groups, ", but the keys file has ", loaded.kv_groups, " KV groups"));
    }
    kv_groups = loaded.kv_groups;
  }
  if (kv_groups <= 0 || loaded.query_heads % kv_groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-heads: ", kv_groups,
                                                   " does not divide the ", loaded.query_heads,
                                                   " query heads of the statistic"));
  }

  std::vector<int64_t> quotas;
  std::optional<double> layer_floor;  // --allocator mass: the layers' quotas move after scoring
  int64_t layer_pages = 0;
  if (args.Given("pages")) {
    ASSIGN_OR_RETURN(const int64_t pages, args.GetInt("pages"));
    if (pages < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pages: must be at least 1 per (layer, group), got ", pages));
    }
    quotas.assign(static_cast<size_t>(loaded.layers), pages);
  } else {
    ASSIGN_OR_RETURN(const double fraction, args.GetDouble("budget"));
    BudgetRequest budget = FractionBudget(loaded.layers, static_cast<int>(kv_groups),
                                          options.page_size, loaded.tokens, fraction);
    absl::StatusOr<LayerAllocator> allocator = ParseLayerAllocator(args.Get("allocator"));
    if (!allocator.ok()) {  // "allocator: 'x' is not one of ...", named as the flag
      return absl::InvalidArgumentError(absl::StrCat("--", allocator.status().message()));
    }
    budget.allocator = *allocator;
    ASSIGN_OR_RETURN(BudgetPlan plan, PlanBudget(budget));
    quotas = plan.pages_per_layer;
    layer_pages = plan.layer_pages;
    if (*allocator == LayerAllocator::kMass) {
      layer_floor = kDefaultLayerFloor;
      if (args.Given("layer-floor")) {
        ASSIGN_OR_RETURN(layer_floor, args.GetDouble("layer-floor"));
        RETURN_IF_ERROR(ValidateLayerFloor("--layer-floor", *layer_floor));
      }
      if (!policy->ranks_pages()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--allocator: mass moves pages by the layers' page scores, and policy ",
                         policy->name(), " ranks none"));
      }
    }
  }

  const int64_t layer_elements = loaded.query_heads * loaded.tokens;
  const int element_bytes = DTypeBytes(loaded.dtype);
  std::vector<LayerDecision> decisions;
  std::vector<LayerRequest> requests;
  for (int layer = 0; layer < loaded.layers; ++layer) {
    ASSIGN_OR_RETURN(
        StatisticView view,
        StatisticView::Create(loaded.array.bytes.data() + layer * layer_elements * element_bytes,
                              loaded.dtype, loaded.query_heads, loaded.tokens));
    LayerRequest request = LayerRequestFor(view, loaded.query_heads, static_cast<int>(kv_groups),
                                           loaded.tokens, quotas[static_cast<size_t>(layer)]);
    request.scope = scope;
    request.combine = combine;
    // --allocator mass: every page scored and kept; the quota is chosen below.
    if (layer_floor.has_value()) RankEveryPage(options.page_size, &request);
    auto decision = DecideLayer(*policy, options, request);
    if (!decision.ok()) {
      return absl::Status(decision.status().code(),
                          absl::StrCat("layer ", layer, ": ", decision.status().message()));
    }
    decisions.push_back(*std::move(decision));
    requests.push_back(request);
  }
  if (layer_floor.has_value()) {
    MoveLayerQuotas(options, requests, std::span<LayerDecision>(decisions), layer_pages,
                    *layer_floor);
  }
  return decisions;
}

}  // namespace

int RunSelect(const std::vector<std::string>& argv) {
  ArgParser args("select",
                 "(--stats FILE.npy | --keys FILE.npy | both) --kv-heads G --page-size B "
                 "(--pages K | --budget F) [options]");
  args.Option("stats", "", "statistic [H_Q, T] or [L, H_Q, T]: float32, float16, bf16 as uint16");
  args.Option("keys", "",
              "keys [G, T, D] or [L, G, T, D] (float32 or float16), scored "
              "as the daemon scores a keys statistic, one row per KV group");
  args.Option("key-score", "keydiff", "with --keys: keydiff, norm or expected_attention");
  args.Option("keys-weight", "0.5",
              "--stats with --keys (a keys mix): each head's rows scaled to sum to their shares, "
              "this one on the keys' scores, in (0, 1)");
  args.Option("keys-mix-rule", "average",
              "--stats with --keys: how each token's two scaled scores combine, average (their "
              "sum) or max (the larger: a union); or cover: per KV group, the pages --stats "
              "ranks highest until they hold --cover-mass of its mass (past the sink pages, "
              "before the protected tail), then the others as the keys rank them");
  args.Option("cover-mass", "0.5", "--keys-mix-rule cover: the share, in (0, 1]");
  args.Option("cover-question-kernel", "7",
              "--keys-mix-rule cover: the max-pool width of --stats' page ranking (odd)");
  args.Option("cover-keys-kernel", "3",
              "--keys-mix-rule cover: the max-pool width of the keys' page ranking (odd; "
              "each head pooled before the group's mean)");
  args.Flag("cover-question-forward", false,
            "--keys-mix-rule cover: pool --stats forward, each token over itself and the "
            "--cover-question-kernel - 1 before it (what follows a key ranks with it)");
  args.Flag("cover-rank-sinks", false,
            "--keys-mix-rule cover: rank the sink pages among --stats' pages too, the sink "
            "tokens' mass left out of the share");
  args.Option("query-mean", "",
              "expected_attention: the queries' mean, float32 [H_Q, D] or [L, H_Q, D]");
  args.Option("query-covariance", "",
              "expected_attention: their covariance, float32 [H_Q, D, D] or [L, H_Q, D, D]");
  args.Option("query-covariance-factor", "",
              "expected_attention, instead of --query-covariance: a factor F of it (S = F'F), "
              "float32 [H_Q, p, D] or [L, H_Q, p, D], p in [1, D]: p x D per token, not D^2");
  args.Option("dtype", "", "set to bf16 to read uint16 data as bfloat16");
  args.Option("kv-heads", "", "KV heads (groups) G; must divide H_Q (with --keys: the file's)");
  args.Option("page-size", "16", "tokens per page B");
  args.Option("pages", "", "pages kept per (layer, group)");
  args.Option("budget", "", "fraction of the sequence to keep, planned per layer (Hamilton)");
  args.Option("allocator", "uniform",
              "with --budget: how it is spread over the layers, uniform, pyramid or mass");
  args.Option("layer-floor", "",
              "with --allocator mass: each layer's least share of the mean, in [0, 1] (0.5)");
  args.Option("policy", "page_entrokv", "one of " + absl::StrJoin(PolicyNames(), ", "));
  args.Option("scope", "group",
              "selection scope: group (one page set per layer and group) or layer (one per "
              "layer, for a frame that holds every KV head)");
  args.Option("combine", std::string(LayerCombineName(kDefaultLayerCombine)),
              "layer scope: how the groups' page scores combine (mass_max, entropy_weighted, "
              "mass_mean)");
  args.Option("group-floor", "1",
              "group scope: the share of its quota each group keeps; the layer's other pages go "
              "to the groups' best by mass-normalised score (in [0, 1]; 1: fixed quotas)");
  args.Option("tau", "0.5", "head-weight temperature, > 0");
  args.Option("alpha", "2", "Renyi order, > 0 (inf allowed)");
  args.Option("sink-tokens", "4", "leading tokens left out of the entropy");
  args.Flag("protect-tail", false, "always keep the last (partial) page");
  args.Option("neighbourhood-kernel", "1",
              "width of each head's neighbourhood pooling before its group's (odd, in [1, 63]; 1: "
              "off; page_entrokv, raw_entropy, mean, max, h2o)");
  args.Option("neighbourhood", "max", "neighbourhood pooling: max or mean");
  args.Option("format", "json", "json or table");
  auto parsed = args.Parse(argv);
  if (!parsed.ok()) return UsageError("select", parsed.status());
  if (!*parsed) return kExitOk;
  auto decisions = Run(args);
  if (!decisions.ok()) return UsageError("select", decisions.status());
  if (args.Get("format") == "json") {
    PrintJson(*decisions);
  } else {
    PrintTable(*decisions, args.Get("policy"));
  }
  return kExitOk;
}

}  // namespace entrokv::cli
