// `entrokv policies` as the Python tools run it: the registry, with the statistic each policy
// scores, in one JSON document.
#include <optional>
#include <string>

#include "core/scoring/policy.h"
#include "core/util/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cli_runner.h"

namespace entrokv {
namespace {

using ::entrokv::testing::CliRun;
using ::entrokv::testing::RunCli;
using ::testing::HasSubstr;

std::string KindName(std::optional<StatisticKind> kind) {
  if (!kind.has_value()) return "none";
  switch (*kind) {
    case StatisticKind::kLastRow:
      return "last_row";
    case StatisticKind::kWindowMean:
      return "window_mean";
    case StatisticKind::kAccumulated:
      return "accumulated";
  }
  return "?";
}

TEST(PoliciesCliTest, JsonListsTheRegistryInOrderWithEachStatistic) {
  const CliRun run = RunCli("policies --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const absl::StatusOr<Json> parsed = ParseJson(run.out, "policies --json");
  ASSERT_TRUE(parsed.ok()) << parsed.status() << run.out;
  const Json& listed = (*parsed)["policies"];
  const std::vector<absl::string_view> names = PolicyNames();
  ASSERT_EQ(listed.size(), names.size()) << run.out;
  for (size_t i = 0; i < names.size(); ++i) {
    const Policy& policy = **FindPolicy(names[i]);
    EXPECT_EQ(listed[i]["name"], std::string(names[i]));
    EXPECT_EQ(listed[i]["statistic"], KindName(policy.statistic())) << names[i];
    EXPECT_EQ(listed[i]["exact_budget"], policy.exact_budget()) << names[i];
  }
}

TEST(PoliciesCliTest, TableNamesEveryPolicyAndUnknownFlagsAreUsageErrors) {
  const CliRun table = RunCli("policies");
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_THAT(table.out, HasSubstr("h2o                accumulated"));
  EXPECT_THAT(table.out, HasSubstr("head_independent   last_row     the union"));
  const CliRun bad = RunCli("policies --format yaml");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("--format"));
}

}  // namespace
}  // namespace entrokv
