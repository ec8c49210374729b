#include "sim/needles.h"

#include <algorithm>

namespace entrokv::sim {

std::vector<int> NeedlesLookedAt(std::span<const float> row, std::span<const NeedleSpan> needles,
                                 double share) {
  double total = 0.0;
  for (const float value : row) total += value;
  total = std::max(total, 1e-300);
  std::vector<int> seen;
  for (size_t j = 0; j < needles.size(); ++j) {
    double mass = 0.0;
    for (int64_t t = needles[j].begin; t < needles[j].end; ++t) {
      mass += row[static_cast<size_t>(t)];
    }
    if (mass / total >= share) seen.push_back(static_cast<int>(j));
  }
  return seen;
}

std::vector<std::vector<int>> NeedleTargets(std::span<const float> layer, int query_heads,
                                            int kv_groups, int64_t tokens,
                                            std::span<const NeedleSpan> needles, double share) {
  std::vector<std::vector<int>> targets(static_cast<size_t>(kv_groups));
  const int r = query_heads / kv_groups;
  for (int h = 0; h < query_heads; ++h) {
    const std::span<const float> row = layer.subspan(
        static_cast<size_t>(h) * static_cast<size_t>(tokens), static_cast<size_t>(tokens));
    std::vector<int>& group = targets[static_cast<size_t>(h / r)];
    for (const int j : NeedlesLookedAt(row, needles, share)) {
      if (std::find(group.begin(), group.end(), j) == group.end()) group.push_back(j);
    }
  }
  return targets;
}

bool NeedleKept(const NeedleSpan& needle, int page_size, std::span<const int32_t> kept) {
  for (int64_t page = needle.begin / page_size; page <= (needle.end - 1) / page_size; ++page) {
    if (!std::binary_search(kept.begin(), kept.end(), static_cast<int32_t>(page))) return false;
  }
  return true;
}

}  // namespace entrokv::sim
