// A keys mix that orders pages rather than adding scores (KEYS_MIX_RULE_COVER): the question's
// pages first, until they hold a set share of its attention, then the pages the keys favour.
//
// Why: the question's rows and the keys' expected attention win different tasks. Where a
// group's question attention is spread thin, its pages are what the answer needs and they fill
// the quota; where it is concentrated on a few pages, those are kept and the rest of the quota
// goes to the keys' ranking (docs/decisions.md, "Statistics from the keys").
#ifndef ENTROKV_CORE_SCORING_COVER_MIX_H_
#define ENTROKV_CORE_SCORING_COVER_MIX_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/scoring/policy.h"
#include "core/scoring/statistic.h"

namespace entrokv {

struct CoverMix {
  // The share of the question's mass (over the pages a quota chooses among) that its first
  // pages must hold, in (0, 1].
  double mass = 0.5;
  // The neighbourhood max-pool widths (odd, in [1, kMaxNeighbourhoodKernel]) of the two
  // rankings: the question's rows, and the keys'.
  int question_kernel = 7;
  int keys_kernel = 3;
  // The question's pool looks forward: each token takes the maximum over itself and the
  // question_kernel - 1 tokens before it, so the tokens after one the question attends to (what
  // follows a key: its value) rank with it, and none before it do. Otherwise the pool is centred.
  bool question_forward = false;
  // The sink pages rank among the question's pages too, by the question's row over all their
  // tokens, with the sink tokens' mass left out of the share (as the entropy weights leave it
  // out): a needle on the sink page is then kept for the question, not only for the keys.
  // Otherwise the span starts past the sink pages, which only the keys' ranking orders.
  bool rank_sinks = false;
};

// INVALID_ARGUMENT naming the parameter as `prefix` followed by mass, question_kernel or
// keys_kernel (the wire's "keys_mix.cover_mass", for example).
[[nodiscard]] absl::Status ValidateCoverMix(absl::string_view prefix, const CoverMix& mix);

// A cover mix's page order survives a policy that pools a group's rows and takes page maxima,
// not one that pools tokens again (a neighbourhood_kernel above 1, snapkv), which would let a
// page take its neighbours' places: INVALID_ARGUMENT naming `field` for those.
[[nodiscard]] absl::Status ValidateCoverPolicy(absl::string_view field, const Policy& policy,
                                               const PolicyOptions& options);

// The pages of a layer whose question mass a cover mix counts: [first, end), past the sink
// pages and before the pages a policy keeps anyway at the end (the tail page and the newest
// protected ones), clipped to [0, pages). The mass of its first `sink_tokens` tokens counts for
// nothing: they lie before the span unless CoverMix::rank_sinks starts it at page 0.
struct CoverSpan {
  int64_t first = 0;
  int64_t end = 0;
  int64_t sink_tokens = 0;
};

// The span of a layer of `tokens` tokens under `options`: past its sink pages (SinkPageCount,
// protected or not: the sinks' attention is no question's need), before the newest pages its
// protections keep (the tail page, protect_recent_pages); its sink tokens are the first
// min(sink_tokens, tokens). REQUIRES: options valid.
[[nodiscard]] CoverSpan CoverSpanOf(const PolicyOptions& options, int64_t tokens);

// Per KV group (`group_heads` consecutive heads of `rows` and of key_rows, [heads][tokens]):
// the group's question row is the mean of its rows sent (MeanRows), max-pooled over
// question_kernel (NeighbourhoodPool; forward when mix.question_forward). Its keys' row is the
// mean of its key_rows each max-pooled (centred) over keys_kernel: the order in which a policy
// with that neighbourhood would rank the keys alone (expected attention alone's, for the
// default). Each row is projected onto pages of `page_size` tokens by their maximum, and each
// ranks the pages by that, ties to the lower page. The order is the question's ranking restricted
// to `span` until the pages taken hold at least `mix.mass` of the question row's mass in the span
// (summed in double; none when the span holds none), then every other page in the keys' ranking.
// With mix.rank_sinks the span starts at page 0 (the sink pages rank by all their tokens, their
// mass leaves out the first span.sink_tokens). Page p's score is the number of pages less its
// place in the order (exact in float32 below 2^24 pages), written on each of its tokens on every
// head of the group, over key_rows: a policy without a neighbourhood of its own then keeps the
// first pages of the order.
//
// INVALID_ARGUMENT naming the head and token of a sent value that is negative or not finite
// (ValidateValues), key_rows unchanged.
//
// REQUIRES: mix valid; group_heads >= 1 divides rows.query_heads(); key_rows.size() ==
// query_heads * tokens with values >= 0 and finite; page_size >= 1.
[[nodiscard]] absl::Status CoverThenFill(const StatisticView& rows, const CoverMix& mix,
                                         int group_heads, int page_size, CoverSpan span,
                                         std::span<float> key_rows);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_COVER_MIX_H_
