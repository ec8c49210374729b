// The server commands of `entrokv` (replay, status, models, sequences) against a real entrokvd.
#include <string>

#include "absl/strings/str_cat.h"
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
using ::testing::MatchesRegex;

class CliServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<service::testing::DaemonProcess>(
        ENTROKVD_PATH,
        std::vector<std::string>{"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0"});
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

TEST_F(CliServerTest, ReplayKeepsExactlyThePlannedFramesAndListsItsSequences) {
  const CliRun replay =
      RunCli(absl::StrCat("replay ", server_, " --model tiny --tokens 1000 --budget 0.2",
                          " --sequences 3 --concurrency 2 --policy page_entrokv --keep-open"
                          " --json"));
  ASSERT_EQ(replay.exit_code, 0) << replay.out;
  // tiny: 2 layers, 2 groups; P = floor(0.2 * 1000 * 2 / 16) = 25 layer-pages per sequence.
  EXPECT_EQ(JsonInt(replay.out, "planned_frames"), 3 * 2 * 25);
  EXPECT_EQ(JsonInt(replay.out, "frames_used_after"), 3 * 2 * 25);
  EXPECT_EQ(JsonInt(replay.out, "frames_before"), 3 * 2 * 2 * 63);  // ceil(1000/16) = 63 pages

  const CliRun sequences = RunCli(absl::StrCat("sequences ", server_, " --json"));
  ASSERT_EQ(sequences.exit_code, 0) << sequences.out;
  EXPECT_THAT(sequences.out, HasSubstr("\"sequence_id\":\"replay-page_entrokv-1-0\""));
  EXPECT_THAT(sequences.out, HasSubstr("\"sequence_id\":\"replay-page_entrokv-1-2\""));
  EXPECT_EQ(JsonInt(sequences.out, "length_tokens"), 1000);
  EXPECT_EQ(JsonInt(sequences.out, "live_frames"), 2 * 25);
  EXPECT_EQ(JsonInt(sequences.out, "block_tables"), 4);
  EXPECT_EQ(JsonInt(sequences.out, "table_pages"), 63);
  // Fixed budgets under no pressure: the default tenant, priority 0, no quota.
  EXPECT_THAT(sequences.out, HasSubstr("\"tenant\":\"\""));
  EXPECT_EQ(JsonInt(sequences.out, "priority"), 0);
  EXPECT_EQ(JsonInt(sequences.out, "quota_frames"), 0);
  EXPECT_THAT(sequences.out, HasSubstr("\"preempt\":false"));

  const CliRun status = RunCli(absl::StrCat("status ", server_, " --json"));
  ASSERT_EQ(status.exit_code, 0) << status.out;
  EXPECT_THAT(status.out, HasSubstr("\"readiness\":\"SERVING\""));
  EXPECT_THAT(status.out, HasSubstr("\"liveness\":\"SERVING\""));
  EXPECT_EQ(JsonInt(status.out, "used_frames"), 150);
  EXPECT_EQ(JsonInt(status.out, "sequences_active"), 3);
  EXPECT_EQ(JsonInt(status.out, "bytes_moved_total"), 0);

  const CliRun table = RunCli(absl::StrCat("status ", server_));
  EXPECT_THAT(table.out, HasSubstr("readiness SERVING"));
  EXPECT_THAT(table.out, HasSubstr("tiny"));

  const CliRun models = RunCli(absl::StrCat("models ", server_, " --json"));
  ASSERT_EQ(models.exit_code, 0) << models.out;
  EXPECT_THAT(models.out, HasSubstr("\"model_id\":\"tiny\""));
  EXPECT_THAT(models.out, HasSubstr("\"kv_groups\":2"));
}

TEST_F(CliServerTest, HeadIndependentReplayShowsTheUnionOverhead) {
  const CliRun replay =
      RunCli(absl::StrCat("replay ", server_, " --model tiny --tokens 2000 --budget 0.1",
                          " --policy page_entrokv,head_independent --json"));
  ASSERT_EQ(replay.exit_code, 0) << replay.out;
  const size_t independent = replay.out.find("\"policy\":\"head_independent\"");
  ASSERT_NE(independent, std::string::npos);
  EXPECT_EQ(JsonInt(replay.out, "frames_used_after"), JsonInt(replay.out, "planned_frames"));
  EXPECT_GT(JsonInt(replay.out, "frames_used_after", independent),
            JsonInt(replay.out, "planned_frames", independent));
  // Closed after the replay: nothing is left behind.
  const CliRun status = RunCli(absl::StrCat("status ", server_, " --json"));
  EXPECT_EQ(JsonInt(status.out, "used_frames"), 0);
}

