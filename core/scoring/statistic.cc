#include "core/scoring/statistic.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace entrokv {

absl::StatusOr<StatisticView> StatisticView::Create(const void* data, DType dtype, int query_heads,
                                                    int64_t tokens) {
  if (data == nullptr) return absl::InvalidArgumentError("statistic: no data");
  if (query_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("statistic: query_heads must be positive, got ", query_heads));
  }
  if (tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("statistic: tokens must be positive, got ", tokens));
  }
  return StatisticView(data, dtype, query_heads, tokens);
}

std::span<const float> StatisticView::Row(int head, std::vector<float>* scratch) const {
  const int64_t offset = static_cast<int64_t>(head) * tokens_;
  if (dtype_ == DType::kFloat32) {
    return {static_cast<const float*>(data_) + offset, static_cast<size_t>(tokens_)};
  }
  scratch->resize(static_cast<size_t>(tokens_));
  WidenToFloat(static_cast<const uint16_t*>(data_) + offset, dtype_, tokens_, scratch->data());
  return *scratch;
}

absl::Status StatisticView::ValidateValues() const {
  std::vector<float> scratch;
  for (int h = 0; h < query_heads_; ++h) {
    const std::span<const float> row = Row(h, &scratch);
    for (int64_t t = 0; t < tokens_; ++t) {
      const float value = row[static_cast<size_t>(t)];
      // One comparison catches NaN, infinities and negatives together.
      if (!(value >= 0.0f && value < INFINITY)) {
        return absl::InvalidArgumentError(
            absl::StrCat("statistic: value at head ", h, ", token ", t, " is ", value,
                         "; entries must be finite and non-negative"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> AddChunk(const StatisticView& chunk,
                                            std::span<const float> running) {
  const int heads = chunk.query_heads();
  const int64_t tokens = chunk.tokens();
  if (running.size() % static_cast<size_t>(heads) != 0 ||
      static_cast<int64_t>(running.size() / static_cast<size_t>(heads)) > tokens) {
    return absl::FailedPreconditionError(absl::StrCat("running sum of ", running.size(),
                                                      " values does not fit ", heads,
                                                      " heads x at most ", tokens, " tokens"));
  }
  if (absl::Status valid = chunk.ValidateValues(); !valid.ok()) return valid;
  const int64_t covered = static_cast<int64_t>(running.size() / static_cast<size_t>(heads));
  std::vector<float> sum(static_cast<size_t>(heads * tokens));
  std::vector<float> scratch;
  for (int h = 0; h < heads; ++h) {
    const std::span<const float> row = chunk.Row(h, &scratch);
    float* out = sum.data() + static_cast<int64_t>(h) * tokens;
    const float* before = running.data() + static_cast<int64_t>(h) * covered;
    for (int64_t t = 0; t < covered; ++t) out[t] = before[t] + row[static_cast<size_t>(t)];
    for (int64_t t = covered; t < tokens; ++t) out[t] = row[static_cast<size_t>(t)];
  }
  return sum;
}

absl::Status MixRows(const StatisticView& rows, double keys_weight, MixRule rule,
                     std::span<float> key_rows) {
  if (absl::Status valid = rows.ValidateValues(); !valid.ok()) return valid;
  const auto tokens = static_cast<size_t>(rows.tokens());
  std::vector<float> scratch;
  const auto scale = [](std::span<const float> row, double weight) {
    double total = 0.0;
    for (const float value : row) total += value;
    return total > 0.0 ? weight / total : 0.0;
  };
  for (int h = 0; h < rows.query_heads(); ++h) {
    const std::span<const float> sent = rows.Row(h, &scratch);
    const std::span<float> keys = key_rows.subspan(static_cast<size_t>(h) * tokens, tokens);
    const double sent_scale = scale(sent, 1.0 - keys_weight);
    const double keys_scale = scale(keys, keys_weight);
    for (size_t t = 0; t < tokens; ++t) {
      const double from_keys = keys_scale * keys[t];
      const double from_sent = sent_scale * sent[t];
      keys[t] = static_cast<float>(rule == MixRule::kMax ? std::max(from_keys, from_sent)
                                                         : from_keys + from_sent);
    }
  }
  return absl::OkStatus();
}

}  // namespace entrokv
