// The registry's policies as tests iterate them, so that a new policy is tested without editing
// a list of names.
#ifndef ENTROKV_CORE_TESTING_POLICIES_H_
#define ENTROKV_CORE_TESTING_POLICIES_H_

#include <vector>

#include "absl/strings/string_view.h"
#include "core/scoring/policy.h"

namespace entrokv::testing {

// Every registered policy that keeps exactly its quota per group (all but the union,
// head_independent), in registry order.
inline std::vector<absl::string_view> ExactBudgetPolicyNames() {
  std::vector<absl::string_view> names;
  for (const absl::string_view name : PolicyNames()) {
    if ((*FindPolicy(name))->exact_budget()) names.push_back(name);
  }
  return names;
}

}  // namespace entrokv::testing

#endif  // ENTROKV_CORE_TESTING_POLICIES_H_