// ListSequences answers 100 sequences per page by default: the CLI follows the pages and lists
// every sequence, its JSON rows as before (table counts from the geometry).
TEST_F(CliServerTest, SequencesFollowsEveryPage) {
  constexpr int kSequences = 230;
  auto stub = v1::CacheManager::NewStub(
      service::testing::MakeChannel(absl::StrCat("127.0.0.1:", daemon_->port())));
  {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    ASSERT_TRUE(stub->RegisterModel(&context,
                                    service::testing::RegisterRequest("paged", 3, 4, 2, 4 << 20),
                                    &response)
                    .ok());
  }
  for (int i = 0; i < kSequences; ++i) {
    grpc::ClientContext context;
    v1::OpenSequenceRequest request;
    request.set_model_id("paged");
    request.set_sequence_id(absl::StrCat("s", 1000 + i));
    request.set_initial_tokens(20);
    v1::OpenSequenceResponse response;
    ASSERT_TRUE(stub->OpenSequence(&context, request, &response).ok()) << i;
  }
  const CliRun sequences = RunCli(absl::StrCat("sequences ", server_, " --model paged --json"));
  ASSERT_EQ(sequences.exit_code, 0) << sequences.out;
  int listed = 0;
  for (size_t at = sequences.out.find("\"sequence_id\""); at != std::string::npos;
       at = sequences.out.find("\"sequence_id\"", at + 1)) {
    ++listed;
  }
  EXPECT_EQ(listed, kSequences);
  EXPECT_THAT(sequences.out, HasSubstr("\"sequence_id\":\"s1000\""));
  EXPECT_THAT(sequences.out, HasSubstr("\"sequence_id\":\"s1229\""));
  EXPECT_EQ(JsonInt(sequences.out, "block_tables"), 3 * 2);
  EXPECT_EQ(JsonInt(sequences.out, "table_pages"), 2);  // ceil(20 / 16)
  EXPECT_EQ(JsonInt(sequences.out, "live_frames"), 3 * 2 * 2);
}

TEST_F(CliServerTest, ServerErrorsExitOneWithTheStatusAndUsageErrorsExitTwo) {
  const CliRun unknown = RunCli(absl::StrCat("replay ", server_, " --model nope"));
  EXPECT_EQ(unknown.exit_code, 2) << unknown.out;
  EXPECT_THAT(unknown.out, HasSubstr("nope"));
  const CliRun bad_budget = RunCli(absl::StrCat("replay ", server_, " --budget 2"));
  EXPECT_EQ(bad_budget.exit_code, 2);
  EXPECT_THAT(bad_budget.out, HasSubstr("--budget"));
  // Far too many tokens for the pool the replay registers: the daemon refuses.
  const CliRun too_big =
      RunCli(absl::StrCat("replay ", server_, " --model tiny --tokens 1000000000 --budget 0.5"));
  EXPECT_EQ(too_big.exit_code, 1) << too_big.out;
  EXPECT_THAT(too_big.out, MatchesRegex("(.|\n)*(RESOURCE_EXHAUSTED|INVALID_ARGUMENT)(.|\n)*"));
  const CliRun dead = RunCli("status --server 127.0.0.1:1 --timeout-ms 500");
  EXPECT_EQ(dead.exit_code, 1) << dead.out;
  EXPECT_THAT(dead.out, HasSubstr("UNAVAILABLE"));
  for (const char* command : {"status", "models", "sequences", "replay"}) {
    const CliRun help = RunCli(absl::StrCat(command, " --help"));
    EXPECT_EQ(help.exit_code, 0) << command;
    EXPECT_THAT(help.out, HasSubstr("--server")) << command;
  }
}

}  // namespace
}  // namespace entrokv
