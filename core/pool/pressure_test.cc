// Pool pressure in CacheState: server-chosen budgets, admission, tenants, preemption, swapping.
#include "core/pool/pressure.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/pool/cache_state.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::_;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// One layer, two KV groups, pages of 4 tokens: a sequence of 30 tokens holds 8 pages, 16 frames.
CacheOptions Options(int64_t frames, double target = 1.0) {
  CacheOptions options;
  options.geometry = {.layers = 1,
                      .query_heads = 4,
                      .kv_groups = 2,
                      .head_dim = 4,
                      .page_size = 4,
                      .element_bytes = 2};
  options.layout = FrameLayout::kGroup;
  options.capacity_bytes = frames * FrameBytes(options.geometry, FrameLayout::kGroup);
  options.name = "pressure_test";
  options.pressure.target_occupancy = target;
  options.pressure.max_swap_bytes = int64_t{1} << 20;
  return options;
}

SequenceTerms Auto(double floor, int32_t priority = 0, std::string tenant = "") {
  return SequenceTerms{.tenant = std::move(tenant), .priority = priority, .auto_floor = floor};
}

SequenceTerms Terms(std::string tenant, int32_t priority) {
  SequenceTerms terms;
  terms.tenant = std::move(tenant);
  terms.priority = priority;
  return terms;
}
SequenceTerms Priority(int32_t priority) { return Terms("", priority); }
AutoTerms FloorTerms(double floor) {
  AutoTerms terms;
  terms.floor_fraction = floor;
  return terms;
}

// Page scores for both groups: one page holding nearly all the mass, or every page alike.
std::vector<std::vector<float>> Concentrated(int64_t pages) {
  std::vector<float> scores(static_cast<size_t>(pages), 0.001f);
  scores[0] = 1.0f;
  return {scores, scores};
}
std::vector<std::vector<float>> Flat(int64_t pages) {
  return {std::vector<float>(static_cast<size_t>(pages), 0.1f),
          std::vector<float>(static_cast<size_t>(pages), 0.1f)};
}

void Decide(CacheState& state, const std::string& id, std::vector<std::vector<float>> scores) {
  const int64_t tokens = *state.SequenceLength(id);
  const std::vector<AutoLayer> layers = {{.layer = 0, .page_scores = std::move(scores)}};
  ASSERT_THAT(state.ApplyAutoDecision(id, tokens, layers, AutoTerms()).status(), IsOk());
}

// Opens `id` as the daemon's OpenSequence does: empty, then its first tokens as an admission.
absl::Status Admit(CacheState& state, const std::string& id, int64_t tokens,
                   const SequenceTerms& terms, AdmissionRefusal* refusal = nullptr) {
  if (absl::Status opened = state.OpenSequence(id, 0, terms); !opened.ok()) return opened;
  absl::StatusOr<AppendResult> appended =
      state.AppendTokens(id, tokens, AppendOptions{.admission = true, .refusal = refusal});
  if (!appended.ok()) (void)state.CloseSequence(id);
  return appended.status();
}

void ExpectBalanced(const CacheState& state) {
  const PoolStats stats = state.Stats();
  EXPECT_EQ(stats.used_frames + stats.free_frames, stats.capacity_frames);
  EXPECT_THAT(state.CheckInvariants(), IsOk());
}

int64_t Quota(const CacheState& state, const std::string& id) {
  return state.Pressure(id)->quota_frames;
}

// Frames the sequence's quota takes from its `live` frames.
int64_t Gives(const CacheState& state, const std::string& id, int64_t live) {
  const int64_t quota = Quota(state, id);
  return quota == 0 ? 0 : live - quota;
}

