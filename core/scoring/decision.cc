#include "core/scoring/decision.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/scoring/group_quotas.h"
#include "core/scoring/metrics.h"
#include "core/scoring/pages.h"
#include "core/scoring/weights.h"
#include "core/util/status_macros.h"

namespace entrokv {
absl::Status ValidateLayerRequest(const Policy& policy, const PolicyOptions& options,
                                  const LayerRequest& request, bool check_values) {
  RETURN_IF_ERROR(ValidatePolicyOptions(options));
  if (request.query_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("query_heads: must be positive, got ", request.query_heads));
  }
  if (request.kv_groups <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_groups: must be positive, got ", request.kv_groups));
  }
  if (request.query_heads % request.kv_groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat("query_heads: ", request.query_heads,
                                                   " is not a multiple of kv_groups ",
                                                   request.kv_groups));
  }
  if (request.tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: must be positive, got ", request.tokens));
  }
  if (request.quota_pages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("quota_pages: the budget must give at least one page per (layer, group), got ",
                     request.quota_pages));
  }
  RETURN_IF_ERROR(ValidateGroupQuotas("group_floor", policy, options, request.scope));
  if (!request.statistic.has_value()) {
    if (policy.needs_statistic()) {
      return absl::InvalidArgumentError(
          absl::StrCat("statistic: policy ", policy.name(), " needs one"));
    }
  } else {
    const StatisticView& statistic = *request.statistic;
    if (statistic.query_heads() != request.query_heads) {
      return absl::InvalidArgumentError(absl::StrCat("statistic: has ", statistic.query_heads(),
                                                     " rows, the model has ", request.query_heads,
                                                     " query heads; the shape must be [H_Q, T]"));
    }
    if (statistic.tokens() != request.tokens) {
      return absl::FailedPreconditionError(absl::StrCat(
          "statistic: covers ", statistic.tokens(), " tokens, the sequence has ", request.tokens));
    }
  }
  if (!request.cached_weights.empty() &&
      static_cast<int>(request.cached_weights.size()) != request.query_heads) {
    return absl::FailedPreconditionError(
        absl::StrCat("cached_weights: ", request.cached_weights.size(), " weights for ",
                     request.query_heads, " query heads"));
  }
  if (!request.live_pages.empty()) {
    const int64_t pages = PageCount(request.tokens, options.page_size);
    const auto entries = static_cast<int64_t>(request.live_pages.size());
    if (entries != pages && entries != pages * request.kv_groups) {
      return absl::FailedPreconditionError(absl::StrCat("live_pages: ", entries, " entries for ",
                                                        pages, " pages and ", request.kv_groups,
                                                        " groups; give n or G * n"));
    }
  }
  if (check_values && request.statistic.has_value()) {
    RETURN_IF_ERROR(request.statistic->ValidateValues());
  }
  return absl::OkStatus();
}

LayerRequest LayerRequestFor(std::optional<StatisticView> statistic, int query_heads, int kv_groups,
                             int64_t tokens, int64_t quota_pages) {
  LayerRequest request;
  request.statistic = statistic;
  request.query_heads = query_heads;
  request.kv_groups = kv_groups;
  request.tokens = tokens;
  request.quota_pages = quota_pages;
  return request;
}

absl::Status CheckCancelled(const LayerRequest& request, int groups_scored) {
  if (request.cancelled && request.cancelled()) {
    return absl::CancelledError(absl::StrCat("scoring cancelled after ", groups_scored, " of ",
                                             request.kv_groups, " KV groups of the layer"));
  }
  return absl::OkStatus();
}

std::span<const uint8_t> GroupLivePages(const LayerRequest& request, int64_t pages, int group) {
  if (request.live_pages.empty()) return {};
  if (static_cast<int64_t>(request.live_pages.size()) == pages) return request.live_pages;
  return request.live_pages.subspan(static_cast<size_t>(group) * static_cast<size_t>(pages),
                                    static_cast<size_t>(pages));
}

std::vector<uint8_t> LayerLivePages(const LayerRequest& request, int64_t pages) {
  if (request.live_pages.empty()) return {};
  std::vector<uint8_t> live(static_cast<size_t>(pages), 1);
  for (int g = 0; g < request.kv_groups; ++g) {
    const std::span<const uint8_t> group = GroupLivePages(request, pages, g);
    for (size_t b = 0; b < live.size(); ++b) live[b] = (live[b] != 0 && group[b] != 0) ? 1 : 0;
  }
  return live;
}

