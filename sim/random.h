// A seeded random source whose draws are the same on every standard library: std::mt19937_64
// is specified bit for bit, but std::*_distribution are not, so the few distributions the
// simulator needs are written here.
#ifndef ENTROKV_SIM_RANDOM_H_
#define ENTROKV_SIM_RANDOM_H_

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>

namespace entrokv::sim {

// Mixes several integers into one well-spread seed (splitmix64 steps), so that every
// (seed, layer, head, ...) tuple gets an independent stream.
[[nodiscard]] uint64_t MixSeed(std::initializer_list<uint64_t> parts);

// Not thread-safe; cheap to create, one per stream.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // Uniform in [0, 1) with 53 random bits.
  [[nodiscard]] double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  // Uniform in [lo, hi).
  [[nodiscard]] double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n). REQUIRES: n > 0. The modulo bias is below 2^-40 for the sizes
  // used here, which does not matter for a workload generator.
  [[nodiscard]] int64_t UniformInt(int64_t n) {
    return static_cast<int64_t>(engine_() % static_cast<uint64_t>(n));
  }
  // Standard normal by Box-Muller (the second value of each pair is kept for the next call).
  [[nodiscard]] double Normal();
  // Exponential with mean 1.
  [[nodiscard]] double Exponential() { return -std::log1p(-Uniform()); }

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace entrokv::sim

#endif  // ENTROKV_SIM_RANDOM_H_