TEST(PressureOptionsTest, BadOptionsNameTheOption) {
  PressureOptions options;
  options.target_occupancy = 0.0;
  EXPECT_THAT(ValidatePressureOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("target_occupancy")));
  options.target_occupancy = 1.5;
  EXPECT_THAT(ValidatePressureOptions(options), StatusIs(absl::StatusCode::kInvalidArgument, _));
  options.target_occupancy = 0.9;
  options.tenants = {{"a", 0.6}, {"b", 0.6}};
  EXPECT_THAT(ValidatePressureOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sum to 1.2")));
  options.tenants = {{"a", 0.1}, {"a", 0.1}};
  EXPECT_THAT(ValidatePressureOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("named twice")));
  options.tenants = {{"a b", 0.1}};
  EXPECT_THAT(ValidatePressureOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tenant_share")));
  options.tenants.clear();
  for (int i = 0; i <= kMaxTenants; ++i) options.tenants.push_back({absl::StrCat("t", i), 0.0});
  EXPECT_THAT(ValidatePressureOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 16")));
  options.tenants.pop_back();
  EXPECT_THAT(ValidatePressureOptions(options), IsOk());
  CacheOptions cache = Options(8);
  cache.pressure.target_occupancy = -1;
  EXPECT_THAT(CacheState::Create(cache),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("target_occupancy")));
}

TEST(PressureTest, BadTermsAreRefusedNamingTheFieldAndChangeNothing) {
  CacheOptions options = Options(64);
  options.pressure.tenants = {{"gold", 0.5}};
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  EXPECT_THAT(state->OpenSequence("s", 8, Terms("silver", 0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tenant: 'silver' is not a tenant of this daemon (--tenant_share: "
                                 "gold")));
  EXPECT_THAT(
      state->OpenSequence("s", 8, Priority(10)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("priority: must be in [0, 9]")));
  EXPECT_THAT(state->OpenSequence("s", 8, Auto(0.0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("auto_budget.floor_fraction: must be in (0, 1], got 0")));
  EXPECT_THAT(state->OpenSequence("s", 8, Auto(1.5)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("floor_fraction")));
  EXPECT_EQ(state->Stats().sequences_active, 0);
  EXPECT_EQ(state->Stats().used_frames, 0);
  ASSERT_THAT(state->OpenSequence("s", 30, Terms("gold", 9)), IsOk());
  const std::vector<AutoLayer> layers = {{.layer = 0, .page_scores = Flat(8)}};
  EXPECT_THAT(
      state->ApplyAutoDecision("s", 30, layers, FloorTerms(0.0)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budget.auto_budget.floor_fraction")));
  const std::vector<AutoLayer> short_scores = {{.layer = 0, .page_scores = Flat(7)}};
  EXPECT_THAT(state->ApplyAutoDecision("s", 30, short_scores, AutoTerms()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("7 page scores")));
  const std::vector<AutoLayer> no_groups = {{.layer = 0, .page_scores = {}}};
  EXPECT_THAT(state->ApplyAutoDecision("s", 30, no_groups, AutoTerms()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("pooling policy")));
  EXPECT_EQ(state->Pressure("s")->floor_frames, 0);  // still no server-chosen budget
  const SequenceInfo info = *state->GetSequence("s", false);
  EXPECT_EQ(info.tenant, "gold");
  EXPECT_EQ(info.priority, 9);
  ExpectBalanced(*state);
}

TEST(PressureTest, AnAutoDecisionKeepsEveryPageWhileThePoolCanAffordIt) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(100)));
  ASSERT_THAT(Admit(*state, "a", 30, Auto(0.25)), IsOk());
  const std::vector<AutoLayer> layers = {{.layer = 0, .page_scores = Concentrated(8)}};
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AutoResult result,
                               state->ApplyAutoDecision("a", 30, layers, AutoTerms()));
  ASSERT_EQ(result.layers.size(), 1u);
  EXPECT_EQ(result.reclaimed_frames, 0);
  EXPECT_THAT(result.layers[0].evicted_pages_per_group, ElementsAre(IsEmpty(), IsEmpty()));
  const PressureReport report = *state->Pressure("a");
  EXPECT_EQ(report.quota_frames, 0);
  EXPECT_EQ(report.live_frames, 16);
  EXPECT_EQ(report.floor_frames, 4);  // ceil(0.25 x 16)
  EXPECT_DOUBLE_EQ(report.occupancy, 0.16);
  ExpectBalanced(*state);
}

