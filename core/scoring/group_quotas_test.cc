// Group quotas that move between the groups of a layer (group_quotas.h): the layer keeps exactly
// what fixed quotas keep, every group its floor and its protections, no evicted page, the pages
// of highest normalised score; bad options are refused by name; the fused path's bits are
// fused_scorer_test's random cases.
#include "core/scoring/group_quotas.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/scoring/decision.h"
#include "core/scoring/fused_scorer.h"
#include "core/testing/random_rows.h"
#include "core/testing/status_matchers.h"
#include "core/util/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A decision of `groups` groups over `scores` (one row of n page scores per group), page size 1
// and one head per group, so that the statistic's rows are the page scores.
absl::StatusOr<LayerDecision> Decide(const std::vector<std::vector<float>>& scores, int64_t quota,
                                     double floor, std::span<const uint8_t> live = {},
                                     const Protections& protections = {}) {
  const auto groups = static_cast<int>(scores.size());
  const auto pages = static_cast<int64_t>(scores.front().size());
  std::vector<float> values;
  for (const auto& row : scores) values.insert(values.end(), row.begin(), row.end());
  ASSIGN_OR_RETURN(StatisticView view,
                   StatisticView::Create(reinterpret_cast<const uint8_t*>(values.data()),
                                         DType::kFloat32, groups, pages));
  PolicyOptions options;
  options.page_size = 1;
  options.sink_tokens = 0;
  options.group_floor = floor;
  options.protections = protections;
  LayerRequest request = LayerRequestFor(view, groups, groups, pages, quota);
  request.live_pages = live;
  return DecideLayer(**FindPolicy("mean"), options, request);
}

int64_t KeptPages(const LayerDecision& decision) {
  int64_t kept = 0;
  for (const GroupDecision& group : decision.groups) {
    kept += static_cast<int64_t>(group.kept_pages.size());
  }
  return kept;
}

TEST(GroupQuotasTest, AGroupWhoseMassIsOnOnePageGivesItsOtherPagesToASpreadGroup) {
  // Group 0 has all its mass on page 0; group 1 spreads it. K = 4 each, floor 1/4: one page each,
  // and the six others all go to group 1, whose pages outweigh group 0's empty ones.
  const std::vector<std::vector<float>> scores = {{10, 0, 0, 0, 0, 0, 0, 0},
                                                  {1, 2, 3, 4, 5, 6, 7, 8}};
  ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision moved, Decide(scores, 4, 0.25));
  EXPECT_THAT(moved.groups[0].kept_pages, ElementsAre(0));
  EXPECT_THAT(moved.groups[1].kept_pages, ElementsAre(1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(KeptPages(moved), 8);
  EXPECT_EQ(moved.union_pages, 8);

  // Floor 1 is fixed quotas; a floor of 3/4 leaves one page each to move.
  ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision fixed, Decide(scores, 4, 1.0));
  EXPECT_THAT(fixed.groups[0].kept_pages, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(fixed.groups[1].kept_pages, ElementsAre(4, 5, 6, 7));
  ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision three, Decide(scores, 4, 0.75));
  EXPECT_THAT(three.groups[0].kept_pages, ElementsAre(0, 1, 2));
  EXPECT_THAT(three.groups[1].kept_pages, ElementsAre(3, 4, 5, 6, 7));
}

TEST(GroupQuotasTest, EvictedPagesStayOutAndTheLayerKeepsWhatFixedQuotasWould) {
  // Group 1 holds only pages 0 and 1 after earlier evictions: fixed quotas keep 4 + 2 pages,
  // and so do moved ones, with none of group 1's evicted pages back.
  const std::vector<std::vector<float>> scores = {{1, 1, 1, 1, 1, 1, 1, 1},
                                                  {0, 0, 9, 9, 9, 9, 9, 9}};
  const std::vector<uint8_t> live = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0};
  ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision moved, Decide(scores, 4, 0.0, live));
  EXPECT_EQ(KeptPages(moved), 6);
  for (const int32_t page : moved.groups[1].kept_pages) EXPECT_LT(page, 2);
}

TEST(GroupQuotasTest, ProtectedPagesStayInTheirGroupWhateverTheFloor) {
  // Floor 0 and a group with no mass: it still keeps its tail page.
  const std::vector<std::vector<float>> scores = {{0, 0, 0, 0, 0, 0}, {1, 2, 3, 4, 5, 6}};
  Protections tail;
  tail.tail_page = true;
  ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision moved, Decide(scores, 3, 0.0, {}, tail));
  EXPECT_THAT(moved.groups[0].kept_pages, ElementsAre(5));
  EXPECT_THAT(moved.groups[1].kept_pages, ElementsAre(1, 2, 3, 4, 5));
  // Without protections it keeps one page all the same, its first (ties to the lower page).
  ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision bare, Decide(scores, 3, 0.0));
  EXPECT_THAT(bare.groups[0].kept_pages, ElementsAre(0));
  EXPECT_THAT(bare.groups[1].kept_pages, ElementsAre(1, 2, 3, 4, 5));
}

