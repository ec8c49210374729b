#include "core/scoring/selection.h"

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

TEST(SelectionTest, ProtectionsCountInsideK) {
  const std::vector<float> scores = {0.0f, 0.9f, 0.8f, 0.7f, 0.0f, 0.1f};
  Protections tail;
  tail.tail_page = true;
  EXPECT_THAT(SelectTopPages(scores, 2, tail), ElementsAre(1, 5));
  Protections sinks;
  sinks.sink_pages = true;
  sinks.sink_tokens = 20;  // two pages of 16
  sinks.page_size = 16;
  EXPECT_THAT(SelectTopPages(scores, 3, sinks), ElementsAre(0, 1, 2));
  Protections recent;
  recent.recent_pages = 2;
  EXPECT_THAT(SelectTopPages(scores, 3, recent), ElementsAre(1, 4, 5));
  // Protected pages beyond K: the tail first, then the sinks, then the recent pages.
  Protections all = sinks;
  all.tail_page = true;
  all.recent_pages = 3;
  EXPECT_THAT(SelectTopPages(scores, 2, all), ElementsAre(0, 5));
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