// The admission path end to end: frames are not there, quotas are set on the sequences with
// server-chosen budgets (the concentrated one gives, the flat one does not), nothing moves until
// the owner's own call, and then the retried admission fits.
TEST(PressureTest, AnAdmissionThatDoesNotFitWaitsForTheOwnersNextCall) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(40)));
  ASSERT_THAT(Admit(*state, "a", 30, Auto(0.25)), IsOk());
  ASSERT_THAT(Admit(*state, "b", 30, Auto(0.25)), IsOk());
  Decide(*state, "a", Concentrated(8));
  Decide(*state, "b", Flat(8));
  AdmissionRefusal refusal;
  EXPECT_THAT(Admit(*state, "c", 30, SequenceTerms(), &refusal),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("frames are being reclaimed from sequences with server-chosen "
                                 "budgets")));
  EXPECT_FALSE(refusal.refused);
  EXPECT_EQ(refusal.missing_frames, 8);
  EXPECT_EQ(refusal.reclaiming_frames, 8);
  EXPECT_GT(refusal.retry_after_ms, 0);
  EXPECT_THAT(refusal.preempt, IsEmpty());
  // Quotas are numbers until the owner calls: no frame moved.
  EXPECT_EQ(state->Stats().used_frames, 32);
  EXPECT_EQ(Quota(*state, "a"), 8);
  EXPECT_EQ(Quota(*state, "b"), 0);
  // A retry before the owner called plans nothing more: the owed frames cover it.
  EXPECT_THAT(Admit(*state, "c", 30, SequenceTerms(), &refusal),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  EXPECT_EQ(Quota(*state, "a"), 8);
  EXPECT_EQ(state->Stats().pressure.admissions_delayed, 2);
  // The owner's append (the partial tail page: no new frame) applies the quota.
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult grown, state->AppendTokens("a", 1));
  EXPECT_EQ(grown.reclaimed_frames, 8);
  int64_t evicted = 0;
  for (const AppendResult::Evicted& group : grown.evicted) {
    EXPECT_EQ(group.layer, 0);
    EXPECT_THAT(group.pages, ::testing::Not(::testing::Contains(0)));  // the heavy page stays
    EXPECT_THAT(group.pages, ::testing::Not(::testing::Contains(7)));  // the tail stays
    evicted += static_cast<int64_t>(group.pages.size());
  }
  EXPECT_EQ(evicted, 8);
  EXPECT_EQ(state->Pressure("a")->live_frames, 8);
  EXPECT_EQ(state->Stats().pressure.frames_reclaimed_admission, 8);
  ASSERT_THAT(Admit(*state, "c", 30, SequenceTerms()), IsOk());
  EXPECT_EQ(state->Stats().used_frames, 40);
  ExpectBalanced(*state);
}

TEST(PressureTest, TheConcentratedSequenceGivesMorePagesThanTheFlatOne) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(64)));
  ASSERT_THAT(Admit(*state, "flat", 30, Auto(0.1)), IsOk());
  ASSERT_THAT(Admit(*state, "peaked", 62, Auto(0.1)), IsOk());  // 16 pages, 32 frames
  Decide(*state, "flat", Flat(8));
  Decide(*state, "peaked", Concentrated(16));
  // 48 used, 16 free: an admission of 32 frames needs 16 of theirs.
  EXPECT_THAT(Admit(*state, "c", 62, SequenceTerms()),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  const int64_t flat_gives = Gives(*state, "flat", 16);
  const int64_t peaked_gives = Gives(*state, "peaked", 32);
  EXPECT_EQ(flat_gives + peaked_gives, 16);
  EXPECT_GT(peaked_gives, flat_gives);
}