TEST(GroupQuotasTest, RandomLayersKeepTheirTotalsFloorsAndTheBestPages) {
  std::mt19937_64 rng(20261205);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 400; ++trial) {
    const int groups = pick(1, 6);
    const int64_t pages = pick(1, 40);
    const int64_t quota = pick(1, static_cast<int>(pages) + 2);
    const double floor = std::vector<double>{0.0, 0.2, 0.5, 0.99}[static_cast<size_t>(pick(0, 3))];
    std::vector<std::vector<float>> scores(static_cast<size_t>(groups));
    std::vector<uint8_t> live;
    for (auto& row : scores) {
      const bool coarse = pick(0, 1) == 0;  // ties
      for (int64_t b = 0; b < pages; ++b) {
        row.push_back(coarse ? static_cast<float>(pick(0, 2))
                             : static_cast<float>(testing::Uniform01(rng)));
        live.push_back(pick(0, 4) == 0 ? 0 : 1);
      }
    }
    if (pick(0, 1) == 0) live.clear();
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " G " << groups << " n " << pages
                                      << " K " << quota << " floor " << floor);
    ENTROKV_ASSERT_OK_AND_ASSIGN(LayerDecision moved, Decide(scores, quota, floor, live));
    int64_t total = 0;
    // The lowest normalised score kept beyond a floor, and the highest left: the first >= the
    // second (the layer keeps the best of what moves).
    double lowest_moved = std::numeric_limits<double>::infinity();
    double highest_left = -1.0;
    for (int g = 0; g < groups; ++g) {
      const auto& row = scores[static_cast<size_t>(g)];
      const auto& kept = moved.groups[static_cast<size_t>(g)].kept_pages;
      auto is_live = [&](int64_t b) {
        return live.empty() || live[static_cast<size_t>(g * pages + b)] != 0;
      };
      double mass = 0.0;
      int64_t live_count = 0;
      for (int64_t b = 0; b < pages; ++b) {
        if (is_live(b)) {
          mass += row[static_cast<size_t>(b)];
          ++live_count;
        }
      }
      const int64_t fixed = std::min(quota, live_count);
      total += fixed;
      ASSERT_TRUE(std::is_sorted(kept.begin(), kept.end()));
      ASSERT_EQ(std::adjacent_find(kept.begin(), kept.end()), kept.end());
      const int64_t floor_pages =
          std::max(static_cast<int64_t>(std::ceil(floor * static_cast<double>(fixed))),
                   std::min<int64_t>(1, fixed));
      EXPECT_GE(static_cast<int64_t>(kept.size()), floor_pages) << "group " << g;
      for (const int32_t page : kept) EXPECT_TRUE(is_live(page)) << "group " << g;
      // Beyond the floor, a group's kept pages score at least as high as its dropped ones.
      std::vector<double> in;
      std::vector<double> out;
      for (int64_t b = 0; b < pages; ++b) {
        if (!is_live(b)) continue;
        const double normalised = mass > 0.0 ? row[static_cast<size_t>(b)] * (1.0 / mass) : 0.0;
        const bool is_kept = std::binary_search(kept.begin(), kept.end(), static_cast<int32_t>(b));
        (is_kept ? in : out).push_back(normalised);
      }
      if (!in.empty() && !out.empty()) {
        EXPECT_GE(*std::min_element(in.begin(), in.end()),
                  *std::max_element(out.begin(), out.end()))
            << "group " << g;
      }
      if (static_cast<int64_t>(kept.size()) > floor_pages && !in.empty()) {
        lowest_moved = std::min(lowest_moved, *std::min_element(in.begin(), in.end()));
      }
      if (static_cast<int64_t>(kept.size()) < live_count && !out.empty()) {
        highest_left = std::max(highest_left, *std::max_element(out.begin(), out.end()));
      }
    }
    EXPECT_EQ(KeptPages(moved), total);
    EXPECT_GE(lowest_moved, highest_left);
  }
}

TEST(GroupQuotasTest, BadFloorsAndWhatCannotMoveQuotasAreRefusedByName) {
  PolicyOptions options;
  for (const double floor : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    options.group_floor = floor;
    EXPECT_THAT(ValidatePolicyOptions(options),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group_floor")));
  }
  const std::vector<float> values(2 * 32, 1.0f);
  ENTROKV_ASSERT_OK_AND_ASSIGN(
      StatisticView view, StatisticView::Create(reinterpret_cast<const uint8_t*>(values.data()),
                                                DType::kFloat32, 2, 32));
  options.group_floor = 0.5;
  LayerRequest request = LayerRequestFor(view, 2, 2, 32, 1);
  request.scope = SelectionScope::kLayer;
  EXPECT_THAT(DecideLayer(**FindPolicy("mean"), options, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group_floor")));
  request.scope = SelectionScope::kGroup;
  for (const char* name : {"head_independent", "streaming"}) {
    EXPECT_THAT(DecideLayer(**FindPolicy(name), options, request),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group_floor")))
        << name;
  }
  FusedScorer scorer(options);
  request.scope = SelectionScope::kLayer;
  EXPECT_THAT(scorer.DecideLayer(**FindPolicy("mean"), request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group_floor")));
}

}  // namespace
}  // namespace entrokv
