// The method's closed forms (claims C9-C11, docs/method.md), evaluated and checked against the
// core on a single synthetic group.
#ifndef ENTROKV_SIM_CLOSED_FORM_H_
#define ENTROKV_SIM_CLOSED_FORM_H_

#include <vector>

#include "sim/eval.h"

namespace entrokv::sim {

inline constexpr double kNeedleMass = 0.95;  // 1 - epsilon

// The paper's table (r = 8, eta = ln 2, T = 4K..128K) and the single-group check (r = 6 and 8,
// T = 1K..128K).
[[nodiscard]] std::vector<ClosedFormRow> ClosedFormChecks(double tau, int sink_tokens);

}  // namespace entrokv::sim

#endif  // ENTROKV_SIM_CLOSED_FORM_H_