// Within a sequence the quota is taken in rounds, one page of each (layer, group) a round, as a
// fixed budget keeps an exact page quota per (layer, group): a group whose attention sits on
// one page does not give every other page while a flat group keeps all of its.
TEST(PressureTest, ASequenceGivesTheSameNumberOfPagesFromEachGroup) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(20)));
  ASSERT_THAT(Admit(*state, "a", 30, Auto(0.1)), IsOk());  // 8 pages, 16 frames
  std::vector<std::vector<float>> mixed = {Concentrated(8)[0], Flat(8)[1]};
  Decide(*state, "a", std::move(mixed));
  // 4 free: an admission of 4 pages (8 frames) needs 4 of a's.
  EXPECT_THAT(Admit(*state, "c", 16, SequenceTerms()),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  EXPECT_EQ(Quota(*state, "a"), 12);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult grown, state->AppendTokens("a", 1));
  EXPECT_EQ(grown.reclaimed_frames, 4);
  std::vector<size_t> per_group(2, 0);
  for (const AppendResult::Evicted& group : grown.evicted) {
    per_group[static_cast<size_t>(group.group)] += group.pages.size();
  }
  EXPECT_THAT(per_group, ElementsAre(2, 2));
  ASSERT_THAT(Admit(*state, "c", 16, SequenceTerms()), IsOk());
  ExpectBalanced(*state);
}

// A waiting admission is told DELAYED only when the frames being reclaimed cover it and every
// older admission still waiting: here the floors leave 24 frames to reclaim, enough for the
// older admission's 16 but not for both, so the newer one is REFUSED (and, being the newest,
// preempts nobody), and it still does not fit once the owners have given.
TEST(PressureTest, AnAdmissionBehindAnotherIsDelayedOnlyWhenTheReclaimCoversBoth) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(64)));
  ASSERT_THAT(Admit(*state, "a", 62, Auto(0.6)), IsOk());  // 32 frames, floor 20
  ASSERT_THAT(Admit(*state, "b", 62, Auto(0.6)), IsOk());
  Decide(*state, "a", Flat(16));
  Decide(*state, "b", Flat(16));
  AdmissionRefusal refusal;
  EXPECT_THAT(Admit(*state, "c", 30, SequenceTerms(), &refusal),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  EXPECT_FALSE(refusal.refused);
  EXPECT_EQ(refusal.reclaiming_frames, 16);
  EXPECT_THAT(Admit(*state, "d", 30, SequenceTerms(), &refusal),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("16 held for older")));
  EXPECT_TRUE(refusal.refused);
  EXPECT_EQ(refusal.missing_frames, 16);
  EXPECT_EQ(refusal.reclaiming_frames, 24);
  EXPECT_THAT(refusal.preempt, IsEmpty());
  ASSERT_THAT(state->AppendTokens("a", 1).status(), IsOk());
  ASSERT_THAT(state->AppendTokens("b", 1).status(), IsOk());
  EXPECT_THAT(Admit(*state, "c", 30, SequenceTerms()), IsOk());
  EXPECT_THAT(Admit(*state, "d", 30, SequenceTerms()),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  ExpectBalanced(*state);
}

TEST(PressureTest, FloorsReachedRefuseAndNameLowerPriorityVictims) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(40)));
  ASSERT_THAT(Admit(*state, "low", 30, Auto(1.0, /*priority=*/0)), IsOk());
  ASSERT_THAT(Admit(*state, "high", 30, Priority(5)), IsOk());
  Decide(*state, "low", Flat(8));
  const PoolStats before = state->Stats();
  AdmissionRefusal refusal;
  EXPECT_THAT(Admit(*state, "mid", 30, Priority(3), &refusal),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("asked the owners of 1 sequences to preempt them (low)")));
  EXPECT_TRUE(refusal.refused);
  EXPECT_EQ(refusal.missing_frames, 8);
  EXPECT_THAT(refusal.preempt, ElementsAre("low"));
  EXPECT_TRUE(state->Pressure("low")->preempt);
  EXPECT_FALSE(state->Pressure("high")->preempt);
  const PoolStats after = state->Stats();
  EXPECT_EQ(after.used_frames, before.used_frames);
  EXPECT_EQ(after.sequences_active, 2);
  EXPECT_EQ(after.pressure.admissions_refused, 1);
  EXPECT_EQ(after.pressure.preemptions, 1);
  // A request of the lowest priority may preempt nobody: only younger ones of its own priority.
  EXPECT_THAT(Admit(*state, "lowest", 30, Priority(0), &refusal),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("close sequences first")));
  EXPECT_THAT(refusal.preempt, IsEmpty());
  // The owner closes the victim: the mark is gone with it, and "mid" fits.
  ASSERT_THAT(state->CloseSequence("low"), IsOk());
  ASSERT_THAT(Admit(*state, "mid", 30, Priority(3)), IsOk());
  ExpectBalanced(*state);
}