bool SelectsPerLayer(const PolicyOptions& options, const LayerRequest& request) {
  return request.scope == SelectionScope::kLayer || MovesGroupQuotas(options);
}

void SelectPerLayer(std::span<const std::span<const float>> group_scores,
                    const PolicyOptions& options, const LayerRequest& request,
                    LayerDecision* decision) {
  if (request.scope == SelectionScope::kLayer) {
    ApplyLayerScope(group_scores, request.combine, options, request.tokens,
                    LayerLivePages(request, decision->page_count), decision);
    return;
  }
  ApplyGroupQuotas(group_scores, options, request, decision);  // validated: it ranks pages
  FinishGroupScope(decision);
}

void MeasureGroup(std::span<const std::span<const float>> rows, const PolicyOptions& options,
                  int64_t quota_pages, GroupDecision* decision) {
  std::vector<std::vector<int32_t>> per_head;
  per_head.reserve(rows.size());
  std::vector<float> mean(rows.front().size());
  MeanRows(rows, mean);
  for (const std::span<const float> row : rows) {
    per_head.push_back(SelectTopPages(PageMaxima(row, options.page_size), quota_pages));
  }
  const int64_t effective_k = std::min<int64_t>(
      quota_pages, PageCount(static_cast<int64_t>(mean.size()), options.page_size));
  decision->shadow_uor = UnionOverheadRatio(per_head, effective_k);
  decision->disagreement = PairwiseJaccard(per_head).disagreement();
  decision->retained_mass = RetainedMass(mean, options.page_size, decision->kept_pages);
}

absl::StatusOr<LayerDecision> DecideLayer(const Policy& policy, const PolicyOptions& options,
                                          const LayerRequest& request) {
  RETURN_IF_ERROR(ValidateLayerRequest(policy, options, request));
  const int r = request.query_heads / request.kv_groups;
  LayerDecision decision;
  decision.page_count = PageCount(request.tokens, options.page_size);
  decision.quota_pages = request.quota_pages;
  decision.groups.resize(static_cast<size_t>(request.kv_groups));

  std::vector<std::vector<float>> scratch(static_cast<size_t>(r));
  std::vector<std::span<const float>> rows(static_cast<size_t>(r));
  auto load_rows = [&](int g) {
    for (int i = 0; i < r; ++i) {
      rows[static_cast<size_t>(i)] =
          request.statistic->Row(g * r + i, &scratch[static_cast<size_t>(i)]);
    }
  };
  const bool per_layer = SelectsPerLayer(options, request);
  std::vector<std::vector<float>> page_scores;  // per group, kept for a per-layer selection
  for (int g = 0; g < request.kv_groups; ++g) {
    RETURN_IF_ERROR(CheckCancelled(request, g));
    GroupInput input;
    input.tokens = request.tokens;
    input.quota_pages = request.quota_pages;
    if (request.statistic.has_value()) {
      load_rows(g);
      input.rows = rows;
    }
    input.live = GroupLivePages(request, decision.page_count, g);
    if (!request.cached_weights.empty()) {
      input.cached_weights =
          request.cached_weights.subspan(static_cast<size_t>(g * r), static_cast<size_t>(r));
    }
    GroupSelection selection = policy.SelectGroup(input, options);
    GroupDecision& group = decision.groups[static_cast<size_t>(g)];
    group.kept_pages = std::move(selection.kept_pages);
    group.weights = std::move(selection.weights);
    group.entropies = std::move(selection.entropies);
    if (request.page_scores) group.page_scores = selection.page_scores;
    if (per_layer && !selection.page_scores.empty()) {
      page_scores.push_back(std::move(selection.page_scores));
    }
    // Group scope measures now, while the rows are loaded; the others once their sets are known.
    if (!per_layer && request.measure && request.statistic.has_value()) {
      MeasureGroup(rows, options, request.quota_pages, &group);
    }
  }
  if (!per_layer) {
    FinishGroupScope(&decision);
    return decision;
  }
  std::vector<std::span<const float>> score_spans;
  // Every group of a policy has page scores or none does.
  if (page_scores.size() == decision.groups.size()) {
    score_spans.assign(page_scores.begin(), page_scores.end());
  }
  SelectPerLayer(score_spans, options, request, &decision);
  if (request.measure && request.statistic.has_value()) {
    for (int g = 0; g < request.kv_groups; ++g) {
      load_rows(g);
      MeasureGroup(rows, options, request.quota_pages, &decision.groups[static_cast<size_t>(g)]);
    }
  }
  return decision;
}

}  // namespace entrokv
