// Query-agnostic token scores from the keys alone: no question, no attention. What a decision
// ranks by when its statistic is the daemon's own reading of the keys already in the pool's
// frames (the context decided before any question is known). One score per (KV group, token):
// a key belongs to a KV head, so no union over the group's query heads arises.
//
//   keydiff  keys that differ from the group's average key direction are kept (KeyDiff). With
//            u_t = k_t / |k_t| and the anchor a = mean of u_t over the tokens present,
//            score_t = 1 - cos(k_t, a), in [0, 2]; 1 when k_t or a is zero.
//   norm     keys of small norm are kept (KNorm): score_t = 1 / (1 + |k_t|), in (0, 1].
//
// ScoreExpectedAttention, below, scores a group's keys for one query head from the statistics
// of the queries expected next: query-agnostic too (no question), but one row per query head.
//
// Both are non-negative, as a statistic must be, and order tokens as the published scores do
// (-cos, -|k|), so a pooling policy's page maxima rank pages by them.
#ifndef ENTROKV_CORE_SCORING_KEY_SCORES_H_
#define ENTROKV_CORE_SCORING_KEY_SCORES_H_

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace entrokv {

enum class KeyScore : uint8_t { kKeyDiff, kNorm };

// "keydiff" or "norm"; INVALID_ARGUMENT naming the value otherwise.
[[nodiscard]] absl::StatusOr<KeyScore> ParseKeyScore(absl::string_view name);
[[nodiscard]] absl::string_view KeyScoreName(KeyScore score);

// One KV group's scores. keys: [tokens][head_dim]; present[t] == 0 for a token whose key is
// gone (its page evicted): score 0, and not part of the anchor. out: [tokens]. A key's norm and
// dot product are summed in float, the anchor over the tokens in double.
// REQUIRES: head_dim >= 1, keys.size() == present.size() * head_dim == out.size() * head_dim.
void ScoreKeys(KeyScore score, std::span<const float> keys, int head_dim,
               std::span<const uint8_t> present, std::span<float> out);

// The attention one query head is expected to pay each of its group's keys (Expected
// Attention): for queries expected next with mean m and covariance S (RoPE applied as those
// positions would), E[exp(q . k / sqrt(d))] = exp(m . k / sqrt(d) + k' S k / (2 d)) for Gaussian
// q; out[t] is that normalised over the tokens present (a softmax of the exponents), 0 for a
// token whose key is gone. `covariance` empty: the mean alone. With factor_rank p > 0,
// `covariance` is a factor F [p][head_dim] of S = F'F instead, and k'Sk = |F k|^2 costs
// p * head_dim per token rather than head_dim^2 (a low-rank covariance: its p largest
// directions). Dot products in float, the exponents and the normalisation in double.
// REQUIRES: head_dim >= 1, keys.size() == present.size() * head_dim == out.size() * head_dim,
// mean.size() == head_dim, covariance.size() 0 or (factor_rank > 0 ? factor_rank : head_dim) *
// head_dim, 0 <= factor_rank <= head_dim, every value finite.
void ScoreExpectedAttention(std::span<const float> keys, int head_dim,
                            std::span<const uint8_t> present, std::span<const float> mean,
                            std::span<const float> covariance, std::span<float> out,
                            int factor_rank = 0);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_KEY_SCORES_H_