TEST(PressureTest, ATenantAboveItsShareGivesFirst) {
  CacheOptions options = Options(40);
  options.pressure.tenants = {{"t1", 0.5}, {"t2", 0.5}};
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  ASSERT_THAT(Admit(*state, "x1", 30, Auto(0.25, 0, "t1")), IsOk());
  ASSERT_THAT(Admit(*state, "x2", 30, Auto(0.25, 0, "t1")), IsOk());
  ASSERT_THAT(Admit(*state, "y", 14, Auto(0.25, 0, "t2")), IsOk());  // 4 pages, 8 frames
  Decide(*state, "x1", Flat(8));
  Decide(*state, "x2", Flat(8));
  Decide(*state, "y", Concentrated(4));  // cheaper pages, but t2 is within its share
  EXPECT_THAT(Admit(*state, "z", 14, Terms("t2", 0)),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  EXPECT_EQ(Quota(*state, "y"), 0);
  EXPECT_EQ(Gives(*state, "x1", 16) + Gives(*state, "x2", 16), 8);
  const PoolStats stats = state->Stats();
  ASSERT_EQ(stats.pressure.tenants.size(), 3u);
  EXPECT_EQ(stats.pressure.tenants[0].tenant, "t1");
  EXPECT_EQ(stats.pressure.tenants[0].used_frames, 32);
  EXPECT_EQ(stats.pressure.tenants[0].guaranteed_frames, 20);
  EXPECT_EQ(stats.pressure.tenants[1].used_frames, 8);
  EXPECT_EQ(stats.pressure.tenants[2].tenant, "");
}

TEST(PressureTest, QuotasNeverTakeTheFloorTheTailOrUnscoredPages) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(64)));
  ASSERT_THAT(Admit(*state, "a", 30, Auto(0.5)), IsOk());
  Decide(*state, "a", Flat(8));
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult grown, state->AppendTokens("a", 8));
  EXPECT_EQ(grown.new_frames.size(), 4u);  // pages 8 and 9, unscored
  // Everything else in the pool is asked for.
  EXPECT_THAT(Admit(*state, "big", 4 * 64 / 2 - 4, SequenceTerms()),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult owner, state->AppendTokens("a", 1));
  EXPECT_GT(owner.reclaimed_frames, 0);
  const SequenceInfo info = *state->GetSequence("a", true);
  EXPECT_EQ(info.live_frames, 10);  // the floor: half of 10 pages x 2 groups
  for (const auto& table : info.block_tables[0]) {
    EXPECT_NE(table[8], kNoFrame);  // unscored
    EXPECT_NE(table[9], kNoFrame);  // unscored, and the tail
  }
  ExpectBalanced(*state);
}

TEST(PressureTest, AWaitingAdmissionHoldsItsFramesFromNewerOnesUntilItsHoldPasses) {
  absl::Time now = absl::FromUnixSeconds(1000);
  CacheOptions options = Options(40);
  options.pressure.clock = [&now] { return now; };
  options.pressure.admission_hold = absl::Seconds(5);
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  ASSERT_THAT(Admit(*state, "a", 30, Auto(0.25)), IsOk());
  ASSERT_THAT(Admit(*state, "b", 30, Auto(0.25)), IsOk());
  Decide(*state, "a", Flat(8));
  Decide(*state, "b", Flat(8));
  ASSERT_THAT(Admit(*state, "big", 30, SequenceTerms()),
              StatusIs(absl::StatusCode::kResourceExhausted, _));  // delayed: holds 16 frames
  // 8 frames are free, but they are the older admission's: a newer small one waits too.
  EXPECT_THAT(Admit(*state, "small", 14, SequenceTerms()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("held for older")));
  // A running sequence's growth is not held back.
  EXPECT_THAT(state->AppendTokens("b", 3).status(), IsOk());
  // The older one never came back: after its hold the frames are anyone's.
  now += absl::Seconds(6);
  EXPECT_THAT(Admit(*state, "small", 14, SequenceTerms()), IsOk());
  ExpectBalanced(*state);
}

