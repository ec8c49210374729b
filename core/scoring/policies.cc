// Every policy (docs/architecture.md §3.10) and the name registry. Pooling policies share one path:
// pool the group's rows into one vector, take page maxima, select exactly K pages.
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/scoring/entropy.h"
#include "core/scoring/pages.h"
#include "core/scoring/policy.h"
#include "core/scoring/weights.h"
#include "core/util/status_macros.h"

namespace entrokv {
namespace {

// The top pages of `scores` for the group: protections first, evicted pages never.
std::vector<int32_t> SelectScores(std::span<const float> scores, const GroupInput& input,
                                  const PolicyOptions& options) {
  return SelectTopPages(scores, input.quota_pages,
                        ProtectedPagesOf(options, input.tokens, input.quota_pages, input.live),
                        input.live);
}

// Page maxima of the pooled row into selection->page_scores (layer scope combines them), then
// the top pages into selection->kept_pages.
void SelectFromPooled(std::span<const float> pooled, const GroupInput& input,
                      const PolicyOptions& options, GroupSelection* selection) {
  selection->page_scores = PageMaxima(pooled, options.page_size);
  selection->kept_pages = SelectScores(selection->page_scores, input, options);
}

// The rows a group's pooling takes: the group's rows, or their neighbourhood pooling
// (PolicyOptions::neighbourhood_kernel).
NeighbourhoodRows PoolingRows(const GroupInput& input, const PolicyOptions& options) {
  return NeighbourhoodRows(input.rows, input.tokens, options.neighbourhood_kernel,
                           options.neighbourhood);
}

// The weighted pooling policies' last two steps: pool the rows with selection->weights, keep the
// top pages.
void SelectWithWeights(const GroupInput& input, const PolicyOptions& options,
                       GroupSelection* selection) {
  std::vector<float> pooled(static_cast<size_t>(input.tokens));
  PoolRows(PoolingRows(input, options).rows(), selection->weights, pooled);
  SelectFromPooled(pooled, input, options, selection);
}

// Pools with softmax(-entropy / tau) weights; the entropy leaves out the sink tokens for
// page_entrokv (`isolate_sinks`) and keeps them for raw_entropy.
class EntropyWeightedPolicy final : public Policy {
 public:
  EntropyWeightedPolicy(absl::string_view name, bool isolate_sinks)
      : name_(name), isolate_sinks_(isolate_sinks) {}
  absl::string_view name() const override { return name_; }
  Pooling pooling() const override {
    return {.kind = PoolingKind::kEntropyWeighted, .isolate_sinks = isolate_sinks_};
  }

  GroupSelection SelectGroup(const GroupInput& input, const PolicyOptions& options) const override {
    GroupSelection selection;
    if (!input.cached_weights.empty()) {
      selection.weights.assign(input.cached_weights.begin(), input.cached_weights.end());
    } else {
      const int sinks = isolate_sinks_ ? options.sink_tokens : 0;
      for (const std::span<const float> row : input.rows) {
        selection.entropies.push_back(SinkIsolatedEntropy(row, sinks, options.alpha));
      }
      selection.weights = EntropyWeights(selection.entropies, options.tau);
    }
    SelectWithWeights(input, options, &selection);
    return selection;
  }

 private:
  absl::string_view name_;
  bool isolate_sinks_;
};

// Arithmetic mean over the group. `h2o` is the same operator on an ACCUMULATED statistic.
class MeanPolicy final : public Policy {
 public:
  MeanPolicy(absl::string_view name, StatisticKind statistic)
      : name_(name), statistic_(statistic) {}
  absl::string_view name() const override { return name_; }
  Pooling pooling() const override { return {.kind = PoolingKind::kMean}; }
  std::optional<StatisticKind> statistic() const override { return statistic_; }
  GroupSelection SelectGroup(const GroupInput& input, const PolicyOptions& options) const override {
    GroupSelection selection;
    selection.weights.assign(input.rows.size(), MeanScale(input.rows.size()));
    std::vector<float> pooled(static_cast<size_t>(input.tokens));
    MeanRows(PoolingRows(input, options).rows(), pooled);
    SelectFromPooled(pooled, input, options, &selection);
    return selection;
  }

