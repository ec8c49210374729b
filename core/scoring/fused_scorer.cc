// Why the fused path gives the reference's bits:
//  - Entropy sums: every head's sums go through the shared striped lanes (entropy.h), chunk by
//    chunk; EntropyFromSums and EntropyWeights are shared.
//  - Pooling: each token's pooled value is a double that starts at +0 and adds w_h * x_h (or x_h
//    for the mean, scaled once at the end) head by head in head order, then is rounded to float
//    once, as PoolRows and MeanRows do; only the loop order over tokens changes (chunk by chunk,
//    the pooled chunk stays in L1), never the operations on one token.
//  - Page maxima: the pooled values hold no NaN and no -0 (validated inputs, sums from +0), so
//    the maximum is the same value whatever the order in which it is taken.
//  - Selection: a page's key is its score's bits (ordered as the scores, which are >= 0), with
//    bit 31 set for protected pages; the protected pages and then the pages the reference order
//    (score desc, index asc) ranks first are the pages above the K-th key plus the first pages
//    in page order equal to it. A radix select finds the K-th key and how many of its equals
//    are kept; one scan in page order emits the kept pages already ascending.
//  - Neighbourhood pooling: each head's chunk is pooled by the shared NeighbourhoodPool from the
//    chunk's tokens and kernel / 2 either side, which is every token its windows hold, and the
//    group's pooling then takes those rows as PoolRows, MeanRows or the max take the reference's.
//  - Measure: each head's page maxima are taken from the rows pass 2 reads (order-independent;
//    a row may hold -0, but a page maximum of -0 or +0 gives the same key); the shadow is the same
//    key selection without protections; the head-mean row is computed beside the pooled row from
//    the same loads with MeanRows' operations per token; its page sums and the retained mass use
//    the shared PageSums and RetainedMassFromPageSums (metrics.h).
#include "core/scoring/fused_scorer.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/scoring/entropy.h"
#include "core/scoring/fused_kernels.h"
#include "core/scoring/group_finish.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/metrics.h"
#include "core/scoring/pages.h"
#include "core/scoring/radix_select.h"
#include "core/scoring/selection.h"
#include "core/scoring/weights.h"
#include "core/util/status_macros.h"