TEST(PressureTest, OverTheTargetTheOwnersGiveAtTheirNextCall) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(40, /*target=*/0.5)));
  ASSERT_THAT(Admit(*state, "a", 30, Auto(0.25)), IsOk());
  Decide(*state, "a", Flat(8));
  ASSERT_THAT(Admit(*state, "b", 30, SequenceTerms()), IsOk());  // 32 of 40 frames: over 50%
  EXPECT_EQ(Quota(*state, "a"), 4);  // 12 frames over the target, a's floor is 4
  EXPECT_EQ(state->Stats().used_frames, 32);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult grown, state->AppendTokens("a", 1));
  EXPECT_EQ(grown.reclaimed_frames, 12);
  EXPECT_EQ(state->Stats().pressure.frames_reclaimed_target, 12);
  EXPECT_EQ(state->Stats().used_frames, 20);
  // Well under the target again with nothing waiting: the quota is lifted.
  ASSERT_THAT(state->CloseSequence("b"), IsOk());
  EXPECT_EQ(Quota(*state, "a"), 0);
  ExpectBalanced(*state);
}

TEST(PressureTest, ARefusedAppendChangesNoFrame) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(32)));
  ASSERT_THAT(Admit(*state, "a", 30, Auto(0.25)), IsOk());
  Decide(*state, "a", Flat(8));
  ASSERT_THAT(Admit(*state, "b", 30, Auto(1.0)), IsOk());
  const SequenceInfo before = *state->GetSequence("b", true);
  // b's growth needs 2 frames: a owes them after the plan, but only a's own call gives them.
  EXPECT_THAT(state->AppendTokens("b", 4).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("pool exhausted")));
  EXPECT_EQ(state->GetSequence("b", true)->block_tables, before.block_tables);
  EXPECT_EQ(state->Stats().used_frames, 32);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult owner, state->AppendTokens("a", 1));
  EXPECT_EQ(owner.reclaimed_frames, 2);
  EXPECT_THAT(state->AppendTokens("b", 4).status(), IsOk());
  ExpectBalanced(*state);
}

// Every frame unit of the sequence gets a byte pattern of its own (group, page).
void Paint(CacheState& state, const std::string& id) {
  const SequenceInfo info = *state.GetSequence(id, true);
  const int64_t frame_bytes = state.Stats().frame_bytes;
  for (size_t g = 0; g < info.block_tables[0].size(); ++g) {
    for (size_t page = 0; page < info.block_tables[0][g].size(); ++page) {
      const FrameId frame = info.block_tables[0][g][page];
      if (frame != kNoFrame) {
        std::memset(state.FrameAddress(frame), static_cast<int>(16 * g + page + 1),
                    static_cast<size_t>(frame_bytes));
      }
    }
  }
}

void ExpectPainted(CacheState& state, const std::string& id) {
  const SequenceInfo info = *state.GetSequence(id, true);
  const int64_t frame_bytes = state.Stats().frame_bytes;
  for (size_t g = 0; g < info.block_tables[0].size(); ++g) {
    for (size_t page = 0; page < info.block_tables[0][g].size(); ++page) {
      const FrameId frame = info.block_tables[0][g][page];
      if (frame == kNoFrame) continue;
      const auto* bytes = static_cast<const unsigned char*>(state.FrameAddress(frame));
      for (int64_t i = 0; i < frame_bytes; ++i) {
        ASSERT_EQ(bytes[i], 16 * g + page + 1) << "group " << g << " page " << page;
      }
    }
  }
}

