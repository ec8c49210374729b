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
  if (protections.sink_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sink_tokens: must be >= 0, got ", protections.sink_tokens));
  }
  if (protections.page_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be positive, got ", protections.page_size));
  }
  return absl::OkStatus();
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
                                    const Protections& protections) {
  const auto pages = static_cast<int32_t>(scores.size());
  const auto quota = static_cast<int32_t>(std::min<int64_t>(k, pages));
  if (quota == pages) {  // keeps everything
    std::vector<int32_t> all(static_cast<size_t>(pages));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  std::vector<char> is_kept(static_cast<size_t>(pages), 0);
  std::vector<int32_t> kept;
  kept.reserve(static_cast<size_t>(quota));
  auto protect = [&](int32_t page) {
    if (page < 0 || page >= pages || is_kept[static_cast<size_t>(page)] ||
        static_cast<int32_t>(kept.size()) >= quota) {
      return;
    }
    is_kept[static_cast<size_t>(page)] = 1;
    kept.push_back(page);
  };
  if (protections.tail_page) protect(pages - 1);
  if (protections.sink_pages) {
    const int64_t sink_pages =
        (protections.sink_tokens + protections.page_size - 1) / protections.page_size;
    for (int32_t page = 0; page < sink_pages; ++page) protect(page);
  }
  for (int32_t i = 0; i < protections.recent_pages; ++i) protect(pages - 1 - i);

  // Linear-time selection among the rest: nth_element with the total order, so the k-th
  // boundary respects (score desc, index asc) exactly.
  std::vector<int32_t> candidates;
  candidates.reserve(static_cast<size_t>(pages) - kept.size());
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
