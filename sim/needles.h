// The one definition of a needle target and of a kept needle, shared by `entrokv eval`
// (sim/eval.cc) and `entrokv replay` (client/cli/replay_command.cc).
#ifndef ENTROKV_SIM_NEEDLES_H_
#define ENTROKV_SIM_NEEDLES_H_

#include <cstdint>
#include <span>
#include <vector>

#include "sim/workload.h"

namespace entrokv::sim {

// The share of a head's row a needle must hold for the head to look at it (EvalOptions'
// retrieval_head_mass default).
inline constexpr double kRetrievalHeadMass = 0.3;

// The needles a head looks at: needle j when the head puts at least `share` of its row's mass on
// the needle's tokens. Measured from the statistic, so it holds on captured traces as on the
// synthetic workload.
[[nodiscard]] std::vector<int> NeedlesLookedAt(std::span<const float> row,
                                               std::span<const NeedleSpan> needles, double share);

// targets[g] = the needles some head of group g looks at (NeedlesLookedAt), in first-seen order.
// `layer` is [query_heads, tokens], heads grouped contiguously (r = query_heads / kv_groups).
[[nodiscard]] std::vector<std::vector<int>> NeedleTargets(std::span<const float> layer,
                                                          int query_heads, int kv_groups,
                                                          int64_t tokens,
                                                          std::span<const NeedleSpan> needles,
                                                          double share);

// Whether a decision keeps the needle: every page its span touches is among `kept` (ascending).
[[nodiscard]] bool NeedleKept(const NeedleSpan& needle, int page_size,
                              std::span<const int32_t> kept);

}  // namespace entrokv::sim

#endif  // ENTROKV_SIM_NEEDLES_H_
