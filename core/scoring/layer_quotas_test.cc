// Layer quotas that follow the scores (layer_quotas.h): the layers keep exactly the pages the
// budget buys, every layer its floor and no more than it holds, a spread layer more than a
// concentrated one, the most summed share any split within the floors keeps (brute force);
// and a decision chosen again at a quota from its page scores is the scorers' own at that quota.
#include "core/scoring/layer_quotas.h"

#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "core/scoring/decision.h"
#include "core/scoring/fused_scorer.h"
#include "core/testing/random_rows.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Message;

// Layers of page scores: [layer][group][page].
using Scores = std::vector<std::vector<std::vector<float>>>;

std::vector<ScoredLayer> Scored(const Scores& scores,
                                const std::vector<std::vector<uint8_t>>& live = {}) {
  std::vector<ScoredLayer> layers(scores.size());
  for (size_t l = 0; l < scores.size(); ++l) {
    for (const std::vector<float>& group : scores[l]) layers[l].group_scores.emplace_back(group);
    if (l < live.size()) layers[l].live_pages = live[l];
  }
  return layers;
}

int64_t Sum(const std::vector<int64_t>& quotas) {
  return std::accumulate(quotas.begin(), quotas.end(), int64_t{0});
}

TEST(LayerQuotasTest, ASpreadLayerGetsThePagesAConcentratedOneDoesNotNeed) {
  // Layer 0 holds all its mass on page 0; layer 1 spreads it evenly. 8 pages, floor 1/4 (one
  // page each): layer 1's pages each add 1/8, layer 0's after the first add nothing.
  const Scores scores = {{{10, 0, 0, 0, 0, 0, 0, 0}}, {{1, 1, 1, 1, 1, 1, 1, 1}}};
  EXPECT_THAT(PlanLayersByMass(Scored(scores), 8, 0.25), ElementsAre(1, 7));
  // A floor of 1 is the uniform split.
  EXPECT_THAT(PlanLayersByMass(Scored(scores), 8, 1.0), ElementsAre(4, 4));
  // Floor 1/2: two pages each first, the other four to layer 1.
  EXPECT_THAT(PlanLayersByMass(Scored(scores), 8, 0.5), ElementsAre(2, 6));
}

TEST(LayerQuotasTest, AGroupWithoutMassAddsNothingAndEqualLayersStayEven) {
  // Every page of both layers is worth the same: the pages alternate, from layer 0.
  const Scores even = {{{1, 1, 1, 1}}, {{1, 1, 1, 1}}};
  EXPECT_THAT(PlanLayersByMass(Scored(even), 5, 0.0), ElementsAre(3, 2));
  // Layer 0's only group has no mass: its pages add 0, so layer 1 takes all it holds first.
  const Scores empty = {{{0, 0, 0, 0}}, {{1, 2, 3, 4}}};
  EXPECT_THAT(PlanLayersByMass(Scored(empty), 6, 0.0), ElementsAre(2, 4));
}

TEST(LayerQuotasTest, ALayerGetsNoMorePagesThanItsGroupsHold) {
  // Layer 1 holds 2 of its 6 pages (evicted earlier), layer 0 all six: layer 1's share is all
  // in two pages, so it gets two and layer 0 the rest, even though its pages are worth less.
  const Scores scores = {{{1, 1, 1, 1, 1, 1}}, {{5, 5, 5, 5, 5, 5}}};
  const std::vector<std::vector<uint8_t>> live = {{}, {0, 1, 0, 1, 0, 0}};
  EXPECT_THAT(PlanLayersByMass(Scored(scores, live), 8, 0.0), ElementsAre(6, 2));
  // Beyond what every layer holds, the rest is not given.
  EXPECT_THAT(PlanLayersByMass(Scored(scores, live), 20, 0.0), ElementsAre(6, 2));
  // A live mask per group (G * n): a layer's cap is its fullest group.
  const Scores two_groups = {{{1, 1, 1}, {1, 1, 1}}, {{1, 1, 1}, {1, 1, 1}}};
  const std::vector<std::vector<uint8_t>> per_group = {{1, 0, 0, 1, 1, 0}, {1, 1, 1, 1, 1, 1}};
  EXPECT_THAT(PlanLayersByMass(Scored(two_groups, per_group), 6, 0.0), ElementsAre(2, 3));
}

// The summed share a split keeps: each group's best quota[l] shares.
double Kept(const Scores& scores, const std::vector<int64_t>& quotas) {
  double kept = 0.0;
  for (size_t l = 0; l < scores.size(); ++l) {
    for (const std::vector<float>& group : scores[l]) {
      std::vector<double> shares(group.begin(), group.end());
      const double mass = std::accumulate(shares.begin(), shares.end(), 0.0);
      std::sort(shares.begin(), shares.end(), std::greater<>());
      for (int64_t k = 0; k < quotas[l] && k < static_cast<int64_t>(shares.size()); ++k) {
        kept += mass > 0 ? shares[static_cast<size_t>(k)] / mass : 0.0;
      }
    }
  }
  return kept;
}

