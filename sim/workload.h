// Synthetic per-layer, per-head attention statistics built from the head archetypes real models
// show (sink, local, diffuse, heavy-hitter, retrieval), with needles at known positions.
#ifndef ENTROKV_SIM_WORKLOAD_H_
#define ENTROKV_SIM_WORKLOAD_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/scoring/statistic.h"
#include "sim/presets.h"

namespace entrokv::sim {

enum class HeadArchetype : uint8_t {
  kSink,         // most mass on the first tokens, near-uniform residual
  kLocal,        // mass decaying with distance from the end
  kDiffuse,      // near-uniform with noise
  kHeavyHitter,  // a few tokens (partly shared across heads) carry most of the mass
  kRetrieval,    // most mass on one needle span
};
inline constexpr int kArchetypeCount = 5;
[[nodiscard]] absl::string_view ArchetypeName(HeadArchetype archetype);

// A needle: tokens [begin, end) planted at `depth` (0 = first non-sink token, 1 = the end).
struct NeedleSpan {
  int64_t begin = 0;
  int64_t end = 0;
  double depth = 0.0;
};

struct WorkloadOptions {
  int64_t tokens = 8192;  // T
  uint64_t seed = 1;
  StatisticKind kind = StatisticKind::kLastRow;
  std::vector<double> needle_depths = {0.1, 0.3, 0.5, 0.7, 0.9};  // each in [0, 1]
  int needle_tokens = 16;                                         // length of every needle span
  int sink_tokens = 4;  // where sink heads put their mass; needles start after them
  int window = 16;      // W of WINDOW_MEAN
  // Queries that ask for the needles (the question at the end of the prompt): retrieval heads
  // look at the needle only from these, which is what an ACCUMULATED statistic sees.
  int question_tokens = 64;
};

// INVALID_ARGUMENT naming the field.
[[nodiscard]] absl::Status ValidateWorkloadOptions(const WorkloadOptions& options);

// The structural parameters of one head; the same for every statistic kind of a seed.
struct HeadPlan {
  HeadArchetype archetype = HeadArchetype::kDiffuse;
  double sink_mass = 0.0;        // share of the last row on the sink tokens
  double focus_mass = 0.0;       // share on the archetype's focus (needle, hitters, local window)
  double decay_tokens = 0.0;     // local heads: e-folding distance from the end
  int needle = -1;               // retrieval heads: index into needles()
  std::vector<int64_t> hitters;  // heavy-hitter heads: positions
  std::vector<double> hitter_weights;  // sum 1
  double noise_sigma = 0.0;            // log-normal jitter of every token
};

// Generates the statistic of any layer on demand, deterministically per seed: layer l head h
// depends only on (seed, l, h, kind), never on the order of calls. Immutable after
// construction and thread-safe for concurrent GenerateLayer calls. Cost O(H_Q * T) per layer.
class WorkloadGenerator {
 public:
  // REQUIRES: ValidatePreset(preset) and ValidateWorkloadOptions(options) are OK.
  WorkloadGenerator(const ModelPreset& preset, const WorkloadOptions& options);

  // Writes layer `layer` as [H_Q, T] row-major into `out` (size H_Q * T). LAST_ROW and
  // WINDOW_MEAN rows sum to 1; ACCUMULATED rows are column sums over all T queries (sum T).
  void GenerateLayer(int layer, std::span<float> out) const;
  // As above for another statistic kind of the same workload.
  void GenerateLayer(int layer, StatisticKind kind, std::span<float> out) const;

  [[nodiscard]] const ModelPreset& preset() const { return preset_; }
  [[nodiscard]] const WorkloadOptions& options() const { return options_; }
  [[nodiscard]] const std::vector<NeedleSpan>& needles() const { return needles_; }
  [[nodiscard]] HeadArchetype archetype(int layer, int head) const;
  [[nodiscard]] HeadPlan Plan(int layer, int head) const;

 private:
  void FillRow(const HeadPlan& plan, StatisticKind kind, uint64_t noise_seed,
               std::span<float> row) const;

  ModelPreset preset_;
  WorkloadOptions options_;
  std::vector<NeedleSpan> needles_;
  std::vector<int64_t> salient_;  // tokens heavy hitters of every head tend to share
};

}  // namespace entrokv::sim

#endif  // ENTROKV_SIM_WORKLOAD_H_
