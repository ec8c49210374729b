#include "core/scoring/selection.h"

#include <limits>
#include <random>
#include <vector>

#include "core/testing/random_rows.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::testing::ElementsAre;

TEST(SelectionTest, KeepsHighestScoresInAscendingOrder) {
  const std::vector<float> scores = {0.1f, 0.9f, 0.3f, 0.8f, 0.2f};
  EXPECT_THAT(SelectTopPages(scores, 2), ElementsAre(1, 3));
}

TEST(SelectionTest, TiesGoToTheLowerPageIndex) {
  const std::vector<float> scores = {0.5f, 0.5f, 0.5f, 0.5f, 0.7f};
  EXPECT_THAT(SelectTopPages(scores, 3), ElementsAre(0, 1, 4));
  EXPECT_THAT(SelectTopPages(std::vector<float>(6, 0.0f), 2), ElementsAre(0, 1));
}

TEST(SelectionTest, KLargerThanPageCountKeepsEverything) {
  EXPECT_THAT(SelectTopPages(std::vector<float>{3, 1, 2}, 10), ElementsAre(0, 1, 2));
}

// SelectTopPages after the protections' pages, as every policy calls it.
std::vector<int32_t> SelectProtected(const std::vector<float>& scores, int64_t k,
                                     const Protections& protections, int64_t sink_pages,
                                     std::span<const uint8_t> live = {}) {
  const auto pages = static_cast<int64_t>(scores.size());
  return SelectTopPages(scores, k, ProtectedPages(protections, sink_pages, pages, k, live), live);
}

TEST(SelectionTest, ProtectionsCountInsideK) {
  const std::vector<float> scores = {0.0f, 0.9f, 0.8f, 0.7f, 0.0f, 0.1f};
  Protections tail;
  tail.tail_page = true;
  EXPECT_THAT(SelectProtected(scores, 2, tail, 0), ElementsAre(1, 5));
  Protections sinks;
  sinks.sink_pages = true;
  EXPECT_THAT(SelectProtected(scores, 3, sinks, 2), ElementsAre(0, 1, 2));
  Protections recent;
  recent.recent_pages = 2;
  EXPECT_THAT(SelectProtected(scores, 3, recent, 0), ElementsAre(1, 4, 5));
  // Protected pages beyond K: the tail first, then the sinks, then the recent pages.
  Protections all = sinks;
  all.tail_page = true;
  all.recent_pages = 3;
  EXPECT_THAT(SelectProtected(scores, 2, all, 2), ElementsAre(0, 5));
  EXPECT_THAT(ProtectedPages(all, 2, 6, 10), ElementsAre(5, 0, 1, 4, 3));
}

// Protections of any size cost what the page count costs and list each page once.
TEST(SelectionTest, HugeProtectionsAreClampedToThePages) {
  Protections huge;
  huge.tail_page = true;
  huge.sink_pages = true;
  huge.recent_pages = std::numeric_limits<int32_t>::max();
  EXPECT_THAT(ProtectedPages(huge, std::numeric_limits<int64_t>::max(), 4, 100),
              ElementsAre(3, 0, 1, 2));
  EXPECT_THAT(ProtectedPages(huge, 0, 5, 3), ElementsAre(4, 3, 2));
  const std::vector<float> scores(1000, 1.0f);
  EXPECT_THAT(SelectProtected(scores, 2, huge, 0), ElementsAre(998, 999));
}

// Evicted pages are never kept, even when they score highest or are protected,
// and the group keeps exactly min(K, live pages).
TEST(SelectionTest, EvictedPagesAreNeverKept) {
  const std::vector<float> scores = {9.0f, 8.0f, 1.0f, 2.0f, 7.0f, 3.0f};
  const std::vector<uint8_t> live = {0, 1, 1, 1, 0, 0};
  EXPECT_THAT(SelectTopPages(scores, 2, {}, live), ElementsAre(1, 3));
  EXPECT_THAT(SelectTopPages(scores, 3, {}, live), ElementsAre(1, 2, 3));
  EXPECT_THAT(SelectTopPages(scores, 5, {}, live), ElementsAre(1, 2, 3));
  Protections all;
  all.tail_page = true;  // page 5 is evicted: nothing to protect there
  all.sink_pages = true;
  all.recent_pages = 3;
  EXPECT_THAT(ProtectedPages(all, 1, 6, 2, live), ElementsAre(3));
  EXPECT_THAT(SelectProtected(scores, 2, all, 1, live), ElementsAre(1, 3));
}

TEST(SelectionTest, MatchesTheSortReferenceOnRandomAndTiedScores) {
  const uint64_t seed = 42;
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t pages = 1 + static_cast<int64_t>(rng() % 200);
    std::vector<float> scores(static_cast<size_t>(pages));
    const int levels = 1 + static_cast<int>(rng() % 8);  // few levels: many ties
    for (float& score : scores) score = static_cast<float>(rng() % levels);
    const int64_t k = static_cast<int64_t>(rng() % (pages + 3));
    EXPECT_EQ(SelectTopPages(scores, k), SelectTopPagesBySort(scores, k))
        << "seed " << seed << " trial " << trial;
  }
}

TEST(SelectionTest, ValidatesProtections) {
  Protections bad;
  bad.recent_pages = -1;
  EXPECT_EQ(ValidateProtections(bad).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace entrokv
