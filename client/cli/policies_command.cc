// `entrokv policies`: the policy registry as the core states it, offline. The Python tools read
// `--json` instead of keeping their own lists of names and statistics.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/args.h"
#include "client/cli/command.h"
#include "core/scoring/policy.h"
#include "core/util/json.h"
#include "sim/trace.h"

namespace entrokv::cli {
namespace {

constexpr char kCommand[] = "policies";

// "last_row", "window_mean", "accumulated", or "none" for a policy that reads no statistic.
std::string StatisticName(const Policy& policy) {
  const std::optional<StatisticKind> kind = policy.statistic();
  return kind.has_value() ? std::string(sim::StatisticKindName(*kind)) : "none";
}

}  // namespace

int RunPolicies(const std::vector<std::string>& args) {
  ArgParser parser(kCommand,
                   "[--json]\n"
                   "Lists every registered policy in registry order: the statistic it scores "
                   "and whether it keeps exactly its quota per group.");
  parser.Flag("json", false, "one JSON document instead of the table");
  const absl::StatusOr<bool> parsed = parser.Parse(args);
  if (!parsed.ok()) return UsageError(kCommand, parsed.status());
  if (!*parsed) return kExitOk;  // --help

  std::vector<const Policy*> policies;
  for (const absl::string_view name : PolicyNames()) policies.push_back(*FindPolicy(name));
  if (parser.GetFlag("json")) {
    // {"policies":[{"name":..., "statistic":..., "exact_budget":...}, ...]}
    Json list = Json::array();
    for (const Policy* policy : policies) {
      list.push_back({{"name", std::string(policy->name())},
                      {"statistic", StatisticName(*policy)},
                      {"exact_budget", policy->exact_budget()}});
    }
    std::printf("%s\n", DumpJson(Json{{"policies", list}}).c_str());
    return kExitOk;
  }
  std::printf("%-18s %-12s %s\n", "policy", "statistic", "keeps");
  for (const Policy* policy : policies) {
    std::printf(
        "%-18s %-12s %s\n", std::string(policy->name()).c_str(), StatisticName(*policy).c_str(),
        policy->exact_budget() ? "exactly K pages per group" : "the union of its heads' K pages");
  }
  return kExitOk;
}

}  // namespace entrokv::cli
