// Exact top-K page selection with deterministic ties and protections (ARCHITECTURE §3.7).
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
  bool sink_pages = false;  // the pages holding the first `sink_tokens` tokens
  int recent_pages = 0;     // the newest k pages (includes the tail page)
  int sink_tokens = 4;      // which tokens are sinks, for sink_pages
  int page_size = 16;       // tokens per page, for sink_pages
};

[[nodiscard]] absl::Status ValidateProtections(const Protections& protections);

// Keeps the min(k, n) pages of highest score, ties to the lower page index, after the
// protected pages. Returns the kept page indices in ascending order.
// REQUIRES: k >= 0; scores finite.
[[nodiscard]] std::vector<int32_t> SelectTopPages(std::span<const float> scores, int64_t k,
                                                  const Protections& protections = {});

// The plain sort-based reference the fast selection is tested against: order by
// (score desc, index asc), take the first k. No protections.
[[nodiscard]] std::vector<int32_t> SelectTopPagesBySort(std::span<const float> scores, int64_t k);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_SELECTION_H_
