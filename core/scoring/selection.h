// Exact top-K page selection with deterministic ties and protections (docs/architecture.md §3.7).
#ifndef ENTROKV_CORE_SCORING_SELECTION_H_
#define ENTROKV_CORE_SCORING_SELECTION_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace entrokv {

// Pages kept regardless of score. They count inside K: when they alone exceed K, the tail page
// comes first, then the sink pages, then the recent pages from the newest back.
struct Protections {
  bool tail_page = false;   // the page being written (daemon default: on)
  bool sink_pages = false;  // the pages holding the sink tokens (PolicyOptions::sink_tokens)
  int recent_pages = 0;     // the newest k pages (includes the tail page)
};

// INVALID_ARGUMENT naming protect_recent_pages when it is negative.
[[nodiscard]] absl::Status ValidateProtections(const Protections& protections);

// The one statement of the protection rules, used by every selection path: the pages that
// `protections` keep in a layer of `pages` pages whose first `sink_pages` pages hold the sink
// tokens, in priority order (tail, sinks, recent from the newest back), distinct, at most `quota`
// of them. The work is O(min(quota, pages)) whatever the values (protect_recent_pages = 2^31 - 1
// costs what `pages` costs). `live`, when not empty, marks the pages still held (1) per page:
// an evicted page is protected by nothing. REQUIRES: pages, quota, sink_pages >= 0.
[[nodiscard]] std::vector<int32_t> ProtectedPages(const Protections& protections,
                                                  int64_t sink_pages, int64_t pages, int64_t quota,
                                                  std::span<const uint8_t> live = {});

// Keeps the min(k, live pages) pages of highest score, ties to the lower page index, after the
// `protected_pages` (distinct, live, at most k, as ProtectedPages lists them); `live` (empty:
// every page) marks the pages that may be kept. Returns the kept page indices in ascending
// order. REQUIRES: k >= 0; scores finite; live empty or one entry per score.
[[nodiscard]] std::vector<int32_t> SelectTopPages(std::span<const float> scores, int64_t k,
                                                  std::span<const int32_t> protected_pages = {},
                                                  std::span<const uint8_t> live = {});

// The plain sort-based reference the fast selection is tested against: order by
// (score desc, index asc), take the first k. No protections.
[[nodiscard]] std::vector<int32_t> SelectTopPagesBySort(std::span<const float> scores, int64_t k);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_SELECTION_H_
