// The --state_dir journal: a CacheState rebuilt from what the journal recorded is the one that
// was journaled (lengths, block tables, reference counts, free frames, cached weights), and a
// damaged store is refused, never trusted.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/pool/cache_state.h"
#include "core/testing/status_matchers.h"
#include "core/util/page_count.h"
#include "core/util/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/model_journal.h"
#include "store/records.h"
#include "store/recovery.h"
#include "store/state_store.h"
#include "store/sync_mark.h"

namespace entrokv::store {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/store_test.", name, ".", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

ModelRecord Model(FrameLayout layout, int64_t frames) {
  ModelRecord model;
  model.model_id = "m";
  model.geometry = {.layers = 3,
                    .query_heads = 4,
                    .kv_groups = 2,
                    .head_dim = 4,
                    .page_size = 4,
                    .element_bytes = 2};
  model.layout = layout;
  model.capacity_bytes = frames * FrameBytes(model.geometry, layout);
  return model;
}

std::unique_ptr<CacheState> NewState(const ModelRecord& model,
                                     const PressureOptions& pressure = PressureOptions()) {
  CacheOptions options;
  options.geometry = model.geometry;
  options.layout = model.layout;
  options.capacity_bytes = model.capacity_bytes;
  options.name = "store_test";
  options.pressure = pressure;
  absl::StatusOr<std::unique_ptr<CacheState>> state = CacheState::Create(options);
  EXPECT_THAT(state, IsOk());
  return *std::move(state);
}

// Everything recovery must bring back, in a comparable form.
struct Observed {
  std::vector<std::string> ids;
  std::vector<int64_t> lengths;
  std::vector<int64_t> live;
  std::vector<std::vector<std::vector<std::vector<FrameId>>>> tables;
  std::vector<std::vector<std::vector<double>>> weights;
  std::vector<std::vector<std::vector<float>>> running_sums;
  int64_t used = 0;
  int64_t free = 0;
  std::vector<int64_t> used_per_layer;
  bool operator==(const Observed&) const = default;
};

Observed Observe(const CacheState& state) {
  Observed out;
  for (const SequenceInfo& info : state.ListSequences(/*with_block_tables=*/true)) {
    out.ids.push_back(info.id);
    out.lengths.push_back(info.length);
    out.live.push_back(info.live_frames);
    out.tables.push_back(info.block_tables);
    std::vector<std::vector<double>> weights;
    for (int layer = 0; layer < state.geometry().layers; ++layer) {
      weights.push_back(*state.GetHeadWeights(info.id, layer));
    }
    out.weights.push_back(std::move(weights));
    std::vector<std::vector<float>> sums;
    for (int layer = 0; layer < state.geometry().layers; ++layer) {
      sums.push_back(*state.RunningSum(info.id, layer));
    }
    out.running_sums.push_back(std::move(sums));
  }
  const PoolStats stats = state.Stats();
  out.used = stats.used_frames;
  out.free = stats.free_frames;
  out.used_per_layer = stats.used_frames_per_layer;
  return out;
}

// Random opens, forks, appends, decisions (some with a chunk's running sum), weights,
// truncations and closes (fixed seed); errors such as an exhausted pool are part of the
// workload.
void RandomWorkload(CacheState& state, uint32_t seed, int steps) {
  std::mt19937 rng(seed);
  const ModelGeometry& g = state.geometry();
  int next_id = 0;
  for (int step = 0; step < steps; ++step) {
    const std::vector<SequenceInfo> open = state.ListSequences(false);
    const int op = static_cast<int>(rng() % 8);
    if (op == 0 || open.empty()) {
      (void)state.OpenSequence(absl::StrCat("s", next_id++), rng() % 20);
      continue;
    }
    const SequenceInfo& pick = open[rng() % open.size()];
    const int64_t pages = PageCount(pick.length, g.page_size);
    switch (op) {
      case 1:
        (void)state.ForkSequence(absl::StrCat("s", next_id++), pick.id,
                                 static_cast<int64_t>(rng() % (pages + 1)));
        break;
      case 2:
        (void)state.AppendTokens(pick.id, 1 + rng() % 9);
        break;
      case 3: {
        std::vector<std::vector<int32_t>> kept(g.kv_groups);
        for (auto& pages_kept : kept) {
          for (int32_t page = 0; page < pages; ++page) {
            if (rng() % 3 != 0) pages_kept.push_back(page);
          }
        }
        ASSERT_THAT(
            state.ApplyDecision(pick.id, static_cast<int32_t>(rng() % g.layers), pick.length, kept),
            IsOk());
        break;
      }
      case 4: {
        std::vector<double> weights(g.query_heads);
        for (double& w : weights) w = static_cast<double>(rng() % 1000) / 7.0;
        ASSERT_THAT(state.SetHeadWeights(pick.id, static_cast<int32_t>(rng() % g.layers), weights),
                    IsOk());
        break;
      }
      case 5:
        ASSERT_THAT(state.CloseSequence(pick.id), IsOk());
        break;
      case 6:
        if (pick.length > 0) {
          ASSERT_THAT(state.TruncateSequence(pick.id, 1 + rng() % pick.length).status(), IsOk());
        }
        break;
      case 7: {
        std::vector<LayerKeep> keep(1);
        keep[0].layer = static_cast<int32_t>(rng() % g.layers);
        keep[0].kept_pages_per_group.resize(g.kv_groups);
        for (auto& pages_kept : keep[0].kept_pages_per_group) {
          for (int32_t page = 0; page < pages; ++page) pages_kept.push_back(page);
        }
        std::vector<float> sum(static_cast<size_t>(g.query_heads * pick.length));
        for (float& value : sum) value = static_cast<float>(rng() % 1000) / 3.0f;
        keep[0].running_sum = std::move(sum);
        ASSERT_THAT(state.ApplyDecisions(pick.id, pick.length, std::move(keep)).status(), IsOk());
        break;
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<CacheState>> Recover(const std::string& dir,
                                                    const ModelRecord& model) {
  ASSIGN_OR_RETURN(std::unique_ptr<StateStore> store, StateStore::Open(dir, absl::Seconds(1)));
  ASSIGN_OR_RETURN(std::vector<RecoveredModel> models, LoadState(*store));
  if (models.size() != 1) return absl::InternalError("expected one model");
  std::unique_ptr<CacheState> state = NewState(model);
  RETURN_IF_ERROR(state->Restore(std::move(models[0].sequences)));
  return state;
}

class RecoveryTest : public ::testing::TestWithParam<FrameLayout> {};

TEST_P(RecoveryTest, RestoredStateEqualsTheJournaledOne) {
  const std::string dir = FreshDir(absl::StrCat("equal", static_cast<int>(GetParam())));
  const ModelRecord model = Model(GetParam(), 120);
  Observed before;
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store,
                                 StateStore::Open(dir, absl::Milliseconds(5)));
    ASSERT_THAT(RecordModel(*store, model), IsOk());
    ModelJournal journal(store.get(), model.model_id, model.geometry);
    std::unique_ptr<CacheState> state = NewState(model);
    state->SetJournal(&journal);
    RandomWorkload(*state, /*seed=*/7, 400);
    ASSERT_THAT(state->CheckInvariants(), IsOk());
    before = Observe(*state);
    ASSERT_GT(before.ids.size(), 2u);
    ASSERT_GT(before.used, 0);
    state->SetJournal(nullptr);
  }
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CacheState> after, Recover(dir, model));
  EXPECT_THAT(after->CheckInvariants(), IsOk());  // refcounts == block-table references
  const Observed recovered = Observe(*after);
  EXPECT_EQ(recovered.ids, before.ids);
  EXPECT_EQ(recovered.lengths, before.lengths);
  EXPECT_EQ(recovered.tables, before.tables);
  EXPECT_EQ(recovered.weights, before.weights);
  EXPECT_EQ(recovered.running_sums, before.running_sums);
  EXPECT_TRUE(recovered == before);
  EXPECT_EQ(recovered.used + recovered.free, 120);
  // The recovered pool keeps working: a new sequence gets free frames, closing all frees all.
  for (const std::string& id : recovered.ids) ASSERT_THAT(after->CloseSequence(id), IsOk());
  EXPECT_EQ(after->Stats().used_frames, 0);
  const int64_t frames_per_page =
      model.geometry.layers * (GetParam() == FrameLayout::kGroup ? model.geometry.kv_groups : 1);
  ASSERT_THAT(after->OpenSequence("new", 120 / frames_per_page * model.geometry.page_size),
              IsOk());  // every frame
  EXPECT_EQ(after->Stats().free_frames, 0);
  ASSERT_THAT(after->CloseSequence("new"), IsOk());
  EXPECT_EQ(after->Stats().used_frames, 0);
  EXPECT_THAT(after->CheckInvariants(), IsOk());
}

INSTANTIATE_TEST_SUITE_P(Layouts, RecoveryTest,
                         ::testing::Values(FrameLayout::kGroup, FrameLayout::kLayer));

// A truncation rewrites the chunk that now holds the last page and drops the chunks after it;
// whatever the cut (inside a chunk, on a chunk's edge, to nothing), the journal holds exactly
// the chunks recovery expects and the state comes back as it was.
TEST(RecoveryTest, TruncationsAcrossChunksRecoverExactly) {
  const ModelRecord model = Model(FrameLayout::kGroup, 2000);
  for (const int64_t remaining : {299, 257, 256, 100, 3, 0}) {
    SCOPED_TRACE(absl::StrCat("truncated to ", remaining, " tokens"));
    const std::string dir = FreshDir(absl::StrCat("truncate", remaining));
    Observed before;
    {
      ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::ZeroDuration()));
      ASSERT_THAT(RecordModel(*store, model), IsOk());
      ModelJournal journal(store.get(), model.model_id, model.geometry);
      std::unique_ptr<CacheState> state = NewState(model);
      state->SetJournal(&journal);
      ASSERT_THAT(state->OpenSequence("a", 300), IsOk());  // 75 pages: chunks 0 and 1
      std::vector<LayerKeep> keep(1);
      keep[0].layer = 1;
      keep[0].kept_pages_per_group.assign(2, {0, 70, 74});
      std::vector<float> sum(4 * 300);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = static_cast<float>(i);
      keep[0].running_sum = sum;
      ASSERT_THAT(state->ApplyDecisions("a", 300, std::move(keep)).status(), IsOk());
      ASSERT_THAT(state->TruncateSequence("a", 300 - remaining).status(), IsOk());
      before = Observe(*state);
      ASSERT_EQ(before.running_sums[0][1].size(), static_cast<size_t>(4 * remaining));
      if (remaining > 0) {
        EXPECT_EQ(before.running_sums[0][1][remaining], 300.0f);  // head 1's first column
      }
      state->SetJournal(nullptr);
    }
    ENTROKV_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CacheState> after, Recover(dir, model));
    EXPECT_THAT(after->CheckInvariants(), IsOk());
    EXPECT_TRUE(Observe(*after) == before);
  }
}

