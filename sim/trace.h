// Trace files: one attention statistic for every layer of one prompt, on disk.
//
// A trace is a directory holding
//   stats.npy        float32 (or float16) [L, H_Q, T], the statistic named in trace.json;
//   accumulated.npy  optional, same shape, an ACCUMULATED statistic for H2O-style policies;
//   trace.json       {"format": "entrokv-trace", "version": 1,
//                     "model": {"name", "layers", "query_heads", "kv_groups", "head_dim"},
//                     "tokens": T, "statistic": "last_row" | "window_mean" | "accumulated",
//                     "sink_tokens": 4, "needles": [{"begin", "end", "depth"}, ...],
//                     "source": free text}.
// A real-model capture writes the same files, so every tool that reads a trace runs on both.
#ifndef ENTROKV_SIM_TRACE_H_
#define ENTROKV_SIM_TRACE_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/scoring/statistic.h"
#include "sim/presets.h"
#include "sim/workload.h"

namespace entrokv::sim {

inline constexpr char kTraceStatsFile[] = "stats.npy";
inline constexpr char kTraceAccumulatedFile[] = "accumulated.npy";
inline constexpr char kTraceMetaFile[] = "trace.json";

[[nodiscard]] absl::string_view StatisticKindName(StatisticKind kind);
// INVALID_ARGUMENT for an unknown name.
[[nodiscard]] absl::StatusOr<StatisticKind> ParseStatisticKind(absl::string_view name);

struct TraceMeta {
  ModelPreset model;
  int64_t tokens = 0;
  StatisticKind kind = StatisticKind::kLastRow;
  int sink_tokens = 4;
  std::vector<NeedleSpan> needles;
  std::string source;
};

// A trace in memory; owns its arrays.
struct Trace {
  TraceMeta meta;
  std::vector<float> stats;        // [L, H_Q, T]
  std::vector<float> accumulated;  // [L, H_Q, T], or empty when the trace has none

  [[nodiscard]] std::span<const float> Layer(int layer) const;
  [[nodiscard]] std::span<const float> AccumulatedLayer(int layer) const;  // empty if none
};

// Creates `dir` if needed and writes the files. INVALID_ARGUMENT when an array's size is not
// L * H_Q * T or the geometry is invalid; INTERNAL when a file cannot be written.
[[nodiscard]] absl::Status WriteTrace(const std::string& dir, const TraceMeta& meta,
                                      std::span<const float> stats,
                                      std::span<const float> accumulated = {});
// NOT_FOUND when trace.json or stats.npy is missing; INVALID_ARGUMENT naming the field when
// the metadata is malformed or disagrees with the array shape.
[[nodiscard]] absl::StatusOr<Trace> ReadTrace(const std::string& dir);

// Generates every layer of `generator` (its kind, plus ACCUMULATED when `with_accumulated`)
// and writes them as a trace with source "entrokv-sim seed=<seed>".
[[nodiscard]] absl::Status WriteSyntheticTrace(const std::string& dir,
                                               const WorkloadGenerator& generator,
                                               bool with_accumulated);

}  // namespace entrokv::sim

#endif  // ENTROKV_SIM_TRACE_H_
