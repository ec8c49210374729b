#include "core/scoring/selection.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace entrokv {
namespace {

// Strict weak order: higher score first, lower index first among equal scores.
struct RanksBefore {
  std::span<const float> scores;
  bool operator()(int32_t a, int32_t b) const {
    const float sa = scores[static_cast<size_t>(a)];
    const float sb = scores[static_cast<size_t>(b)];
    return sa != sb ? sa > sb : a < b;
  }
};

}  // namespace

absl::Status ValidateProtections(const Protections& protections) {
  if (protections.recent_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("protect_recent_pages: must be >= 0, got ", protections.recent_pages));
  }
  return absl::OkStatus();
}

std::vector<int32_t> ProtectedPages(const Protections& protections, int64_t sink_pages,
                                    int64_t pages, int64_t quota, std::span<const uint8_t> live) {
  std::vector<int32_t> kept;
  const int64_t most = std::min(quota, pages);
  auto is_live = [&](int64_t page) { return live.empty() || live[static_cast<size_t>(page)] != 0; };
  auto full = [&] { return static_cast<int64_t>(kept.size()) >= most; };
  const int64_t tail = pages - 1;
  const bool tail_kept = protections.tail_page && most > 0 && is_live(tail);
  if (tail_kept) kept.push_back(static_cast<int32_t>(tail));
  const int64_t sinks = protections.sink_pages ? std::min(sink_pages, pages) : 0;
  for (int64_t page = 0; page < sinks && !full(); ++page) {
    if ((page != tail || !tail_kept) && is_live(page)) kept.push_back(static_cast<int32_t>(page));
  }
  // Every sink page below `sinks` is listed unless the list filled up first (then this loop
  // does not run), so a recent page below `sinks` is already in.
  const int64_t recent = std::min<int64_t>(protections.recent_pages, pages);
  for (int64_t i = 0; i < recent && !full(); ++i) {
    const int64_t page = tail - i;
    if ((page == tail && tail_kept) || page < sinks || !is_live(page)) continue;
    kept.push_back(static_cast<int32_t>(page));
  }
  return kept;
}

std::vector<int32_t> SelectTopPagesBySort(std::span<const float> scores, int64_t k) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), RanksBefore{scores});
  order.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(order.size()))));
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<int32_t> SelectTopPages(std::span<const float> scores, int64_t k,
                                    std::span<const int32_t> protected_pages,
                                    std::span<const uint8_t> live) {
  const auto pages = static_cast<int32_t>(scores.size());
  auto is_live = [&](int32_t page) { return live.empty() || live[static_cast<size_t>(page)] != 0; };
  const auto live_count = static_cast<int32_t>(
      live.empty() ? pages : std::count_if(live.begin(), live.end(), [](uint8_t v) { return v; }));
  const auto quota = static_cast<int32_t>(std::min<int64_t>(k, live_count));
  if (quota == live_count) {  // keeps every live page
    std::vector<int32_t> all;
    all.reserve(static_cast<size_t>(live_count));
    for (int32_t page = 0; page < pages; ++page) {
      if (is_live(page)) all.push_back(page);
    }
    return all;
  }
  // Evicted pages count as already taken, so they are never candidates.
  std::vector<char> is_kept(static_cast<size_t>(pages), 0);
  for (int32_t page = 0; page < pages; ++page) is_kept[static_cast<size_t>(page)] = !is_live(page);
  std::vector<int32_t> kept(protected_pages.begin(), protected_pages.end());
  kept.reserve(static_cast<size_t>(quota));
  for (const int32_t page : kept) is_kept[static_cast<size_t>(page)] = 1;

  // Linear-time selection among the rest: nth_element with the total order, so the k-th
  // boundary respects (score desc, index asc) exactly.
  std::vector<int32_t> candidates;
  candidates.reserve(static_cast<size_t>(live_count) - kept.size());
  for (int32_t page = 0; page < pages; ++page) {
    if (!is_kept[static_cast<size_t>(page)]) candidates.push_back(page);
  }
  const auto remaining = static_cast<size_t>(quota) - kept.size();
  if (remaining > 0 && remaining < candidates.size()) {
    std::nth_element(candidates.begin(), candidates.begin() + static_cast<int64_t>(remaining) - 1,
                     candidates.end(), RanksBefore{scores});
  }
  kept.insert(kept.end(), candidates.begin(),
              candidates.begin() + static_cast<int64_t>(std::min(remaining, candidates.size())));
  std::sort(kept.begin(), kept.end());
  return kept;
}

}  // namespace entrokv