TEST(RecoveryTest, ClosedSequencesLeaveNoRecords) {
  const std::string dir = FreshDir("closed");
  const ModelRecord model = Model(FrameLayout::kGroup, 500);
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::ZeroDuration()));
    ASSERT_THAT(RecordModel(*store, model), IsOk());
    ModelJournal journal(store.get(), model.model_id, model.geometry);
    std::unique_ptr<CacheState> state = NewState(model);
    state->SetJournal(&journal);
    ASSERT_THAT(state->OpenSequence("a", 300), IsOk());  // 75 pages: two chunks per layer
    ASSERT_THAT(state->SetHeadWeights("a", 1, {1, 2, 3, 4}), IsOk());
    std::vector<LayerKeep> keep(1);
    keep[0].layer = 2;
    keep[0].kept_pages_per_group.assign(2, {0, 1});
    keep[0].running_sum = std::vector<float>(4 * 300, 1.0f);
    ASSERT_THAT(state->ApplyDecisions("a", 300, std::move(keep)).status(), IsOk());
    ASSERT_THAT(state->CloseSequence("a"), IsOk());
    int records = 0;
    ASSERT_THAT(store->Scan("",
                            [&records](absl::string_view key, absl::string_view) {
                              ++records;
                              return absl::OkStatus();
                            }),
                IsOk());
    EXPECT_EQ(records, 4);  // format, instance, write number, model
    state->SetJournal(nullptr);
  }
}

