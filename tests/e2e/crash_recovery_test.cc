// Crash safety (docs/reliability.md) with the real binaries: entrokvd under load, kill -9,
// restarted on the same --state_dir, holds exactly what it held (models, sequences, block tables,
// free frames, the host arena's bytes); a damaged journal stops the start with exit 2; and without
// --state_dir the arenas of a killed daemon do not stay behind in /dev/shm.
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/pool/arena.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cli_runner.h"
#include "tests/e2e/daemon_runner.h"
#include "tests/service/test_support.h"

namespace entrokv::service {
namespace {

using ::entrokv::service::testing::Append;
using ::entrokv::service::testing::ArenaName;
using ::entrokv::service::testing::Args;
using ::entrokv::service::testing::BytesStatistic;
using ::entrokv::service::testing::Close;
using ::entrokv::service::testing::Daemon;
using ::entrokv::service::testing::DaemonProcess;
using ::entrokv::service::testing::FreshDir;
using ::entrokv::service::testing::MakeChannel;
using ::entrokv::service::testing::Open;
using ::entrokv::service::testing::RandomStatistic;
using ::entrokv::service::testing::Register;
using ::entrokv::service::testing::RegisterRequest;
using ::entrokv::service::testing::ShmExists;
using ::testing::HasSubstr;

grpc::Status Decide(v1::CacheManager::Stub& stub, const std::string& model, const std::string& id,
                    int layers, int heads, int64_t tokens, uint32_t seed) {
  grpc::ClientContext context;
  v1::DecideRequest request;
  request.set_model_id(model);
  request.set_sequence_id(id);
  request.mutable_budget()->set_fraction(0.4);
  for (int layer = 0; layer < layers; ++layer) {
    v1::LayerStatistic* in = request.add_layers();
    in->set_layer(layer);
    *in->mutable_statistic() = BytesStatistic(RandomStatistic(heads, tokens, seed + layer), heads,
                                              tokens, v1::DTYPE_FLOAT32);
  }
  v1::DecideResponse response;
  return stub.Decide(&context, request, &response);
}

// Everything a client can see of the daemon's state, as bytes to compare.
struct Snapshot {
  std::string models;
  std::vector<std::string> sequences;  // per model, with block tables
  std::vector<std::string> stats;      // per model: used, free, active
  std::string cli_json;
};

Snapshot Take(Daemon& daemon) {
  Snapshot snapshot;
  grpc::ClientContext context;
  v1::ListModelsResponse models;
  EXPECT_TRUE(daemon.stub().ListModels(&context, {}, &models).ok());
  snapshot.models = models.SerializeAsString();
  for (const v1::PoolInfo& pool : models.pools()) {
    grpc::ClientContext list_context;
    v1::ListSequencesRequest request;
    request.set_model_id(pool.model_id());
    request.set_include_block_tables(true);
    v1::ListSequencesResponse sequences;
    EXPECT_TRUE(daemon.stub().ListSequences(&list_context, request, &sequences).ok());
    snapshot.sequences.push_back(sequences.SerializeAsString());
    grpc::ClientContext stats_context;
    v1::GetPoolStatsRequest stats_request;
    stats_request.set_model_id(pool.model_id());
    v1::PoolStats stats;
    EXPECT_TRUE(daemon.stub().GetPoolStats(&stats_context, stats_request, &stats).ok());
    snapshot.stats.push_back(absl::StrCat(stats.used_frames(), "/", stats.free_frames(), "/",
                                          stats.capacity_frames(), "/", stats.sequences_active()));
  }
  const entrokv::testing::CliRun cli =
      entrokv::testing::RunCli(absl::StrCat("sequences --json --server ", daemon.address()));
  EXPECT_EQ(cli.exit_code, 0) << cli.out;
  snapshot.cli_json = cli.out;
  return snapshot;
}

std::string ArenaBytes(const std::string& name) {
  absl::StatusOr<std::unique_ptr<HostArenaMapping>> mapping = HostArenaMapping::OpenByName(name);
  EXPECT_TRUE(mapping.ok()) << mapping.status();
  if (!mapping.ok()) return "";
  return std::string(static_cast<const char*>((*mapping)->data()),
                     static_cast<size_t>((*mapping)->bytes()));
}

// Opens, forks, appends, decides (caching head weights) and closes on two models; then writes
// a pattern into every byte of both arenas, as engines write K/V into their frames.
void Load(Daemon& daemon) {
  auto& stub = daemon.stub();
  Register(daemon, "group", v1::FRAME_LAYOUT_GROUP);
  Register(daemon, "layer", v1::FRAME_LAYOUT_LAYER);
  for (const std::string model : {"group", "layer"}) {
    ASSERT_TRUE(Open(stub, model, "a", 200).ok());
    ASSERT_TRUE(Open(stub, model, "b", 90).ok());
    ASSERT_TRUE(Decide(stub, model, "a", 3, 8, 200, 1).ok());
    ASSERT_TRUE(Open(stub, model, "a/fork", 0, "a", 10).ok());  // shares evicted and live pages
    ASSERT_TRUE(Append(stub, model, "a/fork", 7).ok());         // copy-on-write of the tail
    ASSERT_TRUE(Append(stub, model, "a", 40).ok());
    ASSERT_TRUE(Decide(stub, model, "a", 3, 8, 240, 2).ok());  // reuses the cached weights
    ASSERT_TRUE(Open(stub, model, "c", 80).ok());
    ASSERT_TRUE(Close(stub, model, "b").ok());
    {
      const grpc::Status decided = Decide(stub, model, "c", 3, 8, 80, 3);
      ASSERT_TRUE(decided.ok()) << decided.error_message();
    }
    ASSERT_TRUE(Append(stub, model, "c", 1).ok());
  }
  for (const std::string model : {"group", "layer"}) {
    absl::StatusOr<std::unique_ptr<HostArenaMapping>> mapping =
        HostArenaMapping::OpenByName(ArenaName(daemon, model));
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    unsigned char* bytes = static_cast<unsigned char*>((*mapping)->data());
    for (int64_t i = 0; i < (*mapping)->bytes(); ++i) bytes[i] = static_cast<unsigned char>(i * 7);
  }
}

TEST(CrashRecoveryTest, KillNineAndRestartRecoverEverythingExactly) {
  const std::string dir = FreshDir("crash_recovery");
  Snapshot before;
  std::string group_bytes;
  std::string layer_bytes;
  std::vector<std::string> arenas;
  {
    Daemon daemon(dir);
    ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
    Load(daemon);
    before = Take(daemon);
    arenas = {ArenaName(daemon, "group"), ArenaName(daemon, "layer")};
    group_bytes = ArenaBytes(arenas[0]);
    layer_bytes = ArenaBytes(arenas[1]);
    daemon.process().Signal(SIGKILL);
    EXPECT_EQ(daemon.process().WaitExit(10000), -1);
  }
  ASSERT_THAT(before.cli_json, HasSubstr("\"sequence_id\":\"a/fork\""));
  Daemon daemon(dir);
  ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
  EXPECT_THAT(daemon.process().Stderr(), HasSubstr("model 'group' recovered: 3 sequences"));
  const Snapshot after = Take(daemon);
  EXPECT_EQ(after.models, before.models);  // same pools, same arena names
  EXPECT_EQ(after.sequences, before.sequences);
  EXPECT_EQ(after.stats, before.stats);
  EXPECT_EQ(after.cli_json, before.cli_json);
  EXPECT_TRUE(ArenaBytes(arenas[0]) == group_bytes);
  EXPECT_TRUE(ArenaBytes(arenas[1]) == layer_bytes);

  // The recovered daemon goes on: decisions, appends, and closing everything frees every frame.
  auto& stub = daemon.stub();
  for (const std::string model : {"group", "layer"}) {
    {
      const grpc::Status decided = Decide(stub, model, "a", 3, 8, 240, 4);
      EXPECT_TRUE(decided.ok()) << decided.error_message();
    }
    EXPECT_TRUE(Append(stub, model, "a/fork", 30).ok());
    for (const std::string id : {"a", "a/fork", "c"}) EXPECT_TRUE(Close(stub, model, id).ok());
    grpc::ClientContext context;
    v1::GetPoolStatsRequest request;
    request.set_model_id(model);
    v1::PoolStats stats;
    ASSERT_TRUE(stub.GetPoolStats(&context, request, &stats).ok());
    EXPECT_EQ(stats.used_frames(), 0);
    EXPECT_EQ(stats.free_frames(), stats.capacity_frames());
  }
  daemon.process().Signal(SIGTERM);
  EXPECT_EQ(daemon.process().WaitExit(20000), 0);
  // A --state_dir daemon keeps its arenas for the next start.
  EXPECT_TRUE(ShmExists(arenas[0]));
  std::filesystem::remove_all(dir);
  for (const std::string& name : arenas) shm_unlink(name.c_str());
}

// A tensor-parallel model keeps every rank's arena: kill -9 and a restart attach each again,
// on its device, with its bytes and the block tables, in both frame layouts. In the GROUP
// layout rank 0 alone decided first, so the ranks' free lists differ; after the restart each
// rank's frames still go to its own groups.
TEST(CrashRecoveryTest, EveryRanksArenaSurvivesKillNine) {
  for (const v1::FrameLayout layout : {v1::FRAME_LAYOUT_LAYER, v1::FRAME_LAYOUT_GROUP}) {
    SCOPED_TRACE(v1::FrameLayout_Name(layout));
    const std::string dir = FreshDir(absl::StrCat("crash_recovery_tp", layout));
    Snapshot before;
    std::vector<std::string> arenas;
    std::vector<std::string> bytes;
    {
      Daemon daemon(dir, {"--host_devices=4"});
      ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
      grpc::ClientContext context;
      v1::RegisterModelRequest request = RegisterRequest("tp", 3, 8, 2, uint64_t{4} << 20);
      request.set_frame_layout(layout);
      request.set_tensor_parallel_size(2);
      request.add_devices(3);
      request.add_devices(1);
      v1::RegisterModelResponse response;
      ASSERT_TRUE(daemon.stub().RegisterModel(&context, request, &response).ok());
      ASSERT_EQ(response.pool().ranks_size(), 2);
      ASSERT_TRUE(Open(daemon.stub(), "tp", "a", 100).ok());
      ASSERT_TRUE(Open(daemon.stub(), "tp", "a/fork", 20, "a", 3).ok());
      if (layout == v1::FRAME_LAYOUT_GROUP) {
        grpc::ClientContext decide_context;
        v1::DecideRequest decide;
        decide.set_model_id("tp");
        decide.set_sequence_id("a");
        decide.set_rank(0);
        decide.mutable_budget()->set_pages_per_group(2);
        decide.mutable_policy()->set_name("streaming");  // by position: no statistic
        for (int layer = 0; layer < 3; ++layer) decide.add_layers()->set_layer(layer);
        v1::DecideResponse decided;
        ASSERT_TRUE(daemon.stub().Decide(&decide_context, decide, &decided).ok());
      }
      for (int rank = 0; rank < 2; ++rank) {
        arenas.push_back(response.pool().ranks(rank).arena_name());
        absl::StatusOr<std::unique_ptr<HostArenaMapping>> mapping =
            HostArenaMapping::OpenByName(arenas.back());
        ASSERT_TRUE(mapping.ok()) << mapping.status();
        char* data = static_cast<char*>((*mapping)->data());
        for (int64_t i = 0; i < (*mapping)->bytes(); ++i) {
          data[i] = static_cast<char>(i * 7 + rank);
        }
        bytes.push_back(ArenaBytes(arenas.back()));
      }
      before = Take(daemon);
      daemon.process().Signal(SIGKILL);
      EXPECT_EQ(daemon.process().WaitExit(10000), -1);
    }
    Daemon daemon(dir, {"--host_devices=4"});
    ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
    EXPECT_THAT(daemon.process().Stderr(), HasSubstr("model 'tp' recovered: 2 sequences"));
    const Snapshot after = Take(daemon);
    EXPECT_EQ(after.models, before.models);  // both ranks, their devices, arena names, frames
    EXPECT_EQ(after.sequences, before.sequences);
    EXPECT_EQ(after.stats, before.stats);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(ArenaBytes(arenas[static_cast<size_t>(rank)]) == bytes[static_cast<size_t>(rank)])
          << "rank " << rank;
    }
    grpc::ClientContext context;
    v1::GetModelRequest request;
    request.set_model_id("tp");
    v1::GetModelResponse response;
    ASSERT_TRUE(daemon.stub().GetModel(&context, request, &response).ok());
    ASSERT_EQ(response.pool().ranks_size(), 2);
    EXPECT_EQ(response.pool().ranks(0).device(), 3);
    EXPECT_EQ(response.pool().ranks(1).device(), 1);
    // A new sequence's frames come from the recovered free lists, each group's from its rank's.
    grpc::ClientContext open_context;
    v1::OpenSequenceRequest open;
    open.set_model_id("tp");
    open.set_sequence_id("b");
    open.set_initial_tokens(50);
    v1::OpenSequenceResponse opened;
    ASSERT_TRUE(daemon.stub().OpenSequence(&open_context, open, &opened).ok());
    ASSERT_GT(opened.new_frames_size(), 0);
    for (const v1::FrameAssignment& frame : opened.new_frames()) {
      const v1::RankArena& rank = response.pool().ranks(frame.group());  // 2 groups, 2 ranks
      EXPECT_GE(frame.frame(), rank.first_frame()) << "group " << frame.group();
      EXPECT_LT(frame.frame(), rank.first_frame() + rank.frames()) << "group " << frame.group();
    }
    daemon.process().Signal(SIGTERM);
    EXPECT_EQ(daemon.process().WaitExit(20000), 0);
    std::filesystem::remove_all(dir);
    for (const std::string& name : arenas) shm_unlink(name.c_str());
  }
}

TEST(CrashRecoveryTest, ArenaGoneMarksSequencesLost) {
  const std::string dir = FreshDir("crash_lost");
  std::string arena;
  {
    Daemon daemon(dir);
    ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
    Register(daemon, "m", v1::FRAME_LAYOUT_GROUP);
    ASSERT_TRUE(Open(daemon.stub(), "m", "s", 50).ok());
    arena = ArenaName(daemon, "m");
    daemon.process().Signal(SIGKILL);
    EXPECT_EQ(daemon.process().WaitExit(10000), -1);
  }
  ASSERT_EQ(shm_unlink(arena.c_str()), 0);  // what a reboot does to /dev/shm (and a cuda arena)
  Daemon daemon(dir);
  ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
  EXPECT_THAT(daemon.process().Stderr(), HasSubstr("1 sequences lost"));
  const grpc::Status appended = Append(daemon.stub(), "m", "s", 1);
  EXPECT_EQ(appended.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(appended.error_message(), HasSubstr("was lost when entrokvd restarted"));
  EXPECT_TRUE(Close(daemon.stub(), "m", "s").ok());
  EXPECT_EQ(Append(daemon.stub(), "m", "s", 1).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Open(daemon.stub(), "m", "s", 50).ok());
  const std::string fresh = ArenaName(daemon, "m");
  EXPECT_NE(fresh, arena);
  daemon.process().Signal(SIGKILL);
  EXPECT_EQ(daemon.process().WaitExit(10000), -1);
  std::filesystem::remove_all(dir);
  shm_unlink(fresh.c_str());
}

// Pool pressure's state survives kill -9: a sequence's tenant, priority, server-chosen budget
// and quota (still applied by its owner's next call, by the recovered page shares), and a
// swapped-out sequence, resumed after the restart with its bytes.
TEST(CrashRecoveryTest, QuotasTenantsAndSwappedSequencesSurviveKillNine) {
  const std::string dir = FreshDir("crash_pressure");
  const std::vector<std::string> flags = {"--tenant_share=gold=0.5", "--target_occupancy=1"};
  constexpr uint64_t kFrameBytes = 2 * 16 * 8 * 2;
  std::string arena;
  std::vector<v1::FrameAssignment> swapped_frames;
  {
    Daemon daemon(dir, flags);
    ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
    auto& stub = daemon.stub();
    {
      grpc::ClientContext context;
      v1::RegisterModelResponse response;
      ASSERT_TRUE(
          stub.RegisterModel(&context, RegisterRequest("m", 3, 8, 2, 60 * kFrameBytes), &response)
              .ok());
    }
    arena = ArenaName(daemon, "m");
    {
      grpc::ClientContext context;
      v1::OpenSequenceRequest request;
      request.set_model_id("m");
      request.set_sequence_id("a");
      request.set_initial_tokens(60);  // 4 pages x 3 layers x 2 groups: 24 frames
      request.set_tenant("gold");
      request.set_priority(3);
      request.mutable_auto_budget()->set_floor_fraction(0.25);
      v1::OpenSequenceResponse response;
      ASSERT_TRUE(stub.OpenSequence(&context, request, &response).ok());
    }
    {
      grpc::ClientContext context;
      v1::DecideRequest request;
      request.set_model_id("m");
      request.set_sequence_id("a");
      request.mutable_budget()->mutable_auto_budget()->set_floor_fraction(0.25);
      std::vector<float> values(8 * 60, 0.001f);
      for (int h = 0; h < 8; ++h) {
        for (int t = 0; t < 16; ++t) values[h * 60 + t] = 1.0f;  // page 0 holds the mass
      }
      for (int layer = 0; layer < 3; ++layer) {
        v1::LayerStatistic* in = request.add_layers();
        in->set_layer(layer);
        *in->mutable_statistic() = BytesStatistic(values, 8, 60, v1::DTYPE_FLOAT32);
      }
      v1::DecideResponse response;
      const grpc::Status decided = stub.Decide(&context, request, &response);
      ASSERT_TRUE(decided.ok()) << decided.error_message();
    }
    {
      grpc::ClientContext context;
      v1::OpenSequenceRequest request;
      request.set_model_id("m");
      request.set_sequence_id("c");
      request.set_initial_tokens(30);  // 12 frames
      v1::OpenSequenceResponse response;
      ASSERT_TRUE(stub.OpenSequence(&context, request, &response).ok());
      swapped_frames.assign(response.new_frames().begin(), response.new_frames().end());
    }
    {
      absl::StatusOr<std::unique_ptr<HostArenaMapping>> mapping =
          HostArenaMapping::OpenByName(arena);
      ASSERT_TRUE(mapping.ok()) << mapping.status();
      for (const v1::FrameAssignment& entry : swapped_frames) {
        std::memset(static_cast<char*>((*mapping)->data()) + entry.frame() * kFrameBytes,
                    static_cast<int>(1 + entry.layer() * 8 + entry.group() * 4 + entry.page()),
                    kFrameBytes);
      }
    }
    {
      grpc::ClientContext context;
      v1::SwapOutSequenceRequest request;
      request.set_model_id("m");
      request.set_sequence_id("c");
      v1::SwapOutSequenceResponse response;
      const grpc::Status swapped = stub.SwapOutSequence(&context, request, &response);
      ASSERT_TRUE(swapped.ok()) << swapped.error_message();
      EXPECT_EQ(response.freed_frames(), 12);
    }
    // 48 frames asked, 36 free: a quota of 12 on "a" (its light pages), delayed.
    EXPECT_EQ(Open(stub, "m", "b", 120).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    daemon.process().Signal(SIGKILL);
    EXPECT_EQ(daemon.process().WaitExit(10000), -1);
  }
  Daemon daemon(dir, flags);
  ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
  auto& stub = daemon.stub();
  {
    grpc::ClientContext context;
    v1::ListSequencesRequest request;
    request.set_model_id("m");
    v1::ListSequencesResponse listed;
    ASSERT_TRUE(stub.ListSequences(&context, request, &listed).ok());
    ASSERT_EQ(listed.sequences_size(), 1);  // "c" is swapped out
    const v1::SequenceInfo& a = listed.sequences(0);
    EXPECT_EQ(a.tenant(), "gold");
    EXPECT_EQ(a.priority(), 3);
    EXPECT_EQ(a.pressure().quota_frames(), 12);
    EXPECT_EQ(a.pressure().floor_frames(), 6);
  }
  {
    grpc::ClientContext context;
    v1::GetPoolStatsRequest request;
    request.set_model_id("m");
    v1::PoolStats stats;
    ASSERT_TRUE(stub.GetPoolStats(&context, request, &stats).ok());
    EXPECT_EQ(stats.sequences_swapped(), 1);
    EXPECT_EQ(stats.used_frames(), 24);
  }
  {
    grpc::ClientContext context;
    v1::AppendTokensRequest request;
    request.set_model_id("m");
    request.set_sequence_id("a");
    request.set_tokens(1);
    v1::AppendTokensResponse response;
    ASSERT_TRUE(stub.AppendTokens(&context, request, &response).ok());
    EXPECT_EQ(response.pressure().reclaimed_frames(), 12);
    for (const v1::GroupEviction& evicted : response.evicted()) {
      EXPECT_THAT(evicted.pages(), ::testing::Not(::testing::Contains(0)));
    }
  }
  {
    grpc::ClientContext context;
    v1::ResumeSequenceRequest request;
    request.set_model_id("m");
    request.set_sequence_id("c");
    v1::ResumeSequenceResponse response;
    const grpc::Status resumed = stub.ResumeSequence(&context, request, &response);
    ASSERT_TRUE(resumed.ok()) << resumed.error_message();
    ASSERT_EQ(response.new_frames_size(), 12);
    absl::StatusOr<std::unique_ptr<HostArenaMapping>> mapping = HostArenaMapping::OpenByName(arena);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    for (const v1::FrameAssignment& entry : response.new_frames()) {
      const auto* bytes =
          static_cast<const unsigned char*>((*mapping)->data()) + entry.frame() * kFrameBytes;
      EXPECT_EQ(bytes[0], 1 + entry.layer() * 8 + entry.group() * 4 + entry.page());
      EXPECT_EQ(bytes[kFrameBytes - 1], bytes[0]);
    }
  }
  daemon.process().Signal(SIGKILL);
  EXPECT_EQ(daemon.process().WaitExit(10000), -1);
  std::filesystem::remove_all(dir);
  shm_unlink(arena.c_str());
}

// UnregisterModel is for good: the model's records leave the journal, so a restart does not
// bring it back, and its host arena's kept name is unlinked; another model is untouched.
TEST(CrashRecoveryTest, AnUnregisteredModelStaysGoneAfterARestart) {
  const std::string dir = FreshDir("crash_unregister");
  std::string gone_arena;
  std::string kept_arena;
  {
    Daemon daemon(dir);
    ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
    Register(daemon, "gone", v1::FRAME_LAYOUT_GROUP);
    Register(daemon, "kept", v1::FRAME_LAYOUT_GROUP);
    ASSERT_TRUE(Open(daemon.stub(), "gone", "s", 50).ok());
    ASSERT_TRUE(Open(daemon.stub(), "kept", "s", 50).ok());
    gone_arena = ArenaName(daemon, "gone");
    kept_arena = ArenaName(daemon, "kept");
    grpc::ClientContext context;
    v1::UnregisterModelRequest request;
    request.set_model_id("gone");
    request.set_force(true);
    v1::UnregisterModelResponse response;
    ASSERT_TRUE(daemon.stub().UnregisterModel(&context, request, &response).ok());
    EXPECT_FALSE(ShmExists(gone_arena));
    daemon.process().Signal(SIGKILL);
    EXPECT_EQ(daemon.process().WaitExit(10000), -1);
  }
  Daemon daemon(dir);
  ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
  grpc::ClientContext context;
  v1::GetModelRequest request;
  request.set_model_id("gone");
  v1::GetModelResponse response;
  EXPECT_EQ(daemon.stub().GetModel(&context, request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ArenaName(daemon, "kept"), kept_arena);
  EXPECT_EQ(Append(daemon.stub(), "kept", "s", 1).error_code(), grpc::StatusCode::OK);
  daemon.process().Signal(SIGKILL);
  EXPECT_EQ(daemon.process().WaitExit(10000), -1);
  std::filesystem::remove_all(dir);
  shm_unlink(kept_arena.c_str());
}

TEST(CrashRecoveryTest, DamagedJournalStopsTheStartWithExitTwo) {
  const std::string dir = FreshDir("crash_corrupt");
  std::string arena;
  {
    Daemon daemon(dir);
    ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
    Register(daemon, "m", v1::FRAME_LAYOUT_GROUP);
    for (int i = 0; i < 20; ++i)
      ASSERT_TRUE(Open(daemon.stub(), "m", absl::StrCat("s", i), 40).ok());
    arena = ArenaName(daemon, "m");
    daemon.process().Signal(SIGKILL);
    EXPECT_EQ(daemon.process().WaitExit(10000), -1);
  }
  int corrupted = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/journal")) {
    if (entry.path().extension() != ".log") continue;
    const auto size = std::filesystem::file_size(entry.path());
    std::fstream file(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(size / 2));
    file.write("\xde\xad\xbe\xef\xde\xad\xbe\xef", 8);
    ++corrupted;
  }
  ASSERT_GT(corrupted, 0);
  DaemonProcess daemon(ENTROKVD_PATH, Args(dir));
  EXPECT_EQ(daemon.WaitExit(20000), 2);
  EXPECT_THAT(daemon.Stderr(), HasSubstr("--state_dir"));
  EXPECT_THAT(daemon.Stderr(), HasSubstr("damaged"));
  std::filesystem::remove_all(dir);
  shm_unlink(arena.c_str());
}

TEST(CrashRecoveryTest, WithoutStateDirKilledDaemonsLeaveNoArenas) {
  std::string dead_arena;
  {
    Daemon daemon("");
    ASSERT_TRUE(daemon.listening()) << daemon.process().Stderr();
    Register(daemon, "m", v1::FRAME_LAYOUT_GROUP);
    dead_arena = ArenaName(daemon, "m");
    ASSERT_TRUE(ShmExists(dead_arena));
    daemon.process().Signal(SIGKILL);
    EXPECT_EQ(daemon.process().WaitExit(10000), -1);
  }
  // kill -9 ran no destructor, so the arena is left until a daemon starts. ctest runs other
  // tests beside this one, and any daemon they start removes it too: that is the behaviour under
  // test, so it may be gone already here. When it is not, this test's own start must remove it.
  const bool left_by_the_kill = ShmExists(dead_arena);
  // A live daemon's arenas stay while another starts; the dead one's go.
  Daemon live("");
  ASSERT_TRUE(live.listening()) << live.process().Stderr();
  Register(live, "m", v1::FRAME_LAYOUT_GROUP);
  const std::string live_arena = ArenaName(live, "m");
  EXPECT_FALSE(ShmExists(dead_arena)) << "left by the kill: " << left_by_the_kill;
  Daemon another("");
  ASSERT_TRUE(another.listening()) << another.process().Stderr();
  EXPECT_TRUE(ShmExists(live_arena));
  another.process().Signal(SIGTERM);
  EXPECT_EQ(another.process().WaitExit(20000), 0);
  live.process().Signal(SIGTERM);
  EXPECT_EQ(live.process().WaitExit(20000), 0);
  EXPECT_FALSE(ShmExists(live_arena));  // a clean exit removes its own
}

}  // namespace
}  // namespace entrokv::service
