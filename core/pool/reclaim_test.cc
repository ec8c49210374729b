#include "core/pool/reclaim.h"

#include <cstdlib>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::Pointwise;

// A candidate whose values are its pages' shares, lowest first (what CacheState hands over).
ReclaimCandidate FromScores(const std::vector<float>& scores, int tenant = 0, int priority = 0) {
  ReclaimCandidate candidate;
  candidate.tenant = tenant;
  candidate.priority = priority;
  candidate.values = PageShares(scores);
  std::sort(candidate.values.begin(), candidate.values.end());
  return candidate;
}

TEST(PageSharesTest, EachGroupSumsToOneOverItsLivePages) {
  const std::vector<float> scores = {1.0f, 3.0f, 4.0f, 2.0f};
  EXPECT_THAT(PageShares(scores), Pointwise(FloatEq(), std::vector<float>{0.1f, 0.3f, 0.4f, 0.2f}));
  const std::vector<uint8_t> live = {1, 0, 1, 1};  // page 1 evicted: the rest share 7
  EXPECT_THAT(PageShares(scores, live),
              Pointwise(FloatEq(), std::vector<float>{1.0f / 7, 0.0f, 4.0f / 7, 2.0f / 7}));
}

TEST(PageSharesTest, NoMassSharesEvenly) {
  EXPECT_THAT(PageShares(std::vector<float>{0, 0, 0, 0}, std::vector<uint8_t>{1, 1, 0, 1}),
              Pointwise(FloatEq(), std::vector<float>{1.0f / 3, 1.0f / 3, 0.0f, 1.0f / 3}));
  EXPECT_TRUE(PageShares(std::vector<float>{}).empty());
}

// The property the daemon's budgets rest on: of two sequences, the one whose attention is
// concentrated on a few pages gives up more pages than the flat one, even when it is the longer
// one and its raw scores are the smaller ones.
TEST(PlanReclaimTest, TheConcentratedSequenceGivesUpMorePagesThanTheFlatOne) {
  std::vector<float> concentrated(64, 0.001f);  // 64 pages, one holding most of the mass
  concentrated[10] = 0.9f;
  concentrated[63] = 0.05f;
  const std::vector<float> flat(32, 0.03125f);  // 32 pages, even
  const std::vector<ReclaimTenant> tenants = {{.guaranteed_frames = 0, .used_frames = 96}};
  const std::vector<ReclaimCandidate> candidates = {FromScores(concentrated), FromScores(flat)};
  for (const int64_t demand : {8, 30, 48}) {
    const ReclaimPlan plan = PlanReclaim(tenants, candidates, demand);
    EXPECT_EQ(plan.planned, demand);
    EXPECT_GT(plan.frames[0], plan.frames[1]) << "demand " << demand;
  }
  // Past the concentrated sequence's cheap pages, the flat one's come before its heavy ones.
  const ReclaimPlan most = PlanReclaim(tenants, candidates, 90);
  EXPECT_THAT(most.frames, ElementsAre(62, 28));
}

TEST(PlanReclaimTest, LowerPriorityGivesBeforeHigherWhateverTheValues) {
  const std::vector<ReclaimTenant> tenants = {{.guaranteed_frames = 0, .used_frames = 20}};
  std::vector<ReclaimCandidate> candidates(2);
  candidates[0] = {.tenant = 0, .priority = 5, .values = {0.0f, 0.0f, 0.0f}};
  candidates[1] = {.tenant = 0, .priority = 1, .values = {0.5f, 0.6f}};
  EXPECT_THAT(PlanReclaim(tenants, candidates, 2).frames, ElementsAre(0, 2));
  EXPECT_THAT(PlanReclaim(tenants, candidates, 4).frames, ElementsAre(2, 2));
}

TEST(PlanReclaimTest, ATenantAboveItsShareGivesFirstDownToItsShare) {
  // Tenant 0 holds 10 frames against a guarantee of 7: its first 3 units go before tenant 1's
  // cheaper ones, then both are within their shares and value decides.
  const std::vector<ReclaimTenant> tenants = {{.guaranteed_frames = 7, .used_frames = 10},
                                              {.guaranteed_frames = 10, .used_frames = 5}};
  std::vector<ReclaimCandidate> candidates(2);
  candidates[0] = {.tenant = 0, .priority = 0, .values = {0.3f, 0.3f, 0.3f, 0.3f, 0.3f}};
  candidates[1] = {.tenant = 1, .priority = 0, .values = {0.1f, 0.1f, 0.1f}};
  EXPECT_THAT(PlanReclaim(tenants, candidates, 3).frames, ElementsAre(3, 0));
  EXPECT_THAT(PlanReclaim(tenants, candidates, 5).frames, ElementsAre(3, 2));
  // The tier comes before priority: a high-priority sequence of a tenant above its share gives
  // before a low-priority one within its share.
  candidates[0].priority = 9;
  EXPECT_THAT(PlanReclaim(tenants, candidates, 3).frames, ElementsAre(3, 0));
}