TEST(PressureTest, SwapOutFreesTheFramesAndResumeBringsTheBytesBack) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(40)));
  ASSERT_THAT(Admit(*state, "a", 30, Auto(0.5, 2)), IsOk());
  ASSERT_THAT(state->ApplyDecision("a", 0, 30, {{0, 1, 7}, {2, 7}}).status(), IsOk());
  Paint(*state, "a");
  const SequenceInfo before = *state->GetSequence("a", true);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const SwapOutResult out, state->SwapOut("a"));
  EXPECT_EQ(out.freed_frames, 5);
  EXPECT_EQ(out.swapped_bytes, 5 * state->Stats().frame_bytes);
  EXPECT_EQ(state->Stats().used_frames, 0);
  EXPECT_EQ(state->Stats().pressure.sequences_swapped, 1);
  EXPECT_THAT(state->SwappedIds(), ElementsAre("a"));
  EXPECT_THAT(state->AppendTokens("a", 1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("swapped out")));
  EXPECT_THAT(state->OpenSequence("a", 1), StatusIs(absl::StatusCode::kAlreadyExists, _));
  EXPECT_THAT(state->SwapOut("a").status(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  // Another sequence writes over every frame a had.
  ASSERT_THAT(Admit(*state, "b", 30, SequenceTerms()), IsOk());
  Paint(*state, "b");
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult resumed, state->Resume("a", nullptr));
  EXPECT_EQ(resumed.length, 30);
  EXPECT_EQ(resumed.new_frames.size(), 5u);
  const SequenceInfo after = *state->GetSequence("a", true);
  for (size_t g = 0; g < 2; ++g) {
    for (size_t page = 0; page < 8; ++page) {
      EXPECT_EQ(after.block_tables[0][g][page] == kNoFrame,
                before.block_tables[0][g][page] == kNoFrame);
    }
  }
  ExpectPainted(*state, "a");
  ExpectPainted(*state, "b");
  EXPECT_EQ(state->Pressure("a")->floor_frames, 8);  // the terms came back with it
  EXPECT_EQ(state->GetSequence("a", false)->priority, 2);
  EXPECT_THAT(state->Resume("a", nullptr).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is resident")));
  EXPECT_THAT(state->Resume("nobody", nullptr).status(), StatusIs(absl::StatusCode::kNotFound, _));
  const PoolStats stats = state->Stats();
  EXPECT_EQ(stats.pressure.swaps_out, 1);
  EXPECT_EQ(stats.pressure.swaps_in, 1);
  EXPECT_EQ(stats.pressure.swapped_bytes, 0);
  ExpectBalanced(*state);
}

TEST(PressureTest, SwappingKeepsTheRunningSumsAndTheirBookkeeping) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(40)));
  ASSERT_THAT(Admit(*state, "a", 30, SequenceTerms()), IsOk());
  std::vector<float> sum(4 * 30);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = 0.25f + static_cast<float>(i);
  LayerKeep keep;
  keep.layer = 0;
  keep.kept_pages_per_group = {{0, 1, 2, 3, 4, 5, 6, 7}, {0, 7}};
  keep.running_sum = sum;
  ASSERT_THAT(state->ApplyDecisions("a", 30, {keep}).status(), IsOk());
  const int64_t bookkeeping = state->Stats().bookkeeping_bytes;
  ASSERT_THAT(state->SwapOut("a").status(), IsOk());
  EXPECT_EQ(state->Stats().bookkeeping_bytes, bookkeeping);  // still held, while swapped out
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult resumed, state->Resume("a", nullptr));
  EXPECT_EQ(resumed.new_frames.size(), 10u);
  EXPECT_EQ(*state->RunningSum("a", 0), sum);
  EXPECT_EQ(state->Stats().bookkeeping_bytes, bookkeeping);
  ExpectBalanced(*state);
}

