#include "core/scoring/metrics.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/scoring/pages.h"

namespace entrokv {

double UnionOverheadRatio(std::span<const std::vector<int32_t>> sets, int64_t k) {
  std::vector<int32_t> all;
  for (const auto& set : sets) all.insert(all.end(), set.begin(), set.end());
  std::sort(all.begin(), all.end());
  const auto distinct = std::unique(all.begin(), all.end()) - all.begin();
  return static_cast<double>(distinct) / static_cast<double>(k);
}

JaccardSummary PairwiseJaccard(std::span<const std::vector<int32_t>> sets) {
  JaccardSummary summary;
  if (sets.size() < 2) return summary;
  double sum = 0.0;
  double max_similarity = 0.0;
  int pairs = 0;
  std::vector<int32_t> common;
  for (size_t i = 0; i < sets.size(); ++i) {
    for (size_t j = i + 1; j < sets.size(); ++j) {
      common.clear();
      std::set_intersection(sets[i].begin(), sets[i].end(), sets[j].begin(), sets[j].end(),
                            std::back_inserter(common));
      const double both = static_cast<double>(common.size());
      const double either = static_cast<double>(sets[i].size() + sets[j].size()) - both;
      const double similarity = either > 0.0 ? both / either : 1.0;
      sum += similarity;
      max_similarity = std::max(max_similarity, similarity);
      ++pairs;
    }
  }
  summary.mean_similarity = sum / pairs;
  summary.max_similarity = max_similarity;
  return summary;
}

double BonferroniLowerBound(int r, double mean_similarity) {
  return std::max(1.0, r - static_cast<double>(r) * (r - 1) * mean_similarity);
}

UorBounds SandwichBounds(int r, double mean_similarity, double max_similarity) {
  const double lower =
      r / (1.0 + 2.0 * (r - 1) * mean_similarity / (1.0 + mean_similarity));
  const double upper =
      std::min(static_cast<double>(r), r - 2.0 * max_similarity / (1.0 + max_similarity));
  return {lower, upper};
}

void PageSums(std::span<const float> values, int page_size, std::span<double> sums) {
  const auto tokens = static_cast<int64_t>(values.size());
  const float* data = values.data();
  for (size_t page = 0; page < sums.size(); ++page) {
    const int64_t begin = static_cast<int64_t>(page) * page_size;
    const int64_t end = std::min<int64_t>(begin + page_size, tokens);
    double sum = 0.0;
    for (int64_t t = begin; t < end; ++t) sum += data[t];
    sums[page] = sum;
  }
}

double RetainedMassFromPageSums(std::span<const double> page_sums,
                                std::span<const int32_t> kept_pages) {
  double total = 0.0;
  for (const double sum : page_sums) total += sum;
  if (!(total > 0.0)) return 1.0;
  double kept = 0.0;
  for (const int32_t page : kept_pages) kept += page_sums[static_cast<size_t>(page)];
  return kept / total;
}

double RetainedMass(std::span<const float> values, int page_size,
                    std::span<const int32_t> kept_pages) {
  std::vector<double> sums(
      static_cast<size_t>(PageCount(static_cast<int64_t>(values.size()), page_size)));
  PageSums(values, page_size, sums);
  return RetainedMassFromPageSums(sums, kept_pages);
}

double NeedleBoundDelta(int64_t tokens, int r, double tau, double eta_ret, double needle_mass,
                        int sink_tokens) {
  const double c_ret = std::exp(-eta_ret / tau);
  const double d = (r - 1) * std::pow(static_cast<double>(tokens - sink_tokens), -1.0 / tau);
  return needle_mass * d / (c_ret + d);
}

double MeanPooledNeedle(int64_t tokens, int r, double needle_mass) {
  return (needle_mass + static_cast<double>(r - 1) / static_cast<double>(tokens)) / r;
}

}  // namespace entrokv
