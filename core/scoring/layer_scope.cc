#include "core/scoring/layer_scope.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "core/scoring/decision.h"
#include "core/scoring/entropy.h"
#include "core/scoring/pages.h"
#include "core/scoring/selection.h"
#include "core/scoring/weights.h"

namespace entrokv {
namespace {

// The pages that hold a sink token, left out of a group's page entropy as the sink tokens are
// left out of a head's entropy (docs/architecture.md §3.2): they are large in every group and
// would make all look alike. Counted in int64 over the pages there are (sink_tokens may be up to
// 2^31 - 1).
int SinkPages(const PolicyOptions& options, size_t pages) {
  return static_cast<int>(SinkPageCount(options, static_cast<int64_t>(pages) * options.page_size));
}

// 1 / sum_b scores[b], summed in double in page order; 0 when the sum is not > 0.
double InverseMass(std::span<const float> scores) {
  double mass = 0.0;
  for (const float score : scores) mass += score;
  return mass > 0.0 ? 1.0 / mass : 0.0;
}

}  // namespace

absl::string_view SelectionScopeName(SelectionScope scope) {
  return scope == SelectionScope::kLayer ? "layer" : "group";
}

absl::StatusOr<SelectionScope> ParseSelectionScope(absl::string_view field,
                                                   absl::string_view name) {
  if (name == "group") return SelectionScope::kGroup;
  if (name == "layer") return SelectionScope::kLayer;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", name, "' is not a selection scope (group, layer)"));
}

absl::string_view LayerCombineName(LayerCombine combine) {
  switch (combine) {
    case LayerCombine::kMassMax:
      return "mass_max";
    case LayerCombine::kEntropyWeighted:
      return "entropy_weighted";
    case LayerCombine::kMassMean:
      return "mass_mean";
  }
  return "mass_max";
}

absl::StatusOr<LayerCombine> ParseLayerCombine(absl::string_view field, absl::string_view name) {
  for (const LayerCombine combine :
       {LayerCombine::kMassMax, LayerCombine::kEntropyWeighted, LayerCombine::kMassMean}) {
    if (name == LayerCombineName(combine)) return combine;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": '", name, "' is not a layer combine (mass_max, entropy_weighted, mass_mean)"));
}

void CombineGroupScores(std::span<const std::span<const float>> group_scores, LayerCombine combine,
                        const PolicyOptions& options, std::vector<float>* combined,
                        std::vector<double>* group_weights) {
  const size_t pages = group_scores.front().size();
  combined->assign(pages, 0.0f);
  group_weights->clear();
  if (combine == LayerCombine::kMassMax) {
    for (const std::span<const float> scores : group_scores) {
      const auto inverse = static_cast<float>(InverseMass(scores));
      for (size_t b = 0; b < pages; ++b) {
        (*combined)[b] = std::max((*combined)[b], scores[b] * inverse);
      }
    }
    return;
  }
  if (combine == LayerCombine::kEntropyWeighted) {
    std::vector<double> entropies;
    entropies.reserve(group_scores.size());
    for (const std::span<const float> scores : group_scores) {
      entropies.push_back(
          SinkIsolatedEntropy(scores, SinkPages(options, scores.size()), options.alpha));
    }
    *group_weights = EntropyWeights(entropies, options.tau);
  } else {
    group_weights->assign(group_scores.size(), 1.0 / static_cast<double>(group_scores.size()));
  }
  for (size_t g = 0; g < group_scores.size(); ++g) {
    const std::span<const float> scores = group_scores[g];
    const auto factor = static_cast<float>((*group_weights)[g] * InverseMass(scores));
    for (size_t b = 0; b < pages; ++b) (*combined)[b] += factor * scores[b];
  }
}