TEST(RecoveryTest, LostSequencesAnswerFailedPreconditionUntilClosed) {
  const std::string dir = FreshDir("lost");
  ModelRecord model = Model(FrameLayout::kGroup, 64);
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::ZeroDuration()));
    ASSERT_THAT(RecordModel(*store, model), IsOk());
    ModelJournal journal(store.get(), model.model_id, model.geometry);
    std::unique_ptr<CacheState> state = NewState(model);
    state->SetJournal(&journal);
    ASSERT_THAT(state->OpenSequence("a", 9), IsOk());
    ASSERT_THAT(state->OpenSequence("b", 9), IsOk());
    state->SetJournal(nullptr);
    ASSERT_THAT(RecordLoss(*store, model, {"a", "b"}, "the arena died"), IsOk());
  }
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::ZeroDuration()));
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::vector<RecoveredModel> models, LoadState(*store));
  ASSERT_EQ(models.size(), 1u);
  EXPECT_TRUE(models[0].sequences.empty());
  ASSERT_EQ(models[0].lost.size(), 2u);
  std::unique_ptr<CacheState> state = NewState(model);
  ModelJournal journal(store.get(), model.model_id, model.geometry);
  state->SetJournal(&journal);
  for (const auto& [id, reason] : models[0].lost) state->MarkLost({id}, reason);
  EXPECT_EQ(state->Stats().sequences_lost, 2);
  EXPECT_THAT(state->AppendTokens("a", 1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"a\" was lost when entrokvd restarted: the arena died")));
  EXPECT_THAT(state->CloseSequence("a"), IsOk());  // the client acknowledges the loss
  EXPECT_THAT(state->AppendTokens("a", 1), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(state->OpenSequence("b", 3), IsOk());  // reopening starts it afresh
  state->SetJournal(nullptr);
  ENTROKV_ASSERT_OK_AND_ASSIGN(models, LoadState(*store));
  EXPECT_TRUE(models[0].lost.empty());
  ASSERT_EQ(models[0].sequences.size(), 1u);
  EXPECT_EQ(models[0].sequences[0].length, 3);
}

TEST(RecoveryTest, DeleteModelRemovesItsRecordsOnly) {
  const std::string dir = FreshDir("delete_model");
  ModelRecord first = Model(FrameLayout::kGroup, 64);
  ModelRecord second = first;
  second.model_id = "m2";  // "m" is a prefix of "m2": the length prefix keeps them apart
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::Seconds(1)));
  std::vector<std::unique_ptr<ModelJournal>> journals;
  std::vector<std::unique_ptr<CacheState>> states;
  for (const ModelRecord& model : {first, second}) {
    ASSERT_THAT(RecordModel(*store, model), IsOk());
    journals.push_back(std::make_unique<ModelJournal>(store.get(), model.model_id, model.geometry));
    states.push_back(NewState(model));
    states.back()->SetJournal(journals.back().get());
    ASSERT_THAT(states.back()->OpenSequence("s", 9), IsOk());
    ASSERT_THAT(states.back()->SetHeadWeights("s", 0, {1, 2, 3, 4}), IsOk());
  }
  for (auto& state : states) state->SetJournal(nullptr);
  ASSERT_THAT(DeleteModel(*store, "m"), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::vector<RecoveredModel> models, LoadState(*store));
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].model.model_id, "m2");
  ASSERT_EQ(models[0].sequences.size(), 1u);
  EXPECT_EQ(models[0].sequences[0].length, 9);
}

// Writes a model with sequences and closes the store; `reopen` also reopens it once, which
// moves LevelDB's log into a table file.
void WriteSomeState(const std::string& dir, bool reopen) {
  const ModelRecord model = Model(FrameLayout::kGroup, 120);
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::Seconds(1)));
    ASSERT_THAT(RecordModel(*store, model), IsOk());
    ModelJournal journal(store.get(), model.model_id, model.geometry);
    std::unique_ptr<CacheState> state = NewState(model);
    state->SetJournal(&journal);
    RandomWorkload(*state, /*seed=*/11, 200);
    state->SetJournal(nullptr);
  }
  if (reopen) {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::Seconds(1)));
  }
}