TEST(LayerQuotasTest, RandomLayersKeepTheirTotalAndTheMostShareAnySplitKeeps) {
  std::mt19937_64 rng(20261205);
  for (int round = 0; round < 300; ++round) {
    const int layers = 1 + static_cast<int>(rng() % 3);
    const int groups = 1 + static_cast<int>(rng() % 2);
    const int pages = 1 + static_cast<int>(rng() % 6);
    Scores scores(static_cast<size_t>(layers));
    for (auto& layer : scores) {
      for (int g = 0; g < groups; ++g) {
        const std::vector<float> row = ::entrokv::testing::MixedRows(1, pages, rng);
        layer.push_back(row);
      }
    }
    const int64_t total = layers + static_cast<int64_t>(rng() % (layers * pages));
    const double floor = static_cast<double>(rng() % 5) / 4.0;
    const std::vector<int64_t> quotas = PlanLayersByMass(Scored(scores), total, floor);
    SCOPED_TRACE(Message() << "round " << round << " total " << total);
    ASSERT_EQ(quotas.size(), static_cast<size_t>(layers));
    EXPECT_EQ(Sum(quotas), std::min<int64_t>(total, int64_t{layers} * pages));
    const auto least =
        std::max<int64_t>(1, static_cast<int64_t>(floor * static_cast<double>(total) / layers));
    for (const int64_t quota : quotas) {
      EXPECT_GE(quota, std::min<int64_t>(least, pages));
      EXPECT_LE(quota, std::max(pages, 1));
    }
    // No other split of the same total within the floors and caps keeps more.
    std::vector<int64_t> other(static_cast<size_t>(layers), 0);
    double best = -1.0;
    std::function<void(size_t, int64_t)> each = [&](size_t l, int64_t left) {
      if (l == other.size()) {
        if (left == 0) best = std::max(best, Kept(scores, other));
        return;
      }
      for (int64_t k = std::min<int64_t>(least, pages); k <= pages && k <= left; ++k) {
        other[l] = k;
        each(l + 1, left - k);
      }
    };
    each(0, Sum(quotas));
    EXPECT_NEAR(Kept(scores, quotas), best, 1e-5);
  }
}

TEST(LayerQuotasTest, ValidateLayerFloorNamesTheField) {
  EXPECT_TRUE(ValidateLayerFloor("budget.layer_floor", 0.0).ok());
  EXPECT_TRUE(ValidateLayerFloor("budget.layer_floor", 1.0).ok());
  for (const double bad : {-0.1, 1.5, std::nan("")}) {
    EXPECT_THAT(ValidateLayerFloor("budget.layer_floor", bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("budget.layer_floor: must be in [0, 1]")));
  }
}

// SelectAtQuota over a decision that kept every page with its page scores gives what the
// scorers give at that quota, on the reference and fused paths, in group scope, layer scope and
// with group quotas that move, with live pages and protections.
TEST(LayerQuotasTest, ChoosingAgainAtAQuotaIsTheScorersOwnDecisionThere) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    const int groups = 1 + static_cast<int>(rng() % 3);
    const int r = 1 + static_cast<int>(rng() % 3);
    const int64_t tokens = 1 + static_cast<int64_t>(rng() % 90);
    const std::vector<float> rows = ::entrokv::testing::MixedRows(groups * r, tokens, rng);
    ENTROKV_ASSERT_OK_AND_ASSIGN(
        StatisticView view, StatisticView::Create(reinterpret_cast<const uint8_t*>(rows.data()),
                                                  DType::kFloat32, groups * r, tokens));
    PolicyOptions options;
    options.page_size = 1 + static_cast<int>(rng() % 8);
    options.protections.tail_page = rng() % 2 == 0;
    options.protections.sink_pages = rng() % 2 == 0;
    options.protections.recent_pages = static_cast<int>(rng() % 3);
    const int64_t pages = (tokens + options.page_size - 1) / options.page_size;
    const int variant = static_cast<int>(rng() % 3);
    SelectionScope scope = variant == 1 ? SelectionScope::kLayer : SelectionScope::kGroup;
    if (variant == 2) options.group_floor = 0.25;
    std::vector<uint8_t> live(static_cast<size_t>(groups * pages), 1);
    if (scope == SelectionScope::kGroup && rng() % 2 == 0) {
      for (uint8_t& held : live) held = rng() % 4 != 0;
    }
    const int64_t quota = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(pages));
    const char* name = rng() % 2 == 0 ? "page_entrokv" : "snapkv";
    const Policy& policy = **FindPolicy(name);
    LayerRequest all = LayerRequestFor(view, groups * r, groups, tokens, pages);
    all.scope = scope;
    all.live_pages = live;
    all.page_scores = true;
    all.measure = false;
    LayerRequest at = all;
    at.quota_pages = quota;
    SCOPED_TRACE(Message() << "round " << round << " " << name << " variant " << variant);
    for (const bool fused : {false, true}) {
      FusedScorer scorer(options);
      ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision chosen, fused ? scorer.DecideLayer(policy, all)
                                                               : DecideLayer(policy, options, all));
      SelectAtQuota(options, at, &chosen);
      ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision direct, fused ? scorer.DecideLayer(policy, at)
                                                               : DecideLayer(policy, options, at));
      EXPECT_EQ(chosen.quota_pages, quota);
      EXPECT_EQ(chosen.union_pages, direct.union_pages);
      ASSERT_EQ(chosen.groups.size(), direct.groups.size());
      for (size_t g = 0; g < direct.groups.size(); ++g) {
        EXPECT_EQ(chosen.groups[g].kept_pages, direct.groups[g].kept_pages) << "group " << g;
        EXPECT_EQ(chosen.groups[g].page_scores, direct.groups[g].page_scores) << "group " << g;
      }
    }
  }
}

}  // namespace
}  // namespace entrokv
