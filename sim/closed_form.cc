#include "sim/closed_form.h"

#include <cmath>
#include <limits>
#include <span>

#include "core/scoring/entropy.h"
#include "core/scoring/metrics.h"
#include "core/scoring/weights.h"

namespace entrokv::sim {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

ClosedFormRow SingleGroup(int64_t tokens, int r, double tau, int sink_tokens) {
  // Head 0 holds the needle at the middle token; its residual and the siblings are uniform.
  const auto size = static_cast<size_t>(tokens);
  const int64_t needle = tokens / 2;
  std::vector<std::vector<float>> rows(static_cast<size_t>(r),
                                       std::vector<float>(size, static_cast<float>(1.0 / tokens)));
  std::fill(rows[0].begin(), rows[0].end(),
            static_cast<float>((1.0 - kNeedleMass) / static_cast<double>(tokens - 1)));
  rows[0][static_cast<size_t>(needle)] = static_cast<float>(kNeedleMass);
  std::vector<std::span<const float>> views(rows.begin(), rows.end());
  std::vector<double> entropies;
  for (const auto row : views) entropies.push_back(SinkIsolatedEntropy(row, sink_tokens, 2.0));
  std::vector<float> pooled(size);
  PoolRows(views, EntropyWeights(entropies, tau), pooled);
  double mean = 0.0;
  for (const auto row : views) mean += row[static_cast<size_t>(needle)];

  ClosedFormRow out;
  out.check = "single_group";
  out.tokens = tokens;
  out.r = r;
  out.eta = entropies[0];
  out.delta = NeedleBoundDelta(tokens, r, tau, out.eta, kNeedleMass, sink_tokens);
  out.pooled_bound = kNeedleMass - out.delta;
  out.pooled_measured = pooled[static_cast<size_t>(needle)];
  out.mean_closed = MeanPooledNeedle(tokens, r, kNeedleMass);
  out.mean_measured = mean / r;
  return out;
}

}  // namespace

std::vector<ClosedFormRow> ClosedFormChecks(double tau, int sink_tokens) {
  std::vector<ClosedFormRow> rows;
  for (int64_t tokens = 4096; tokens <= 131072; tokens *= 2) {
    ClosedFormRow row;
    row.check = "paper_table";
    row.tokens = tokens;
    row.r = 8;
    row.eta = std::log(2.0);
    row.delta = NeedleBoundDelta(tokens, 8, 0.5, row.eta, kNeedleMass, 4);
    row.pooled_bound = kNeedleMass - row.delta;
    row.pooled_measured = kNaN;
    // The paper's mean column is the T -> infinity value (1 - eps) / r.
    row.mean_closed = kNeedleMass / 8.0;
    row.mean_measured = kNaN;
    rows.push_back(row);
  }
  for (const int r : {6, 8}) {
    for (int64_t tokens = 1024; tokens <= 131072; tokens *= 2) {
      rows.push_back(SingleGroup(tokens, r, tau, sink_tokens));
    }
  }
  return rows;
}

}  // namespace entrokv::sim