// Overwrites 16 bytes in the middle of every file whose name ends with `suffix` (or, for a
// suffix ending in '-', starts with it).
int CorruptFiles(const std::string& dir, const std::string& suffix) {
  int corrupted = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/journal")) {
    const std::string name = entry.path().filename().string();
    const bool match =
        suffix.back() == '-'
            ? name.rfind(suffix, 0) == 0
            : name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
    if (!match) continue;
    const auto size = std::filesystem::file_size(entry.path());
    if (size < 64) continue;
    std::fstream file(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(size / 2));
    file.write("\xde\xad\xbe\xef\xde\xad\xbe\xef\xde\xad\xbe\xef\xde\xad\xbe\xef", 16);
    ++corrupted;
  }
  return corrupted;
}

absl::Status OpenAndLoad(const std::string& dir) {
  ASSIGN_OR_RETURN(auto store, StateStore::Open(dir, absl::ZeroDuration()));
  return LoadState(*store).status();
}

TEST(CorruptionTest, DamagedLogIsRefused) {
  const std::string dir = FreshDir("bad_log");
  WriteSomeState(dir, /*reopen=*/false);
  ASSERT_GT(CorruptFiles(dir, ".log"), 0);
  EXPECT_THAT(OpenAndLoad(dir), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("--state_dir")));
}

TEST(CorruptionTest, DamagedTableIsRefused) {
  const std::string dir = FreshDir("bad_table");
  WriteSomeState(dir, /*reopen=*/true);
  ASSERT_GT(CorruptFiles(dir, ".ldb"), 0);
  EXPECT_THAT(OpenAndLoad(dir), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("--state_dir")));
}

TEST(CorruptionTest, MissingOrDamagedManifestIsRefused) {
  const std::string dir = FreshDir("bad_manifest");
  WriteSomeState(dir, /*reopen=*/true);
  std::filesystem::remove(dir + "/journal/CURRENT");
  EXPECT_THAT(OpenAndLoad(dir), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("--state_dir")));
  const std::string dir2 = FreshDir("bad_manifest2");
  WriteSomeState(dir2, /*reopen=*/true);
  ASSERT_GT(CorruptFiles(dir2, "MANIFEST-"), 0);
  EXPECT_THAT(OpenAndLoad(dir2), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("--state_dir")));
}

TEST(CorruptionTest, ForeignOrInconsistentRecordsAreRefused) {
  const std::string dir = FreshDir("foreign");
  WriteSomeState(dir, /*reopen=*/false);
  {
    // Records that pass LevelDB's checksums but are not the journal's: a chunk with no
    // sequence, a model record that does not parse, an unknown key.
    leveldb::Options options;
    leveldb::DB* raw = nullptr;
    ASSERT_TRUE(leveldb::DB::Open(options, dir + "/journal", &raw).ok());
    std::unique_ptr<leveldb::DB> db(raw);
    ASSERT_TRUE(db->Put({}, ChunkKey("m", "ghost", 0, 0), std::string(8, '\0')).ok());
  }
  EXPECT_THAT(OpenAndLoad(dir), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ghost")));
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {ModelKey("m"), "garbage"}, {"Zzz", "?"}, {kFormatKey, "other-format"}}) {
    const std::string dir2 = FreshDir("foreign2");
    WriteSomeState(dir2, /*reopen=*/false);
    {
      leveldb::Options options;
      leveldb::DB* raw = nullptr;
      ASSERT_TRUE(leveldb::DB::Open(options, dir2 + "/journal", &raw).ok());
      std::unique_ptr<leveldb::DB> db(raw);
      ASSERT_TRUE(db->Put({}, key, value).ok());
    }
    EXPECT_THAT(OpenAndLoad(dir2), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("--state_dir")))
        << key;
  }
}

