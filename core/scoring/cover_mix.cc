#include "core/scoring/cover_mix.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/scoring/pages.h"
#include "core/scoring/weights.h"
#include "core/util/status_macros.h"

namespace entrokv {
namespace {

// The mean of a group's rows (MeanRows).
std::vector<float> GroupMean(std::span<const std::span<const float>> rows) {
  std::vector<float> mean(rows.front().size());
  MeanRows(rows, mean);
  return mean;
}

// `row` max-pooled over `kernel` tokens: centred on each token, or (forward) over the token and
// the kernel - 1 before it. The forward window of token t is the centred one of token t - kernel/2,
// whole because the kernel is odd; the first kernel/2 tokens see the row's start.
std::vector<float> MaxPool(std::span<const float> row, int kernel, bool forward) {
  const auto tokens = static_cast<int64_t>(row.size());
  std::vector<float> centred(row.size());
  NeighbourhoodPool(row, 0, tokens, 0, kernel, NeighbourhoodKind::kMax, centred);
  if (!forward) return centred;
  const int64_t half = kernel / 2;
  std::vector<float> pooled(row.size());
  float start = std::numeric_limits<float>::lowest();
  for (int64_t t = 0; t < tokens; ++t) {
    if (t < half) {
      start = std::max(start, row[t]);
      pooled[t] = start;
    } else {
      pooled[t] = centred[t - half];
    }
  }
  return pooled;
}

// The pages ranked by `pooled`'s page maxima, best first, ties to the lower page.
std::vector<int64_t> RankPages(std::span<const float> pooled, int page_size) {
  const std::vector<float> maxima = PageMaxima(pooled, page_size);
  std::vector<int64_t> order(maxima.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&maxima](int64_t a, int64_t b) { return maxima[a] > maxima[b]; });
  return order;
}

// The keys' row as a policy with a neighbourhood pools a group (NeighbourhoodRows, then
// MeanRows): each head's row max-pooled over `kernel` (centred), then their mean.
std::vector<float> PooledKeys(std::span<const std::span<const float>> keys, int kernel) {
  const auto tokens = static_cast<int64_t>(keys.front().size());
  return GroupMean(NeighbourhoodRows(keys, tokens, kernel, NeighbourhoodKind::kMax).rows());
}

}  // namespace

absl::Status ValidateCoverMix(absl::string_view prefix, const CoverMix& mix) {
  if (!(mix.mass > 0.0 && mix.mass <= 1.0)) {  // false for NaN
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "mass: must be in (0, 1], got ", mix.mass));
  }
  RETURN_IF_ERROR(
      ValidateNeighbourhoodKernel(absl::StrCat(prefix, "question_kernel"), mix.question_kernel));
  return ValidateNeighbourhoodKernel(absl::StrCat(prefix, "keys_kernel"), mix.keys_kernel);
}

absl::Status ValidateCoverPolicy(absl::string_view field, const Policy& policy,
                                 const PolicyOptions& options) {
  if (options.neighbourhood_kernel == 1 && policy.pooling().kind != PoolingKind::kMaxPoolThenMean) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": the cover rule orders the pages itself, and policy ", policy.name(),
      " with neighbourhood_kernel ", options.neighbourhood_kernel,
      " pools tokens again: use a policy without a neighbourhood (mean, page_entrokv)"));
}

CoverSpan CoverSpanOf(const PolicyOptions& options, int64_t tokens) {
  const Protections& protections = options.protections;
  const int64_t newest = std::max<int64_t>(protections.tail_page ? 1 : 0, protections.recent_pages);
  return CoverSpan{.first = SinkPageCount(options, tokens),
                   .end = PageCount(tokens, options.page_size) - newest,
                   .sink_tokens = std::min<int64_t>(options.sink_tokens, tokens)};
}

absl::Status CoverThenFill(const StatisticView& rows, const CoverMix& mix, int group_heads,
                           int page_size, CoverSpan span, std::span<float> key_rows) {
  if (absl::Status valid = rows.ValidateValues(); !valid.ok()) return valid;
  const int64_t tokens = rows.tokens();
  const auto width = static_cast<size_t>(tokens);
  const int64_t pages = PageCount(tokens, page_size);
  span.first = mix.rank_sinks ? 0 : std::clamp<int64_t>(span.first, 0, pages);
  span.end = std::clamp<int64_t>(span.end, span.first, pages);
  std::vector<std::vector<float>> scratch(static_cast<size_t>(group_heads));
  std::vector<std::span<const float>> question(static_cast<size_t>(group_heads));
  std::vector<std::span<const float>> keys(static_cast<size_t>(group_heads));
  std::vector<uint8_t> taken(static_cast<size_t>(pages));
  std::vector<float> score(static_cast<size_t>(pages));
  for (int first = 0; first < rows.query_heads(); first += group_heads) {
    for (int h = 0; h < group_heads; ++h) {
      question[static_cast<size_t>(h)] = rows.Row(first + h, &scratch[static_cast<size_t>(h)]);
      keys[static_cast<size_t>(h)] =
          key_rows.subspan(static_cast<size_t>(first + h) * width, width);
    }
    const std::vector<float> question_mean = GroupMean(question);
    std::vector<double> mass(static_cast<size_t>(pages), 0.0);
    double total = 0.0;
    for (int64_t p = span.first; p < span.end; ++p) {
      const int64_t end = std::min((p + 1) * page_size, tokens);
      for (int64_t t = std::max(p * page_size, span.sink_tokens); t < end; ++t) {
        mass[p] += question_mean[t];
      }
      total += mass[p];
    }
    std::fill(taken.begin(), taken.end(), 0);
    int64_t place = 0;
    const auto put = [&](int64_t page) {
      taken[page] = 1;
      score[page] = static_cast<float>(pages - place++);
    };
    if (total > 0.0) {
      double held = 0.0;
      const std::vector<float> question_pooled =
          MaxPool(question_mean, mix.question_kernel, mix.question_forward);
      for (const int64_t page : RankPages(question_pooled, page_size)) {
        if (page < span.first || page >= span.end) continue;
        put(page);
        held += mass[page];
        if (held >= mix.mass * total) break;
      }
    }
    for (const int64_t page : RankPages(PooledKeys(keys, mix.keys_kernel), page_size)) {
      if (taken[page] == 0) put(page);
    }
    for (int h = first; h < first + group_heads; ++h) {
      float* row = key_rows.data() + static_cast<size_t>(h) * width;
      for (int64_t t = 0; t < tokens; ++t) row[t] = score[t / page_size];
    }
  }
  return absl::OkStatus();
}

}  // namespace entrokv
