#include "core/scoring/group_finish.h"

#include <algorithm>

#include "core/scoring/layer_scope.h"
#include "core/scoring/metrics.h"
#include "core/scoring/radix_select.h"

namespace entrokv {

void GroupFinisher::Finish(const PolicyOptions& options, const LayerRequest& request, int group,
                           int r, const GroupScores& scores, GroupDecision* decision) {
  const auto pages = static_cast<int64_t>(scores.page_max.size());
  if (request.page_scores) {
    decision->page_scores.assign(scores.page_max.begin(), scores.page_max.end());
  }
  // Selection: the protected pages (the shared rules) get bit 31 of their key; evicted pages get
  // key 0 below every live page (whose keys are shifted up by one), so they are never kept.
  const std::span<const uint8_t> live = GroupLivePages(request, pages, group);
  const int64_t live_count =
      live.empty() ? pages : std::count_if(live.begin(), live.end(), [](uint8_t v) { return v; });
  const int64_t quota = std::min(request.quota_pages, live_count);
  std::vector<int32_t>& kept = decision->kept_pages;
  keys_.resize(static_cast<size_t>(pages) * 2);
  uint32_t* keys = keys_.data();
  if (quota == pages) {
    KeepAllPages(pages, &kept);
  } else if (quota == live_count) {
    kept.clear();
    for (int64_t page = 0; page < pages; ++page) {
      if (live[static_cast<size_t>(page)] != 0) kept.push_back(static_cast<int32_t>(page));
    }
  } else {
    FillKeys(scores.page_max.data(), pages, keys);
    if (!live.empty()) {
      for (int64_t page = 0; page < pages; ++page) {
        keys[page] = live[static_cast<size_t>(page)] != 0 ? keys[page] + 1 : 0;
      }
    }
    for (const int32_t page : ProtectedPagesOf(options, request.tokens, quota, live)) {
      keys[page] |= uint32_t{1} << 31;
    }
    KeepLargestKeys(keys, pages, quota, keys + pages, &kept);
  }
  if (request.measure) {
    Measure(scores.head_max, r, pages, std::min(request.quota_pages, pages), scores.page_sums,
            decision);
  }
}

void GroupFinisher::Measure(std::span<const float> head_max, int r, int64_t pages, int64_t quota,
                            std::span<const double> page_sums, GroupDecision* decision) {
  // The head-independent shadow: each head's own top-K of its page maxima, no protections, as
  // MeasureGroup selects them.
  head_kept_.resize(static_cast<size_t>(r));
  uint32_t* keys = keys_.data();
  for (int i = 0; i < r; ++i) {
    std::vector<int32_t>& kept = head_kept_[static_cast<size_t>(i)];
    if (quota == pages) {
      KeepAllPages(pages, &kept);
      continue;
    }
    FillKeys(head_max.data() + static_cast<size_t>(i) * static_cast<size_t>(pages), pages, keys);
    KeepLargestKeys(keys, pages, quota, keys + pages, &kept);
  }
  const std::span<const std::vector<int32_t>> sets(head_kept_.data(), static_cast<size_t>(r));
  decision->shadow_uor = UnionOverheadRatio(sets, quota);
  decision->disagreement = PairwiseJaccard(sets).disagreement();
  decision->retained_mass = RetainedMassFromPageSums(page_sums, decision->kept_pages);
}

void GroupFinisher::FinishLayer(const PolicyOptions& options, const LayerRequest& request,
                                std::span<const float> layer_scores,
                                std::span<const double> layer_page_sums, LayerDecision* decision) {
  if (!SelectsPerLayer(options, request)) {
    FinishGroupScope(decision);
    return;
  }
  const auto pages = static_cast<size_t>(decision->page_count);
  const auto groups = decision->groups.size();
  std::vector<std::span<const float>> scores(groups);
  for (size_t g = 0; g < groups; ++g) scores[g] = layer_scores.subspan(g * pages, pages);
  SelectPerLayer(scores, options, request, decision);
  if (request.measure) {  // retained mass against the new sets, as MeasureGroup takes it
    for (size_t g = 0; g < groups; ++g) {
      GroupDecision& group = decision->groups[g];
      group.retained_mass =
          RetainedMassFromPageSums(layer_page_sums.subspan(g * pages, pages), group.kept_pages);
    }
  }
}

}  // namespace entrokv