// Pool pressure's state: terms (tenant, priority, server-chosen budget, quota), page shares and a
// swapped-out sequence come back from the journal, and act as before the restart: the quota is
// applied by the owner's next call, the swapped sequence resumes with its bytes.
TEST(RecoveryTest, PressureTermsSharesAndSwappedSequencesSurvive) {
  const std::string dir = FreshDir("pressure");
  ModelRecord model = Model(FrameLayout::kGroup, 60);
  model.geometry.layers = 1;
  model.capacity_bytes = 60 * FrameBytes(model.geometry, FrameLayout::kGroup);
  int counter = 0;
  PressureOptions pressure;
  pressure.target_occupancy = 1.0;
  pressure.tenants = {{"gold", 0.5}};
  pressure.max_swap_bytes = int64_t{1} << 20;
  const std::string prefix = absl::StrCat("/entrokv.store-test-", getpid(), "-swap-");
  pressure.swap_arena = [&counter, &prefix] {
    return HostArenaSource{
        .name = absl::StrCat(prefix, counter++), .attach = false, .keep_name = true};
  };
  const int64_t frame_bytes = FrameBytes(model.geometry, FrameLayout::kGroup);
  std::vector<float> c_sum(static_cast<size_t>(model.geometry.query_heads) * 14);
  for (size_t i = 0; i < c_sum.size(); ++i) c_sum[i] = 0.5f + static_cast<float>(i);
  std::string swap_name;
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::ZeroDuration()));
    ASSERT_THAT(RecordModel(*store, model), IsOk());
    ModelJournal journal(store.get(), model.model_id, model.geometry);
    std::unique_ptr<CacheState> state = NewState(model, pressure);
    state->SetJournal(&journal);
    ASSERT_THAT(state->OpenSequence(
                    "a", 30, SequenceTerms{.tenant = "gold", .priority = 3, .auto_floor = 0.25}),
                IsOk());  // 8 pages, 16 frames
    std::vector<float> scores(8, 0.01f);
    scores[0] = 1.0f;
    const std::vector<AutoLayer> layers = {{.layer = 0, .page_scores = {scores, scores}}};
    ASSERT_THAT(state->ApplyAutoDecision("a", 30, layers, AutoTerms()).status(), IsOk());
    ASSERT_THAT(state->OpenSequence("c", 14), IsOk());  // 4 pages, 8 frames
    // A chunked prefill's running sum, kept with a decision that keeps every page: it travels
    // with the swapped-out sequence.
    LayerKeep keep;
    keep.layer = 0;
    keep.kept_pages_per_group = {{0, 1, 2, 3}, {0, 1, 2, 3}};
    keep.running_sum = c_sum;
    ASSERT_THAT(state->ApplyDecisions("c", 14, {keep}).status(), IsOk());
    ENTROKV_ASSERT_OK_AND_ASSIGN(const SequenceInfo c, state->GetSequence("c", true));
    for (const FrameId frame : c.block_tables[0][0]) {
      std::memset(state->FrameAddress(frame), 0x5a, static_cast<size_t>(frame_bytes));
    }
    ASSERT_THAT(state->SwapOut("c").status(), IsOk());
    ASSERT_THAT(state->OpenSequence("b", 0), IsOk());
    // 48 frames asked, 44 free: a's quota gives the other 4 (at its owner's next call).
    EXPECT_THAT(
        state->AppendTokens("b", 4 * 24, AppendOptions{.admission = true, .refusal = nullptr})
            .status(),
        StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
    ASSERT_THAT(state->CloseSequence("b"), IsOk());
    ASSERT_EQ(state->Pressure("a")->quota_frames, 12);
    swap_name = state->SwapArenaNames().at(0);
    state->SetJournal(nullptr);
  }  // the daemon dies: its swap arena stays under its name, as a --state_dir pool's does
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::Seconds(1)));
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::vector<RecoveredModel> models, LoadState(*store));
  ASSERT_EQ(models.size(), 1u);
  ASSERT_EQ(models[0].swapped.size(), 1u);
  EXPECT_EQ(models[0].swapped[0].arena_name, swap_name);
  std::unique_ptr<CacheState> state = NewState(model, pressure);
  ASSERT_THAT(state->Restore(std::move(models[0].sequences), std::move(models[0].swapped)), IsOk());
  const SequenceInfo a = *state->GetSequence("a", false);
  EXPECT_EQ(a.tenant, "gold");
  EXPECT_EQ(a.priority, 3);
  EXPECT_EQ(a.pressure.quota_frames, 12);
  EXPECT_EQ(a.pressure.floor_frames, 4);
  EXPECT_THAT(state->SwappedIds(), ::testing::ElementsAre("c"));
  // The recovered shares still rank the pages: the owner's append gives the light ones.
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult owner, state->AppendTokens("a", 1));
  EXPECT_EQ(owner.reclaimed_frames, 4);
  for (const AppendResult::Evicted& evicted : owner.evicted) {
    EXPECT_THAT(evicted.pages, ::testing::Not(::testing::Contains(0)));
  }
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult resumed, state->Resume("c", nullptr));
  EXPECT_EQ(*state->RunningSum("c", 0), c_sum);
  for (const FrameAssignment& entry : resumed.new_frames) {
    if (entry.group != 0) continue;
    const auto* bytes = static_cast<const unsigned char*>(state->FrameAddress(entry.frame));
    EXPECT_EQ(bytes[0], 0x5a);
    EXPECT_EQ(bytes[frame_bytes - 1], 0x5a);
  }
  EXPECT_THAT(state->CheckInvariants(), IsOk());
  EXPECT_EQ(::shm_unlink(swap_name.c_str()), -1) << "the resumed sequence's arena was left behind";
}