namespace entrokv {
namespace {

using fused::PageMaximaOf;
using fused::PoolOp;
using fused::PoolRowsChunk;

// Tokens per chunk of the pooled row: whole pages, about 8 KiB of floats.
int64_t ChunkTokens(int page_size) {
  return static_cast<int64_t>(page_size) * std::max<int64_t>(1, 2048 / page_size);
}

}  // namespace

bool IsFusedPolicy(const Policy& policy) {
  const PoolingKind kind = policy.pooling().kind;
  return kind == PoolingKind::kEntropyWeighted || kind == PoolingKind::kMean ||
         kind == PoolingKind::kMax;
}

const float* FusedScorer::Tokens(const LayerRequest& request, int head, int64_t first,
                                 int64_t count, float* buffer) const {
  const StatisticView& statistic = *request.statistic;
  const int64_t offset = static_cast<int64_t>(head) * statistic.tokens() + first;
  if (statistic.dtype() == DType::kFloat32) {
    return static_cast<const float*>(statistic.data()) + offset;
  }
  WidenToFloat(static_cast<const uint16_t*>(statistic.data()) + offset, statistic.dtype(), count,
               buffer);
  return buffer;
}

bool FusedScorer::DecideGroup(const Policy& policy, const LayerRequest& request, int group,
                              GroupDecision* decision) {
  const Pooling pooling = policy.pooling();
  const int r = request.query_heads / request.kv_groups;
  const int first_head = group * r;
  const int64_t tokens = request.tokens;
  const int page_size = options_.page_size;
  const int64_t chunk = ChunkTokens(page_size);
  // Neighbourhood pooling reads each chunk with kernel / 2 tokens either side.
  const int kernel = options_.neighbourhood_kernel;
  const int64_t half = kernel / 2;
  const auto reach = static_cast<size_t>(chunk + 2 * half);
  const bool widen = request.statistic->dtype() != DType::kFloat32;
  if (widen) widened_.resize(reach * static_cast<size_t>(r));
  auto buffer = [&](int i) {
    return widen ? widened_.data() + static_cast<size_t>(i) * reach : nullptr;
  };

  // Weights (pass 1 for the entropy policies).
  std::vector<double>& weights = decision->weights;
  if (pooling.kind == PoolingKind::kMean) {
    weights.assign(static_cast<size_t>(r), MeanScale(static_cast<size_t>(r)));
  } else if (pooling.kind == PoolingKind::kEntropyWeighted) {
    if (!request.cached_weights.empty()) {
      const auto cached =
          request.cached_weights.subspan(static_cast<size_t>(first_head), static_cast<size_t>(r));
      weights.assign(cached.begin(), cached.end());
    } else {
      const int64_t sinks =
          std::min<int64_t>(pooling.isolate_sinks ? options_.sink_tokens : 0, tokens);
      decision->entropies.resize(static_cast<size_t>(r));
      if (IsOnePassOrder(options_.alpha)) {
        lanes_.assign(static_cast<size_t>(r), EntropyLanes{});
        for (int64_t first = sinks; first < tokens; first += chunk) {
          const int64_t count = std::min(chunk, tokens - first);
          for (int i = 0; i < r; ++i) {
            const float* row = Tokens(request, first_head + i, first, count, buffer(i));
            AccumulateEntropyLanes(std::span<const float>(row, static_cast<size_t>(count)),
                                   options_.alpha, &lanes_[static_cast<size_t>(i)]);
          }
        }
        for (int i = 0; i < r; ++i) {
          decision->entropies[static_cast<size_t>(i)] =
              EntropyFromSums(FoldEntropyLanes(lanes_[static_cast<size_t>(i)], options_.alpha),
                              options_.alpha, tokens - sinks);
        }
      } else {
        // The general order reads each row twice (normalise, then powers): the shared function.
        std::vector<float> row_buffer;
        for (int i = 0; i < r; ++i) {
          const std::span<const float> row = request.statistic->Row(first_head + i, &row_buffer);
          decision->entropies[static_cast<size_t>(i)] =
              SinkIsolatedEntropy(row, static_cast<int>(sinks), options_.alpha);
        }
      }
      weights = EntropyWeights(decision->entropies, options_.tau);
    }
  }

  // Pass 2: pooled page maxima, chunk by chunk, validating every value on the way.
  const int64_t pages = PageCount(tokens, page_size);
  page_max_.resize(static_cast<size_t>(pages));
  pooled_.resize(static_cast<size_t>(chunk));
  row_pointers_.resize(static_cast<size_t>(r));
  // With `measure`, the same pass also gives each head's page maxima and the page sums of the
  // head-mean row, which MeasureGroup builds with MeanRows, computed by the pooling kernel from
  // the same loads.
  const bool measure = request.measure;
  const PoolOp op = pooling.kind == PoolingKind::kMax    ? PoolOp::kMax
                    : pooling.kind == PoolingKind::kMean ? PoolOp::kMean
                                                         : PoolOp::kWeighted;
  // With neighbourhood pooling the pooled row is of the pooled rows, and the head-mean row (of
  // the raw rows, as MeasureGroup's) is computed on its own, validating the raw values.
  const bool neighbourhood = kernel > 1;
  const bool mean_is_pooled = op == PoolOp::kMean && !neighbourhood;
  if (measure) {
    head_max_.resize(static_cast<size_t>(r) * static_cast<size_t>(pages));
    page_sums_.resize(static_cast<size_t>(pages));
  }
  if ((measure && !mean_is_pooled) || neighbourhood) mean_.resize(static_cast<size_t>(chunk));
  if (neighbourhood) {
    neighbourhood_.resize(static_cast<size_t>(chunk) * static_cast<size_t>(r));
    neighbourhood_pointers_.resize(static_cast<size_t>(r));
  }
  const double scale = MeanScale(static_cast<size_t>(r));
  bool ok = true;
  // Backwards, chunk by chunk: the end of the rows, read last by pass 1, is still in L2. Each
  // chunk holds whole pages and each token's arithmetic is the same in any chunk order.
  const int64_t last_chunk_first = (tokens - 1) / chunk * chunk;
  for (int64_t first = last_chunk_first; first >= 0; first -= chunk) {
    const int64_t count = std::min(chunk, tokens - first);
    float* pooled = pooled_.data();
    if (!neighbourhood) {
      for (int i = 0; i < r; ++i) {
        row_pointers_[static_cast<size_t>(i)] =
            Tokens(request, first_head + i, first, count, buffer(i));
      }
      // For mean and h2o the pooled row is the head-mean row already.
      float* mean = measure && !mean_is_pooled ? mean_.data() : nullptr;
      ok &= PoolRowsChunk(op, row_pointers_.data(), weights.data(), r, count, pooled, scale, mean);
    } else {
      const int64_t begin = std::max<int64_t>(first - half, 0);
      const int64_t end = std::min(first + count + half, tokens);
      for (int i = 0; i < r; ++i) {
        const float* slice = Tokens(request, first_head + i, begin, end - begin, buffer(i));
        row_pointers_[static_cast<size_t>(i)] = slice + (first - begin);
        float* out = neighbourhood_.data() + static_cast<size_t>(i) * static_cast<size_t>(chunk);
        NeighbourhoodPool(std::span<const float>(slice, static_cast<size_t>(end - begin)), begin,
                          tokens, first, kernel, options_.neighbourhood,
                          std::span<float>(out, static_cast<size_t>(count)));
        neighbourhood_pointers_[static_cast<size_t>(i)] = out;
      }
      // The raw rows' validation, with their head-mean row when measuring (the max over the
      // heads, in float, validates as well and costs less otherwise).
      ok &= PoolRowsChunk(measure ? PoolOp::kMean : PoolOp::kMax, row_pointers_.data(),
                          weights.data(), r, count, mean_.data(), scale, nullptr);
      (void)PoolRowsChunk(op, neighbourhood_pointers_.data(), weights.data(), r, count, pooled,
                          scale, nullptr);
    }
    const int64_t first_page = first / page_size;
    PageMaximaOf(pooled, count, page_size, page_max_.data() + first_page);
    if (measure) {
      const int64_t chunk_pages = PageCount(count, page_size);
      for (int i = 0; i < r; ++i) {
        const float* row = row_pointers_[static_cast<size_t>(i)];
        float* maxima =
            head_max_.data() + static_cast<size_t>(i) * static_cast<size_t>(pages) + first_page;
        PageMaximaOf(row, count, page_size, maxima);
      }
      const float* mean = mean_is_pooled ? pooled : mean_.data();
      PageSums(std::span<const float>(mean, static_cast<size_t>(count)), page_size,
               std::span<double>(page_sums_.data() + first_page, static_cast<size_t>(chunk_pages)));
    }
  }
  if (!ok) return false;
  const auto n = static_cast<size_t>(pages);
  GroupScores scores;
  scores.page_max = std::span<const float>(page_max_.data(), n);
  if (measure) {
    scores.head_max = std::span<const float>(head_max_.data(), static_cast<size_t>(r) * n);
    scores.page_sums = std::span<const double>(page_sums_.data(), n);
  }
  finisher_.Finish(options_, request, group, r, scores, decision);
  return true;
}

absl::StatusOr<LayerDecision> FusedScorer::DecideLayer(const Policy& policy,
                                                       const LayerRequest& request) {
  if (!IsFusedPolicy(policy)) return entrokv::DecideLayer(policy, options_, request);
  RETURN_IF_ERROR(ValidateLayerRequest(policy, options_, request, /*check_values=*/false));
  LayerDecision decision;
  decision.page_count = PageCount(request.tokens, options_.page_size);
  decision.quota_pages = request.quota_pages;
  decision.groups.resize(static_cast<size_t>(request.kv_groups));
  const bool per_layer = SelectsPerLayer(options_, request);
  const auto pages = static_cast<size_t>(decision.page_count);
  const auto groups = static_cast<size_t>(request.kv_groups);
  if (per_layer) {
    layer_scores_.resize(groups * pages);
    if (request.measure) layer_page_sums_.resize(groups * pages);
  }
  for (int g = 0; g < request.kv_groups; ++g) {
    RETURN_IF_ERROR(CheckCancelled(request, g));
    if (!DecideGroup(policy, request, g, &decision.groups[static_cast<size_t>(g)])) {
      RETURN_IF_ERROR(request.statistic->ValidateValues());
      return absl::InternalError("statistic: fused validation disagrees with ValidateValues");
    }
    if (per_layer) {  // the group's page scores (and page sums) outlive the next group
      const size_t at = static_cast<size_t>(g) * pages;
      std::copy(page_max_.begin(), page_max_.begin() + static_cast<ptrdiff_t>(pages),
                layer_scores_.begin() + static_cast<ptrdiff_t>(at));
      if (request.measure) {
        std::copy(page_sums_.begin(), page_sums_.begin() + static_cast<ptrdiff_t>(pages),
                  layer_page_sums_.begin() + static_cast<ptrdiff_t>(at));
      }
    }
  }
  GroupFinisher::FinishLayer(options_, request, layer_scores_, layer_page_sums_, &decision);
  return decision;
}

absl::StatusOr<std::vector<LayerDecision>> DecideModel(const Policy& policy,
                                                       const PolicyOptions& options,
                                                       std::span<const LayerRequest> requests,
                                                       int threads) {
  std::vector<std::optional<absl::StatusOr<LayerDecision>>> results(requests.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    FusedScorer scorer(options);
    for (size_t l = next.fetch_add(1); l < requests.size(); l = next.fetch_add(1)) {
      results[l] = scorer.DecideLayer(policy, requests[l]);
    }
  };
  const int workers = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), requests.size()));
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(workers));
    for (int i = 0; i < workers; ++i) pool.emplace_back(work);
    for (std::thread& thread : pool) thread.join();
  }
  return InLayerOrder(results);
}

absl::StatusOr<std::vector<LayerDecision>> InLayerOrder(
    std::vector<std::optional<absl::StatusOr<LayerDecision>>>& results) {
  std::vector<LayerDecision> decisions;
  decisions.reserve(results.size());
  for (auto& result : results) {
    if (!result->ok()) return result->status();
    decisions.push_back(*std::move(*result));
  }
  return decisions;
}

}  // namespace entrokv
