// Seeded random and adversarial statistics for property tests. Deterministic across platforms:
// built on std::mt19937_64 only, not on std:: distributions.
#ifndef ENTROKV_CORE_TESTING_RANDOM_ROWS_H_
#define ENTROKV_CORE_TESTING_RANDOM_ROWS_H_

#include <cstdint>
#include <random>
#include <vector>

namespace entrokv::testing {

// Uniform in [0, 1).
inline double Uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
}

// A [heads, tokens] statistic whose rows mix shapes real heads show: spiky, diffuse, sink-heavy,
// all-zero, and rows with many exact ties (values quantised to a few levels).
inline std::vector<float> MixedRows(int heads, int64_t tokens, std::mt19937_64& rng) {
  std::vector<float> rows(static_cast<size_t>(heads * tokens), 0.0f);
  for (int h = 0; h < heads; ++h) {
    float* row = rows.data() + h * tokens;
    const int shape = static_cast<int>(rng() % 6);
    for (int64_t t = 0; t < tokens; ++t) {
      double value = 0.0;
      switch (shape) {
        case 0:  // diffuse
          value = Uniform01(rng);
          break;
        case 1:  // spiky: a few large entries
          value = Uniform01(rng) < 0.02 ? 10.0 * Uniform01(rng) : 0.01 * Uniform01(rng);
          break;
        case 2:  // sink-heavy
          value = t < 4 ? 50.0 : Uniform01(rng);
          break;
        case 3:  // all zero
          value = 0.0;
          break;
        case 4:  // ties: four levels only
          value = static_cast<double>(rng() % 4);
          break;
        default:  // all mass on the sinks
          value = t < 4 ? 1.0 : 0.0;
          break;
      }
      row[t] = static_cast<float>(value);
    }
  }
  return rows;
}

}  // namespace entrokv::testing

#endif  // ENTROKV_CORE_TESTING_RANDOM_ROWS_H_