TEST(RecordsTest, PressureRecordsRoundTripAndGarbageIsRefused) {
  SequencePressure terms;
  terms.tenant = "gold";
  terms.priority = 9;
  terms.auto_budget = true;
  terms.floor_fraction = 0.3;
  terms.quota_frames = 77;
  terms.quota_reason = ReclaimReason::kTarget;
  terms.admitted = 12345;
  terms.preempt = true;
  terms.protect_tail = false;
  terms.sink_pages = 2;
  terms.recent_pages = 3;
  terms.shares = {{0.5f, kUnscored}, {0.25f, 0.75f}};
  ENTROKV_ASSERT_OK_AND_ASSIGN(SequencePressure back, DecodeTerms(EncodeTerms(terms)));
  EXPECT_EQ(back.tenant, "gold");
  EXPECT_EQ(back.priority, 9);
  EXPECT_TRUE(back.auto_budget);
  EXPECT_EQ(back.floor_fraction, 0.3);
  EXPECT_EQ(back.quota_frames, 77);
  EXPECT_EQ(back.quota_reason, ReclaimReason::kTarget);
  EXPECT_EQ(back.admitted, 12345);
  EXPECT_TRUE(back.preempt);
  EXPECT_FALSE(back.protect_tail);
  EXPECT_EQ(back.sink_pages, 2);
  EXPECT_EQ(back.recent_pages, 3);
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto shares, DecodeShares(EncodeShares(terms, 0, 2), 2, 100));
  EXPECT_EQ(shares, terms.shares);
  EXPECT_THAT(DecodeShares(EncodeShares(terms, 0, 2), 3, 100),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("group count")));
  EXPECT_THAT(DecodeShares(EncodeShares(terms, 0, 2), 2, 1),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  const std::string whole = EncodeTerms(terms);
  EXPECT_THAT(DecodeTerms(whole.substr(0, whole.size() - 1)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  terms.priority = 10;
  EXPECT_THAT(DecodeTerms(EncodeTerms(terms)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("out of range")));
  SwappedSnapshot swapped{.id = "s",
                          .length = 9,
                          .slots = {{0, -1, 1}, {2, 3, -1}},
                          .slot_count = 4,
                          .head_weights = {{0.5, 0.5}},
                          .running_sums = {{1.5f, 2.5f, 3.5f, 4.5f}},
                          .arena_name = "/entrokv.x",
                          .pressure = std::nullopt};
  ENTROKV_ASSERT_OK_AND_ASSIGN(SwappedSnapshot round, DecodeSwapped(EncodeSwapped(swapped)));
  EXPECT_EQ(round.length, 9);
  EXPECT_EQ(round.slots, swapped.slots);
  EXPECT_EQ(round.slot_count, 4);
  EXPECT_EQ(round.head_weights, swapped.head_weights);
  EXPECT_EQ(round.running_sums, swapped.running_sums);
  EXPECT_EQ(round.arena_name, "/entrokv.x");
  const std::string encoded = EncodeSwapped(swapped);
  EXPECT_THAT(DecodeSwapped(encoded.substr(0, encoded.size() - 3)),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  EXPECT_THAT(DecodeSwapped(encoded + "x"), StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
}

TEST(CorruptionTest, PressureRecordsWithoutTheirSequenceAreRefused) {
  for (const RecordKind kind : {RecordKind::kTerms, RecordKind::kSwapped}) {
    const std::string dir = FreshDir(absl::StrCat("orphan", static_cast<int>(kind)));
    WriteSomeState(dir, /*reopen=*/false);
    {
      leveldb::Options options;
      leveldb::DB* raw = nullptr;
      ASSERT_TRUE(leveldb::DB::Open(options, dir + "/journal", &raw).ok());
      std::unique_ptr<leveldb::DB> db(raw);
      const std::string value =
          kind == RecordKind::kTerms ? EncodeTerms(SequencePressure()) : "garbage";
      ASSERT_TRUE(db->Put({}, SequenceKey(kind, "m", "ghost"), value).ok());
    }
    EXPECT_THAT(OpenAndLoad(dir), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ghost")));
  }
}

TEST(CorruptionTest, RestoreRefusesFramesThePoolCannotHold) {
  const ModelRecord model = Model(FrameLayout::kGroup, 8);
  std::unique_ptr<CacheState> state = NewState(model);
  SequenceSnapshot snapshot;
  snapshot.id = "s";
  snapshot.length = 4;                                // one page
  snapshot.tables = {{0}, {1}, {2}, {3}, {4}, {99}};  // frame 99 is beyond the pool
  snapshot.head_weights.assign(3, {});
  EXPECT_THAT(state->Restore({snapshot}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("frame 99")));
  snapshot.tables[5] = {5};
  snapshot.tables[2] = {0};  // frame 0 named by layers 0 and 1
  EXPECT_THAT(state->Restore({snapshot}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("named by layers")));
  EXPECT_EQ(state->Stats().used_frames, 0);  // nothing changed
  EXPECT_THAT(state->CheckInvariants(), IsOk());
}

TEST(CorruptionTest, RunningSumsThatDoNotFitTheSequenceAreRefused) {
  const ModelRecord model = Model(FrameLayout::kGroup, 8);
  std::unique_ptr<CacheState> state = NewState(model);
  SequenceSnapshot snapshot;
  snapshot.id = "s";
  snapshot.length = 2;
  snapshot.tables = {{0}, {1}, {2}, {3}, {4}, {5}};
  snapshot.head_weights.assign(3, {});
  snapshot.running_sums = {{}, std::vector<float>(4 * 3, 1.0f), {}};  // 3 tokens of 2
  EXPECT_THAT(state->Restore({snapshot}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("layer 1's running sum")));
  snapshot.running_sums = {{}, std::vector<float>(7, 1.0f), {}};  // not whole heads
  EXPECT_THAT(state->Restore({snapshot}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("7 values")));
  snapshot.running_sums = {{}, {}};  // the model has 3 layers
  EXPECT_THAT(state->Restore({snapshot}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("running-sum layers")));
  EXPECT_EQ(state->Stats().used_frames, 0);
  // A record of a layer the model does not have is the journal's damage.
  const std::string dir = FreshDir("bad_sum");
  WriteSomeState(dir, /*reopen=*/false);
  {
    leveldb::Options options;
    leveldb::DB* raw = nullptr;
    ASSERT_TRUE(leveldb::DB::Open(options, dir + "/journal", &raw).ok());
    std::unique_ptr<leveldb::DB> db(raw);
    // An empty sequence (no chunks expected) with a running sum of layer 9.
    ASSERT_TRUE(db->Put({}, SequenceKey(RecordKind::kSequence, "m", "ghost"), EncodeInt64(0)).ok());
    ASSERT_TRUE(db->Put({}, RunningSumKey("m", "ghost", 9), std::string(16, '\0')).ok());
  }
  EXPECT_THAT(OpenAndLoad(dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("--state_dir"), HasSubstr("running sum of layer 9"))));
}

TEST(RecordsTest, ModelRoundTripsAndGarbageIsRefused) {
  ModelRecord model = Model(FrameLayout::kLayer, 10);
  model.backend = Backend::kCuda;
  model.arena_names = {"/entrokv.dabc.m.0", "/entrokv.dabc.m.1"};
  model.devices = {2, 3};
  ENTROKV_ASSERT_OK_AND_ASSIGN(ModelRecord back, DecodeModel(EncodeModel(model)));
  EXPECT_EQ(back.model_id, model.model_id);
  EXPECT_EQ(back.geometry.query_heads, model.geometry.query_heads);
  EXPECT_EQ(back.layout, model.layout);
  EXPECT_EQ(back.backend, model.backend);
  EXPECT_EQ(back.capacity_bytes, model.capacity_bytes);
  EXPECT_EQ(back.arena_names, model.arena_names);
  EXPECT_EQ(back.devices, model.devices);
  // A record of the first version (one arena name, no devices), as an older daemon wrote it.
  std::string v1(1, '\x01');
  auto le = [&v1](uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) v1.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  };
  auto prefixed = [&v1](const std::string& s) {
    for (int i = 3; i >= 0; --i) v1.push_back(static_cast<char>((s.size() >> (8 * i)) & 0xff));
    v1 += s;
  };
  prefixed("old");
  for (const int field : {2, 8, 2, 4, 16, 2}) le(static_cast<uint64_t>(field), 8);
  le(1, 1);  // kLayer
  le(0, 1);  // kHost
  le(4096, 8);
  prefixed("/entrokv.dabc.old.0");
  ENTROKV_ASSERT_OK_AND_ASSIGN(ModelRecord old, DecodeModel(v1));
  EXPECT_EQ(old.model_id, "old");
  EXPECT_EQ(old.geometry.kv_groups, 2);
  EXPECT_EQ(old.layout, FrameLayout::kLayer);
  EXPECT_EQ(old.capacity_bytes, 4096);
  EXPECT_EQ(old.arena_names, std::vector<std::string>{"/entrokv.dabc.old.0"});
  EXPECT_EQ(old.devices, std::vector<int>{0});
  const std::string bytes = EncodeModel(model);
  EXPECT_THAT(DecodeModel(bytes.substr(0, bytes.size() - 1)),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  EXPECT_THAT(DecodeModel(bytes + "x"), StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  EXPECT_THAT(ParseKey(ChunkKey("m", "s", 2, 5).substr(0, 9)),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  ENTROKV_ASSERT_OK_AND_ASSIGN(ParsedKey key, ParseKey(ChunkKey("m", "s", 2, 5)));
  EXPECT_EQ(key.kind, RecordKind::kTableChunk);
  EXPECT_EQ(key.model_id, "m");
  EXPECT_EQ(key.sequence_id, "s");
  EXPECT_EQ(key.layer, 2);
  EXPECT_EQ(key.chunk, 5);
}

// LoadRecords over records held in memory (what the recovery fuzzer does).
absl::StatusOr<std::vector<RecoveredModel>> LoadFrom(
    const std::vector<std::pair<std::string, std::string>>& records) {
  return LoadRecords("test", [&records](const RecordVisitor& visit) {
    for (const auto& [key, value] : records) RETURN_IF_ERROR(visit(key, value));
    return absl::OkStatus();
  });
}

// Found by tests/fuzz/recovery_fuzzer (corpus/recovery/regress-length-overflow): the page count
// of a sequence recorded with length 2**63 - 1 overflowed and recovery crashed instead of
// refusing the journal.
TEST(CorruptionTest, AnImpossibleSequenceLengthIsRefused) {
  const ModelRecord model = Model(FrameLayout::kGroup, 16);
  EXPECT_THAT(LoadFrom({{ModelKey("m"), EncodeModel(model)},
                        {SequenceKey(RecordKind::kSequence, "m", "s"),
                         EncodeInt64(std::numeric_limits<int64_t>::max())}}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("sequence length")));
}

// Found by tests/fuzz/recovery_fuzzer (corpus/recovery/regress-huge-geometry): a model recorded
// with 2**31 - 1 layers made recovery allocate tables for all of them (and abort) before any
// check; RegisterModel never makes such a model, so a journal holding one is damaged.
TEST(CorruptionTest, AGeometryBeyondRegistrationBoundsIsRefused) {
  ModelRecord model = Model(FrameLayout::kGroup, 16);
  model.geometry.layers = std::numeric_limits<int32_t>::max();
  EXPECT_THAT(LoadFrom({{ModelKey("m"), EncodeModel(model)},
                        {SequenceKey(RecordKind::kSequence, "m", "s"), EncodeInt64(0)}}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("geometry.layers")));
}

// A frame larger than one call may copy is refused at RegisterModel; a journal holding one is
// damaged.
TEST(CorruptionTest, AFrameBeyondTheBoundIsRefused) {
  ModelRecord model = Model(FrameLayout::kLayer, 16);
  model.geometry.head_dim = 65536;
  model.geometry.page_size = 1024;  // 2 x 1024 x 65536 x 2 x 2 groups = 512 MiB a frame
  EXPECT_THAT(LoadFrom({{ModelKey("m"), EncodeModel(model)}}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("frame")));
}

// `batches` numbered writes of one record each, through a store syncing every write.
void NumberedWrites(const std::string& dir, int batches) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::ZeroDuration()));
  for (int i = 0; i < batches; ++i) {
    leveldb::WriteBatch batch;
    batch.Put(ModelKey(absl::StrCat("m", i)), "x");
    ASSERT_THAT(store->Write(batch), IsOk());
  }
  EXPECT_EQ(store->last_write(), batches);
  EXPECT_EQ(store->synced_write(), batches);
}

std::filesystem::path NewestLog(const std::string& dir) {
  std::filesystem::path newest;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/journal")) {
    if (entry.path().extension() == ".log" &&
        (newest.empty() || entry.path().filename() > newest.filename())) {
      newest = entry.path();
    }
  }
  return newest;
}

// LevelDB reads a log cut anywhere in its last record as a torn tail and drops the record
// without a word. The write it held had been synced (and the sync mark says so): the journal is
// refused, again on the next try, and opens only when the loss is accepted, saying what it was.
TEST(SyncMarkTest, ALogCutShortIsRefusedUnlessTheLossIsAccepted) {
  const std::string dir = FreshDir("cut_log");
  NumberedWrites(dir, 20);
  const std::filesystem::path log = NewestLog(dir);
  ASSERT_FALSE(log.empty());
  std::filesystem::resize_file(log, std::filesystem::file_size(log) - 1);
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_THAT(StateStore::Open(dir, absl::ZeroDuration()),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("ends at write 19, but write 20 had been synced")))
        << attempt;
  }
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(
        auto store,
        StateStore::Open(dir, {.sync_interval = absl::ZeroDuration(), .accept_loss = true}));
    ASSERT_TRUE(store->rolled_back().has_value());
    EXPECT_EQ(store->rolled_back()->journal_write, 19);
    EXPECT_EQ(store->rolled_back()->mark_write, 20);
    EXPECT_THAT(store->rolled_back()->reason, HasSubstr("1 changes after it"));
    EXPECT_EQ(store->synced_write(), 19);
    leveldb::WriteBatch batch;
    batch.Put(ModelKey("after"), "x");
    ASSERT_THAT(store->Write(batch), IsOk());
    EXPECT_EQ(store->last_write(), 20);
  }
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::ZeroDuration()));
  EXPECT_FALSE(store->rolled_back().has_value());
  EXPECT_EQ(store->last_write(), 20);
}

