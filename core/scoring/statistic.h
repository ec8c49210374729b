// A read-only view of one layer's attention statistic S[h][t], shape [query_heads, tokens].
#ifndef ENTROKV_CORE_SCORING_STATISTIC_H_
#define ENTROKV_CORE_SCORING_STATISTIC_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/util/dtype.h"

namespace entrokv {

// What the worker measured (docs/architecture.md §3.1). Scoring treats all kinds alike; the kind is
// carried so that reports and policies (h2o expects ACCUMULATED) can say what they were given.
enum class StatisticKind : uint8_t { kLastRow, kWindowMean, kAccumulated };

// Does not own the memory; the caller keeps it alive while the view is used. Row-major, rows
// contiguous. Copyable and thread-compatible (reads only).
class StatisticView {
 public:
  // REQUIRES: data points at query_heads * tokens elements of dtype. Checks the shape only;
  // ValidateValues checks the contents.
  [[nodiscard]] static absl::StatusOr<StatisticView> Create(const void* data, DType dtype,
                                                            int query_heads, int64_t tokens);

  [[nodiscard]] int query_heads() const { return query_heads_; }
  [[nodiscard]] int64_t tokens() const { return tokens_; }
  [[nodiscard]] DType dtype() const { return dtype_; }
  [[nodiscard]] const void* data() const { return data_; }

  // Row h as float32: a view of the caller's memory for float32 (no copy); otherwise widened
  // into *scratch, which the returned span then points into.
  [[nodiscard]] std::span<const float> Row(int head, std::vector<float>* scratch) const;

  // INVALID_ARGUMENT naming the first head and token that is negative or not finite.
  [[nodiscard]] absl::Status ValidateValues() const;

 private:
  StatisticView(const void* data, DType dtype, int query_heads, int64_t tokens)
      : data_(data), dtype_(dtype), query_heads_(query_heads), tokens_(tokens) {}

  const void* data_;
  DType dtype_;
  int query_heads_;
  int64_t tokens_;
};

// Chunked prefill: a chunk's ACCUMULATED statistic (the column sums of the chunk's queries over
// every key so far, query_heads x T) added to the running sum of the chunks before it
// (`running`: query_heads rows of running.size() / query_heads <= T tokens; later tokens' columns
// count 0). Returns the new running sum, query_heads x T float32, what a decision after this
// chunk scores. INVALID_ARGUMENT naming the head and token of a chunk value that is negative or
// not finite (ValidateValues); FAILED_PRECONDITION when `running` is not whole rows of at most
// T tokens. Float32 sums: a column of a 2^20-query prompt is exact to about 1e-7 relative.
[[nodiscard]] absl::StatusOr<std::vector<float>> AddChunk(const StatisticView& chunk,
                                                          std::span<const float> running);

// How a keys mix combines each head's two rows once each is scaled to sum to its share.
enum class MixRule {
  kAverage,  // each token's weighted sum of its two scores
  kMax,      // each token's larger score: what either row ranks high is kept (a union)
};

// Sent rows mixed with the keys' scores (a keys mix): each head's row of `rows` and its row of
// `key_rows` ([query_heads][tokens] float32), each scaled to sum to its share (in double;
// `keys_weight` on the keys' row, 1 - keys_weight on the sent one; a row of zeros adds
// nothing), combined by `rule`, written over key_rows.
// INVALID_ARGUMENT naming the head and token of a sent value that is negative or not finite
// (ValidateValues), key_rows unchanged.
// REQUIRES: key_rows.size() == query_heads * tokens, key_rows' values >= 0 and finite,
// keys_weight in (0, 1).
[[nodiscard]] absl::Status MixRows(const StatisticView& rows, double keys_weight, MixRule rule,
                                   std::span<float> key_rows);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_STATISTIC_H_
