#include "core/scoring/entropy.h"

#include <algorithm>
#include <cmath>

namespace entrokv {
bool IsOnePassOrder(double alpha) { return alpha == 2.0 || alpha == 1.0 || std::isinf(alpha); }

namespace {

// One value into its lane, with the reference's operations for the order.
inline void AddToLane(double alpha, float value, double& total, double& power) {
  const double x = value;
  total += x;
  if (alpha == 2.0) {
    power += x * x;
  } else if (alpha == 1.0) {
    if (x > 0.0) power += x * std::log(x);
  } else {
    power = std::max(power, x);
  }
}

// A whole stripe of kEntropyLanes values, lane k getting values[k]: independent lanes, so the
// compiler vectorises it along tokens (no FMA is enabled: the products round as written).
template <int kOrder>  // 2: alpha 2; 0: alpha inf
void AddStripe(const float* values, double* total, double* power) {
  for (int k = 0; k < kEntropyLanes; ++k) {
    const double x = values[k];
    total[k] += x;
    if constexpr (kOrder == 2) {
      power[k] += x * x;
    } else {
      power[k] = power[k] < x ? x : power[k];  // std::max(power, x)
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
template <int kOrder>
__attribute__((target("avx2"))) void AddStripeAvx2(const float* values, double* total,
                                                   double* power) {
  AddStripe<kOrder>(values, total, power);
}
bool HaveAvx2ForStripes() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}
#endif

}  // namespace

void AccumulateEntropyLanes(std::span<const float> values, double alpha, EntropyLanes* lanes) {
  double* total = lanes->total.data();
  double* power = lanes->power.data();
  const int64_t count = static_cast<int64_t>(values.size());
  int lane = static_cast<int>(lanes->count % kEntropyLanes);
  int64_t i = 0;
  for (; i < count && lane != 0; ++i, lane = (lane + 1) % kEntropyLanes) {
    AddToLane(alpha, values[static_cast<size_t>(i)], total[lane], power[lane]);
  }
  if (alpha == 2.0 || std::isinf(alpha)) {
    void (*stripe)(const float*, double*, double*) = alpha == 2.0 ? &AddStripe<2> : &AddStripe<0>;
#if defined(__x86_64__) && defined(__GNUC__)
    if (HaveAvx2ForStripes()) stripe = alpha == 2.0 ? &AddStripeAvx2<2> : &AddStripeAvx2<0>;
#endif
    for (; i + kEntropyLanes <= count; i += kEntropyLanes) stripe(values.data() + i, total, power);
  }
  for (; i < count; ++i, lane = (lane + 1) % kEntropyLanes) {
    AddToLane(alpha, values[static_cast<size_t>(i)], total[lane], power[lane]);
  }
  lanes->count += count;
}

EntropySums FoldEntropyLanes(const EntropyLanes& lanes, double alpha) {
  std::array<double, kEntropyLanes> total = lanes.total;
  std::array<double, kEntropyLanes> power = lanes.power;
  const bool max_power = std::isinf(alpha);
  for (int width = kEntropyLanes / 2; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k) {
      total[k] += total[k + width];
      power[k] = max_power ? std::max(power[k], power[k + width]) : power[k] + power[k + width];
    }
  }
  return EntropySums{.total = total[0], .power = power[0]};
}

EntropySums EntropySumsOf(std::span<const float> values, double alpha) {
  EntropyLanes lanes;
  AccumulateEntropyLanes(values, alpha, &lanes);
  return FoldEntropyLanes(lanes, alpha);
}

double EntropyFromSums(const EntropySums& sums, double alpha, int64_t support) {
  // The CUDA scorer computes the same function on the device (portable_math.h).
  return portable::EntropyOfSums<portable::HostArithmetic>(sums.total, sums.power, alpha, support);
}

double SinkIsolatedEntropy(std::span<const float> row, int sink_tokens, double alpha) {
  const size_t sinks = std::min(static_cast<size_t>(std::max(sink_tokens, 0)), row.size());
  const std::span<const float> rest = row.subspan(sinks);
  const auto support = static_cast<int64_t>(rest.size());
  if (IsOnePassOrder(alpha)) {
    return EntropyFromSums(EntropySumsOf(rest, alpha), alpha, support);
  }
  // General order: normalise first so that x^alpha can neither overflow nor underflow as a
  // whole (rows of accumulated statistics may sum far above 1).
  double total = 0.0;
  for (const float value : rest) total += value;
  if (!(total > 0.0)) return portable::DegenerateEntropy<portable::HostArithmetic>(support);
  double power_sum = 0.0;
  for (const float value : rest) {
    if (value > 0.0f) power_sum += std::pow(value / total, alpha);
  }
  return std::log(power_sum + kEntropyLogGuard) / (1.0 - alpha);
}

}  // namespace entrokv