// Without the mark nothing shows whether the journal is whole: a missing or unreadable mark
// beside a journal that was written is refused like a loss.
TEST(SyncMarkTest, AMissingOrDamagedMarkIsRefused) {
  const std::string dir = FreshDir("no_mark");
  NumberedWrites(dir, 3);
  std::filesystem::remove(dir + "/journal.mark");
  EXPECT_THAT(StateStore::Open(dir, absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("journal.mark is missing")));
  const std::string dir2 = FreshDir("bad_mark");
  NumberedWrites(dir2, 3);
  std::ofstream(dir2 + "/journal.mark", std::ios::binary | std::ios::trunc)
      << std::string(128, 'x');
  EXPECT_THAT(StateStore::Open(dir2, absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("journal.mark is damaged")));
  ENTROKV_ASSERT_OK_AND_ASSIGN(
      auto store,
      StateStore::Open(dir2, {.sync_interval = absl::ZeroDuration(), .accept_loss = true}));
  EXPECT_EQ(store->last_write(), 3);
  EXPECT_EQ(store->synced_write(), 3);
}

// A mark torn by a crash leaves the slot before it, which still holds a true mark.
TEST(SyncMarkTest, ATornSlotLeavesTheMarkBeforeIt) {
  const std::string dir = FreshDir("torn_mark");
  const std::string path = dir + "/mark";
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto mark, SyncMark::Create(path));
    ASSERT_THAT(mark->Record(5), IsOk());
    ASSERT_THAT(mark->Record(6), IsOk());  // the other slot
  }
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto mark, SyncMark::Open(path));
    EXPECT_EQ(mark->value().write, 6);
  }
  for (const int slot : {0, 1}) {  // 5 went to slot 0, 6 to slot 1
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    std::string torn = bytes;
    torn[slot * 64 + 20] = static_cast<char>(torn[slot * 64 + 20] ^ 0x40);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << torn;
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto mark, SyncMark::Open(path));
    EXPECT_EQ(mark->value().write, slot == 0 ? 6 : 5);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
}

// A journal written before writes were numbered has neither the number nor a mark: it opens as
// it always did, and from then on it is guarded.
TEST(SyncMarkTest, AnOlderJournalWithoutAMarkOpensAndGetsOne) {
  const std::string dir = FreshDir("older");
  WriteSomeState(dir, /*reopen=*/false);
  {
    leveldb::DB* raw = nullptr;
    ASSERT_TRUE(leveldb::DB::Open(leveldb::Options(), dir + "/journal", &raw).ok());
    std::unique_ptr<leveldb::DB> db(raw);
    ASSERT_TRUE(db->Delete({}, kWriteKey).ok());
  }
  std::filesystem::remove(dir + "/journal.mark");
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto store, StateStore::Open(dir, absl::ZeroDuration()));
    EXPECT_EQ(store->last_write(), 0);
    ENTROKV_ASSERT_OK_AND_ASSIGN(std::vector<RecoveredModel> models, LoadState(*store));
    EXPECT_EQ(models.size(), 1u);
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/journal.mark"));
}

}  // namespace
}  // namespace entrokv::store