 private:
  absl::string_view name_;
  StatisticKind statistic_;
};

class MaxPolicy final : public Policy {
 public:
  absl::string_view name() const override { return "max"; }
  Pooling pooling() const override { return {.kind = PoolingKind::kMax}; }
  GroupSelection SelectGroup(const GroupInput& input, const PolicyOptions& options) const override {
    std::vector<float> pooled(static_cast<size_t>(input.tokens), 0.0f);
    const NeighbourhoodRows rows = PoolingRows(input, options);
    for (const std::span<const float> row : rows.rows()) {
      for (size_t t = 0; t < pooled.size(); ++t) pooled[t] = std::max(pooled[t], row[t]);
    }
    GroupSelection selection;
    SelectFromPooled(pooled, input, options, &selection);
    return selection;
  }
};

// SnapKV: each head's row is max-pooled along tokens (width `snapkv_kernel`, centred, clipped at
// the ends), then the group mean is taken. It scores the attention of an observation window of
// recent queries: WINDOW_MEAN.
class SnapKvPolicy final : public Policy {
 public:
  absl::string_view name() const override { return "snapkv"; }
  Pooling pooling() const override { return {.kind = PoolingKind::kMaxPoolThenMean}; }
  std::optional<StatisticKind> statistic() const override { return StatisticKind::kWindowMean; }
  GroupSelection SelectGroup(const GroupInput& input, const PolicyOptions& options) const override {
    // Neighbourhood pooling's max over snapkv_kernel, then the group mean (MeanRows).
    PolicyOptions max_pooled = options;
    max_pooled.neighbourhood_kernel = options.snapkv_kernel;
    max_pooled.neighbourhood = NeighbourhoodKind::kMax;
    std::vector<float> pooled(static_cast<size_t>(input.tokens));
    MeanRows(PoolingRows(input, max_pooled).rows(), pooled);
    GroupSelection selection;
    SelectFromPooled(pooled, input, options, &selection);
    return selection;
  }
};

// Each head picks its own top-K pages; the group keeps the union (up to r * K pages). The
// baseline whose overhead the pooled policies remove.
class HeadIndependentPolicy final : public Policy {
 public:
  absl::string_view name() const override { return "head_independent"; }
  Pooling pooling() const override { return {.kind = PoolingKind::kUnion}; }
  GroupSelection SelectGroup(const GroupInput& input, const PolicyOptions& options) const override {
    GroupSelection selection;
    for (const std::span<const float> row : input.rows) {
      const std::vector<int32_t> own =
          SelectScores(PageMaxima(row, options.page_size), input, options);
      selection.kept_pages.insert(selection.kept_pages.end(), own.begin(), own.end());
    }
    std::sort(selection.kept_pages.begin(), selection.kept_pages.end());
    selection.kept_pages.erase(
        std::unique(selection.kept_pages.begin(), selection.kept_pages.end()),
        selection.kept_pages.end());
    return selection;
  }
};

// StreamingLLM: the sink pages and then the most recent pages, K in all; no statistic.
class StreamingPolicy final : public Policy {
 public:
  absl::string_view name() const override { return "streaming"; }
  Pooling pooling() const override { return {.kind = PoolingKind::kPosition}; }
  GroupSelection SelectGroup(const GroupInput& input, const PolicyOptions& options) const override {
    // The sinks and the newest K pages are protected; when evicted pages leave room, the page
    // index as score fills it with the newest live pages.
    const int64_t pages = PageCount(input.tokens, options.page_size);
    std::vector<float> newest_first(static_cast<size_t>(pages));
    for (int64_t page = 0; page < pages; ++page) {
      newest_first[static_cast<size_t>(page)] = static_cast<float>(page);
    }
    PolicyOptions streaming = options;
    streaming.protections.sink_pages = true;
    streaming.protections.recent_pages =
        static_cast<int>(std::min<int64_t>(input.quota_pages, INT32_MAX));
    GroupSelection selection;
    selection.kept_pages = SelectScores(newest_first, input, streaming);
    return selection;
  }
};

struct Registry {
  std::vector<std::unique_ptr<Policy>> policies;
  Registry() {
    policies.push_back(std::make_unique<EntropyWeightedPolicy>("page_entrokv", true));
    policies.push_back(std::make_unique<EntropyWeightedPolicy>("raw_entropy", false));
    policies.push_back(std::make_unique<MeanPolicy>("mean", StatisticKind::kLastRow));
    policies.push_back(std::make_unique<MaxPolicy>());
    policies.push_back(std::make_unique<HeadIndependentPolicy>());
    policies.push_back(std::make_unique<SnapKvPolicy>());
    policies.push_back(std::make_unique<MeanPolicy>("h2o", StatisticKind::kAccumulated));
    policies.push_back(std::make_unique<StreamingPolicy>());
  }
};

const Registry& GetRegistry() {
  static const Registry* const registry = new Registry();
  return *registry;
}

}  // namespace

int64_t SinkPageCount(const PolicyOptions& options, int64_t tokens) {
  return PageCount(std::min<int64_t>(options.sink_tokens, tokens), options.page_size);
}

std::vector<int32_t> ProtectedPagesOf(const PolicyOptions& options, int64_t tokens, int64_t quota,
                                      std::span<const uint8_t> live) {
  return ProtectedPages(options.protections, SinkPageCount(options, tokens),
                        PageCount(tokens, options.page_size), quota, live);
}

absl::Status ValidatePolicyOptions(const PolicyOptions& options) {
  if (options.page_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be positive, got ", options.page_size));
  }
  if (options.sink_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sink_tokens: must be >= 0, got ", options.sink_tokens));
  }
  if (!(options.alpha > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("alpha: must be > 0 (inf allowed), got ", options.alpha));
  }
  if (!(options.tau > 0.0) || std::isinf(options.tau)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tau: must be finite and > 0, got ", options.tau));
  }
  if (options.snapkv_kernel < 1 || options.snapkv_kernel % 2 == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapkv_kernel: must be odd and >= 1, got ", options.snapkv_kernel));
  }
  RETURN_IF_ERROR(
      ValidateNeighbourhoodKernel("neighbourhood_kernel", options.neighbourhood_kernel));
  RETURN_IF_ERROR(ValidateGroupFloor("group_floor", options.group_floor));
  return ValidateProtections(options.protections);
}

absl::Status ValidateGroupFloor(absl::string_view field, double floor) {
  if (floor >= 0.0 && floor <= 1.0) return absl::OkStatus();  // false for NaN
  return absl::InvalidArgumentError(absl::StrCat(field, ": must be in [0, 1], got ", floor));
}

absl::Status ValidateNeighbourhoodKernel(absl::string_view field, int64_t kernel) {
  if (kernel >= 1 && kernel % 2 == 1 && kernel <= kMaxNeighbourhoodKernel) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be odd and in [1, ", kMaxNeighbourhoodKernel, "], got ", kernel));
}

absl::StatusOr<NeighbourhoodKind> ParseNeighbourhoodKind(absl::string_view field,
                                                         absl::string_view name) {
  if (name == "max") return NeighbourhoodKind::kMax;
  if (name == "mean") return NeighbourhoodKind::kMean;
  return absl::InvalidArgumentError(absl::StrCat(field, ": '", name, "' is not one of max, mean"));
}

absl::StatusOr<const Policy*> FindPolicy(absl::string_view name) {
  for (const auto& policy : GetRegistry().policies) {
    if (policy->name() == name) return policy.get();
  }
  return absl::NotFoundError(
      absl::StrCat("policy: '", name, "' is not one of ", absl::StrJoin(PolicyNames(), ", ")));
}

std::vector<absl::string_view> PolicyNames() {
  std::vector<absl::string_view> names;
  for (const auto& policy : GetRegistry().policies) names.push_back(policy->name());
  return names;
}

}  // namespace entrokv