namespace {

// Sets `set`'s pages (ascending) in `bits`, a word at a time: consecutive pages share a word, so
// it is built in a register rather than read and written back per page.
void AddToBitmap(const std::vector<int32_t>& set, std::vector<uint64_t>& bits) {
  size_t at = 0;
  uint64_t word = 0;
  for (const int32_t page : set) {
    const size_t index = static_cast<uint32_t>(page) >> 6;
    if (index != at) {
      bits[at] |= word;
      at = index;
      word = 0;
    }
    word |= uint64_t{1} << (static_cast<uint32_t>(page) & 63);
  }
  if (!bits.empty()) bits[at] |= word;
}

// The pages of `sets` (ascending, distinct) as a bitmap: linear in the pages kept.
std::vector<uint64_t> PageBitmap(std::span<const std::vector<int32_t>> sets) {
  int32_t last = -1;
  for (const auto& set : sets) {
    if (!set.empty()) last = std::max(last, set.back());
  }
  std::vector<uint64_t> bits(static_cast<size_t>(last + 64) / 64, 0);
  for (const auto& set : sets) AddToBitmap(set, bits);
  return bits;
}

}  // namespace

std::vector<int32_t> UnionOfPages(std::span<const std::vector<int32_t>> sets) {
  std::vector<int32_t> all;
  const std::vector<uint64_t> bits = PageBitmap(sets);
  for (size_t word = 0; word < bits.size(); ++word) {
    for (uint64_t w = bits[word]; w != 0; w &= w - 1) {
      all.push_back(static_cast<int32_t>(word * 64 + static_cast<size_t>(std::countr_zero(w))));
    }
  }
  return all;
}

namespace {

std::vector<std::vector<int32_t>> KeptPerGroup(const LayerDecision& decision) {
  std::vector<std::vector<int32_t>> kept;
  kept.reserve(decision.groups.size());
  for (const GroupDecision& group : decision.groups) kept.push_back(group.kept_pages);
  return kept;
}

}  // namespace

void FinishGroupScope(LayerDecision* decision) {
  decision->scope = SelectionScope::kGroup;
  // Counted on a bitmap of the layer's pages: linear in the pages kept (a sort of every group's
  // pages was the largest cost of a whole-model decision on a GPU).
  std::vector<uint64_t> bits(static_cast<size_t>(decision->page_count + 63) / 64, 0);
  for (const GroupDecision& group : decision->groups) AddToBitmap(group.kept_pages, bits);
  int64_t count = 0;
  for (const uint64_t word : bits) count += std::popcount(word);
  decision->union_pages = count;
  decision->group_scope_union_pages = decision->union_pages;
}

void ApplyLayerScope(std::span<const std::span<const float>> group_scores, LayerCombine combine,
                     const PolicyOptions& options, int64_t tokens,
                     std::span<const uint8_t> layer_live, LayerDecision* decision) {
  decision->scope = SelectionScope::kLayer;
  const std::vector<std::vector<int32_t>> per_group = KeptPerGroup(*decision);
  std::vector<int32_t> union_pages = UnionOfPages(per_group);
  decision->group_scope_union_pages = static_cast<int64_t>(union_pages.size());
  std::vector<int32_t> layer_pages;
  if (group_scores.empty()) {
    layer_pages = std::move(union_pages);
    if (!layer_live.empty()) {  // a page one group no longer holds cannot be shared by all
      std::erase_if(layer_pages,
                    [&](int32_t page) { return layer_live[static_cast<size_t>(page)] == 0; });
    }
    decision->combine_weights.clear();
  } else {
    std::vector<float> combined;
    CombineGroupScores(group_scores, combine, options, &combined, &decision->combine_weights);
    layer_pages = SelectTopPages(
        combined, decision->quota_pages,
        ProtectedPagesOf(options, tokens, decision->quota_pages, layer_live), layer_live);
  }
  decision->union_pages = static_cast<int64_t>(layer_pages.size());
  for (GroupDecision& group : decision->groups) group.kept_pages = layer_pages;
}

}  // namespace entrokv