// A truncation takes the page shares past the new end with their pages: pages appended there
// later are unscored until a decision scores them, so a quota never takes them on the shares of
// the tokens that were dropped.
TEST(PressureTest, ATruncationDropsThePageSharesPastTheNewEnd) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(Options(64)));
  ASSERT_THAT(Admit(*state, "a", 30, Auto(0.5)), IsOk());  // 8 pages
  // Pages 5-7 are worth least: a quota would take them first.
  std::vector<float> scores(8, 1.0f);
  scores[5] = scores[6] = scores[7] = 0.001f;
  Decide(*state, "a", {scores, scores});
  ENTROKV_ASSERT_OK_AND_ASSIGN(const TruncateResult truncated, state->TruncateSequence("a", 10));
  EXPECT_EQ(truncated.length, 20);  // 5 pages
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult grown, state->AppendTokens("a", 12));
  EXPECT_EQ(grown.new_frames.size(), 6u);  // pages 5-7 again, unscored
  EXPECT_THAT(Admit(*state, "big", 4 * 64 / 2 - 4, SequenceTerms()),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  ENTROKV_ASSERT_OK_AND_ASSIGN(const AppendResult owner, state->AppendTokens("a", 1));
  EXPECT_GT(owner.reclaimed_frames, 0);
  const SequenceInfo info = *state->GetSequence("a", true);
  for (const auto& table : info.block_tables[0]) {
    for (size_t page = 5; page < 9; ++page) EXPECT_NE(table[page], kNoFrame) << page;
  }
  ExpectBalanced(*state);
}

TEST(PressureTest, SwappingIsBoundedAndAResumeIsAnAdmission) {
  CacheOptions options = Options(32);
  options.pressure.max_swap_bytes = 0;
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto off, CacheState::Create(options));
  ASSERT_THAT(off->OpenSequence("a", 30), IsOk());
  EXPECT_THAT(off->SwapOut("a").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("max_swap_bytes")));
  options.pressure.max_swap_bytes = 10 * FrameBytes(options.geometry, FrameLayout::kGroup);
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  ASSERT_THAT(state->OpenSequence("a", 30), IsOk());
  EXPECT_THAT(state->SwapOut("a").status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max_swap_bytes")));
  EXPECT_EQ(state->Stats().used_frames, 16);
  ASSERT_THAT(state->OpenSequence("s", 14), IsOk());  // 8 frames
  ASSERT_THAT(state->SwapOut("s").status(), IsOk());
  ASSERT_THAT(state->OpenSequence("t", 30), IsOk());  // 16 + 16 of 32 frames
  AdmissionRefusal refusal;
  EXPECT_THAT(state->Resume("s", &refusal).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  EXPECT_EQ(refusal.missing_frames, 8);
  EXPECT_EQ(state->Stats().pressure.sequences_swapped, 1);
  ASSERT_THAT(state->CloseSequence("s"), IsOk());  // closing a swapped-out sequence
  EXPECT_EQ(state->Stats().pressure.sequences_swapped, 0);
  EXPECT_THAT(state->CloseSequence("s"), StatusIs(absl::StatusCode::kNotFound, _));
  ExpectBalanced(*state);
}

TEST(ChooseVictimsTest, LowerPriorityThenTheYoungestUntilCovered) {
  const std::vector<VictimCandidate> candidates = {
      {.id = "old-low", .priority = 1, .admitted = 1, .frees = 10},
      {.id = "young-low", .priority = 1, .admitted = 9, .frees = 10},
      {.id = "lowest", .priority = 0, .admitted = 5, .frees = 4},
      {.id = "same-older", .priority = 3, .admitted = 2, .frees = 50},
      {.id = "same-younger", .priority = 3, .admitted = 8, .frees = 50},
      {.id = "higher", .priority = 7, .admitted = 9, .frees = 50}};
  EXPECT_THAT(ChooseVictims(candidates, 3, 6, 12), ElementsAre("lowest", "young-low"));
  EXPECT_THAT(ChooseVictims(candidates, 3, 6, 1000),
              ElementsAre("lowest", "young-low", "old-low", "same-younger"));
  EXPECT_THAT(ChooseVictims(candidates, 0, 6, 10), IsEmpty());
  EXPECT_THAT(ChooseVictims(candidates, 3, 6, 0), IsEmpty());
}

TEST(FloorFramesTest, RoundsUp) {
  EXPECT_EQ(FloorFrames(0.25, 16), 4);
  EXPECT_EQ(FloorFrames(0.25, 17), 5);
  EXPECT_EQ(FloorFrames(1.0, 17), 17);
}

}  // namespace
}  // namespace entrokv
