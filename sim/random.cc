#include "sim/random.h"

#include <numbers>

namespace entrokv::sim {

uint64_t MixSeed(std::initializer_list<uint64_t> parts) {
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  for (const uint64_t part : parts) {
    state += part + 0x9e3779b97f4a7c15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    state = z ^ (z >> 31);
  }
  return state;
}

double Rng::Normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // 1 - U is in (0, 1], so the log is finite.
  const double radius = std::sqrt(-2.0 * std::log(1.0 - Uniform()));
  const double angle = 2.0 * std::numbers::pi * Uniform();
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

}  // namespace entrokv::sim