TEST(PlanReclaimTest, FloorsReachedLeaveAShortfall) {
  const std::vector<ReclaimTenant> tenants = {{.guaranteed_frames = 0, .used_frames = 5}};
  std::vector<ReclaimCandidate> candidates(2);
  candidates[0].values = {0.1f, 0.2f};
  candidates[1].values = {};
  const ReclaimPlan plan = PlanReclaim(tenants, candidates, 5);
  EXPECT_THAT(plan.frames, ElementsAre(2, 0));
  EXPECT_EQ(plan.planned, 2);
  EXPECT_EQ(plan.shortfall, 3);
  EXPECT_EQ(PlanReclaim(tenants, candidates, 0).planned, 0);
}

TEST(PlanReclaimTest, TiesGoToTheLowerCandidateIndex) {
  const std::vector<ReclaimTenant> tenants = {{.guaranteed_frames = 0, .used_frames = 4}};
  std::vector<ReclaimCandidate> candidates(2);
  candidates[0].values = {0.5f, 0.5f};
  candidates[1].values = {0.5f, 0.5f};
  EXPECT_THAT(PlanReclaim(tenants, candidates, 1).frames, ElementsAre(1, 0));
  EXPECT_THAT(PlanReclaim(tenants, candidates, 3).frames, ElementsAre(2, 1));
}

// The reference: one unit at a time, scan every candidate for the smallest key.
std::vector<int64_t> Reference(const std::vector<ReclaimTenant>& tenants,
                               const std::vector<ReclaimCandidate>& candidates, int64_t demand) {
  std::vector<int64_t> taken(candidates.size(), 0);
  std::vector<int64_t> used;
  for (const ReclaimTenant& t : tenants) used.push_back(t.used_frames);
  for (int64_t unit = 0; unit < demand; ++unit) {
    int best = -1;
    std::tuple<int, int, float> best_key;
    for (size_t c = 0; c < candidates.size(); ++c) {
      const ReclaimCandidate& candidate = candidates[c];
      if (taken[c] >= static_cast<int64_t>(candidate.values.size())) continue;
      const int tier = used[candidate.tenant] > tenants[candidate.tenant].guaranteed_frames ? 0 : 1;
      const auto key = std::make_tuple(tier, candidate.priority, candidate.values[taken[c]]);
      if (best < 0 || key < best_key) {
        best = static_cast<int>(c);
        best_key = key;
      }
    }
    if (best < 0) break;
    ++taken[best];
    --used[candidates[best].tenant];
  }
  return taken;
}

TEST(PlanReclaimTest, MatchesAUnitAtATimeReference) {
  const char* text = std::getenv("ENTROKV_TEST_SEED");
  const uint64_t seed = text != nullptr ? std::strtoull(text, nullptr, 10) : 20261205;
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (ENTROKV_TEST_SEED replays it)");
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<ReclaimTenant> tenants(static_cast<size_t>(pick(1, 4)));
    for (ReclaimTenant& t : tenants) {
      t.guaranteed_frames = pick(0, 30);
      t.used_frames = pick(0, 60);
    }
    std::vector<ReclaimCandidate> candidates(static_cast<size_t>(pick(0, 6)));
    for (ReclaimCandidate& c : candidates) {
      c.tenant = pick(0, static_cast<int>(tenants.size()) - 1);
      c.priority = pick(0, 2);
      for (int i = pick(0, 12); i > 0; --i) c.values.push_back(static_cast<float>(pick(0, 5)));
      std::sort(c.values.begin(), c.values.end());
    }
    const int64_t demand = pick(0, 50);
    const ReclaimPlan plan = PlanReclaim(tenants, candidates, demand);
    ASSERT_EQ(plan.frames, Reference(tenants, candidates, demand)) << "trial " << trial;
    ASSERT_EQ(plan.planned, std::accumulate(plan.frames.begin(), plan.frames.end(), int64_t{0}));
    ASSERT_EQ(plan.planned + plan.shortfall, demand);
  }
}

}  // namespace
}  // namespace entrokv
