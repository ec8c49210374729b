// `entrokv replay` against a real entrokvd in the LAYER frame layout (docs/architecture.md §3.9):
// every pooled policy ends at exactly the planned frames, counted in the layout's own frames; with
// --scope group the replay shows the union per-group selection keeps instead.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/scoring/policy.h"
#include "core/testing/policies.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cli_runner.h"
#include "tests/service/test_support.h"

namespace entrokv {
namespace {

using ::entrokv::testing::CliRun;
using ::entrokv::testing::JsonInt;
using ::entrokv::testing::RunCli;
using ::testing::HasSubstr;

class LayerScopeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<service::testing::DaemonProcess>(
        ENTROKVD_PATH,
        std::vector<std::string>{"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                 "--frame_layout=layer"});
    ASSERT_TRUE(daemon_->WaitListening(20000)) << daemon_->Stderr();
    server_ = absl::StrCat("--server 127.0.0.1:", daemon_->port());
  }
  void TearDown() override {
    daemon_->Signal(SIGTERM);
    EXPECT_EQ(daemon_->WaitExit(20000), 0) << daemon_->Stderr();
  }

  std::unique_ptr<service::testing::DaemonProcess> daemon_;
  std::string server_;
};

TEST_F(LayerScopeCliTest, EveryPooledPolicyEndsAtThePlannedLayerFrames) {
  const CliRun replay = RunCli(
      absl::StrCat("replay ", server_, " --model tiny --tokens 1000 --budget 0.2 --sequences 2",
                   " --policy ", absl::StrJoin(PolicyNames(), ","), " --json"));
  ASSERT_EQ(replay.exit_code, 0) << replay.out;
  // tiny: 2 layers, 2 groups; P = floor(0.2 * 1000 * 2 / 16) = 25 layer-pages, one frame each.
  for (const absl::string_view policy : ::entrokv::testing::ExactBudgetPolicyNames()) {
    const size_t at = replay.out.find(absl::StrCat("\"policy\":\"", policy, "\""));
    ASSERT_NE(at, std::string::npos) << policy;
    EXPECT_EQ(JsonInt(replay.out, "planned_frames", at), 2 * 25) << policy;
    EXPECT_EQ(JsonInt(replay.out, "frames_used_after", at), 2 * 25) << policy;
    EXPECT_EQ(JsonInt(replay.out, "frames_before", at), 2 * 2 * 63) << policy;
    EXPECT_GE(JsonInt(replay.out, "group_scope_frames", at), 2 * 25) << policy;
    EXPECT_THAT(replay.out.substr(at, 160), HasSubstr("\"scope\":\"layer\"")) << policy;
  }
  // head_independent keeps the union over the layer's heads: the overhead baseline.
  const size_t independent = replay.out.find("\"policy\":\"head_independent\"");
  ASSERT_NE(independent, std::string::npos);
  EXPECT_GT(JsonInt(replay.out, "frames_used_after", independent), 2 * 25);
}

TEST_F(LayerScopeCliTest, GroupScopeKeepsTheUnionItReports) {
  const CliRun replay =
      RunCli(absl::StrCat("replay ", server_, " --model tiny --tokens 4000 --budget 0.1",
                          " --policy page_entrokv --scope group --json"));
  ASSERT_EQ(replay.exit_code, 0) << replay.out;
  EXPECT_THAT(replay.out, HasSubstr("\"scope\":\"group\""));
  // P = floor(0.1 * 4000 * 2 / 16) = 50; the groups disagree, so the union is larger.
  EXPECT_EQ(JsonInt(replay.out, "planned_frames"), 50);
  EXPECT_EQ(JsonInt(replay.out, "frames_used_after"), JsonInt(replay.out, "group_scope_frames"));
  EXPECT_GT(JsonInt(replay.out, "frames_used_after"), 50);

  const CliRun table =
      RunCli(absl::StrCat("replay ", server_, " --model tiny --tokens 1000 --scope layer"));
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_THAT(table.out, HasSubstr("layer frame layout"));
  const CliRun bad = RunCli(absl::StrCat("replay ", server_, " --model tiny --scope head"));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("--scope"));
}

}  // namespace
}  // namespace entrokv
