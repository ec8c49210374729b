#include "core/scoring/cover_mix.h"

#include <limits>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// One group of two heads, 8 tokens in 4 pages of 2, the span [1, 3): page 0 holds the sinks and
// page 3 is the tail. The question's mass in the span is 1 on page 1 and 6 on page 2; the keys
// rank the pages 0, 3, 1, 2. Both heads send the same row, so the group mean is that row.
constexpr int kPageSize = 2;
constexpr CoverSpan kSpan{.first = 1, .end = 3};
const std::vector<float> kQuestion = {5, 5, 1, 0, 0, 6, 9, 9, 5, 5, 1, 0, 0, 6, 9, 9};
const std::vector<float> kKeys = {0, 4, 0, 0, 0, 0, 2, 2, 0, 4, 0, 0, 0, 0, 2, 2};

std::vector<float> Mixed(const std::vector<float>& question, const CoverMix& mix,
                         CoverSpan span = kSpan) {
  const StatisticView view =
      *StatisticView::Create(question.data(), DType::kFloat32, 2, kPageSize * 4);
  std::vector<float> rows = kKeys;
  EXPECT_TRUE(CoverThenFill(view, mix, /*group_heads=*/2, kPageSize, span, rows).ok());
  return rows;
}

// Half the mass: page 2 alone holds 6 of 7, then the keys' order fills (0, 3, 1). Nine tenths:
// pages 2 and 1, then 0 and 3. The pages outside the span (the question's favourite, page 3,
// included) are never taken first. A page's score is 4 less its place.
TEST(CoverThenFillTest, TheQuestionsPagesComeFirstUntilTheyHoldTheShare) {
  EXPECT_THAT(Mixed(kQuestion, CoverMix{.mass = 0.5, .question_kernel = 1, .keys_kernel = 1}),
              ElementsAre(3, 3, 1, 1, 4, 4, 2, 2, 3, 3, 1, 1, 4, 4, 2, 2));
  EXPECT_THAT(Mixed(kQuestion, CoverMix{.mass = 0.9, .question_kernel = 1, .keys_kernel = 1}),
              ElementsAre(2, 2, 3, 3, 4, 4, 1, 1, 2, 2, 3, 3, 4, 4, 1, 1));
}

// With the whole layer as the span, the question's favourite page 3 comes first and holds 18 of
// its 35 alone; the keys' order fills (0, 1, 2).
TEST(CoverThenFillTest, TheSpanDecidesWhichPagesCount) {
  EXPECT_THAT(Mixed(kQuestion, CoverMix{.mass = 0.3, .question_kernel = 1, .keys_kernel = 1},
                    CoverSpan{.first = 0, .end = 4}),
              ElementsAre(3, 3, 2, 2, 1, 1, 4, 4, 3, 3, 2, 2, 1, 1, 4, 4));
}

// A question with no mass in the span takes no page first: the keys' order alone.
TEST(CoverThenFillTest, NoQuestionMassInTheSpanLeavesTheKeysOrder) {
  const std::vector<float> outside = {5, 5, 0, 0, 0, 0, 9, 9, 5, 5, 0, 0, 0, 0, 9, 9};
  EXPECT_THAT(Mixed(outside, CoverMix{.mass = 0.5, .question_kernel = 1, .keys_kernel = 1}),
              ElementsAre(4, 4, 2, 2, 1, 1, 3, 3, 4, 4, 2, 2, 1, 1, 3, 3));
}

// The question's row is max-pooled before its ranking. With a kernel of 1 the whole mass needs
// pages 3 and 1. With a kernel of 3, token 6's 2 reaches across into page 2, which then ties
// page 3 and ranks first (the lower page): it is taken although it holds no mass.
TEST(CoverThenFillTest, TheQuestionsKernelPoolsBeforeTheRanking) {
  const std::vector<float> question = {0, 0, 0, 1, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 2, 0};
  const CoverSpan whole{.first = 0, .end = 4};
  EXPECT_THAT(Mixed(question, CoverMix{.mass = 1.0, .question_kernel = 1, .keys_kernel = 1}, whole),
              ElementsAre(2, 2, 3, 3, 1, 1, 4, 4, 2, 2, 3, 3, 1, 1, 4, 4));
  EXPECT_THAT(Mixed(question, CoverMix{.mass = 1.0, .question_kernel = 3, .keys_kernel = 1}, whole),
              ElementsAre(1, 1, 2, 2, 4, 4, 3, 3, 1, 1, 2, 2, 4, 4, 3, 3));
}

// Pooled forward over 3 tokens, token 2's 3 reaches tokens 3 and 4, into page 2, and not token
// 1: pages 1 and 2 rank first, then page 3 (token 7's 2), and the whole mass needs all three;
// page 0 comes last. Centred, token 2's 3 reaches back into page 0, which ranks first; pages 1
// and 3 then hold the mass, and page 2 comes last.
TEST(CoverThenFillTest, AForwardPoolRanksThePagesAfterTheQuestionsTokens) {
  const std::vector<float> question = {0, 0, 3, 0, 0, 0, 0, 2, 0, 0, 3, 0, 0, 0, 0, 2};
  const CoverSpan whole{.first = 0, .end = 4};
  const CoverMix forward{
      .mass = 1.0, .question_kernel = 3, .keys_kernel = 1, .question_forward = true};
  EXPECT_THAT(Mixed(question, forward, whole),
              ElementsAre(1, 1, 4, 4, 3, 3, 2, 2, 1, 1, 4, 4, 3, 3, 2, 2));
  EXPECT_THAT(Mixed(question, CoverMix{.mass = 1.0, .question_kernel = 3, .keys_kernel = 1}, whole),
              ElementsAre(4, 4, 3, 3, 1, 1, 2, 2, 4, 4, 3, 3, 1, 1, 2, 2));
  // A kernel of 1 pools nothing either way.
  EXPECT_EQ(
      Mixed(question, CoverMix{.mass = 1.0, .question_kernel = 1, .keys_kernel = 1}, whole),
      Mixed(question,
            CoverMix{.mass = 1.0, .question_kernel = 1, .keys_kernel = 1, .question_forward = true},
            whole));
}

// Keys that rank the sink page last (3, 1, 2, 0) and a question that ranks it first by its sink
// token's 9 (0, 2, 1, 3), with a mass of 1 on token 1 and 2 on page 2. Past the sinks, page 2
// holds the share alone and page 0 comes last. Ranked with the sinks, page 0 holds 1 of 3 and page
// 2 is needed too; were token 0's 9 counted, page 0 would hold 10 of 12 alone.
TEST(CoverThenFillTest, RankedSinkPagesComeFirstWithoutTheSinksMass) {
  const std::vector<float> question = {9, 1, 0, 0, 0, 2, 0, 0, 9, 1, 0, 0, 0, 2, 0, 0};
  const std::vector<float> keys = {0, 0, 3, 0, 1, 0, 4, 0, 0, 0, 3, 0, 1, 0, 4, 0};
  const StatisticView view = *StatisticView::Create(question.data(), DType::kFloat32, 2, 8);
  const auto mixed = [&](bool rank_sinks, int64_t sink_tokens) {
    std::vector<float> rows = keys;
    EXPECT_TRUE(
        CoverThenFill(
            view,
            CoverMix{.mass = 0.5, .question_kernel = 1, .keys_kernel = 1, .rank_sinks = rank_sinks},
            /*group_heads=*/2, kPageSize,
            CoverSpan{.first = 1, .end = 3, .sink_tokens = sink_tokens}, rows)
            .ok());
    return std::vector<float>(rows.begin(), rows.begin() + 8);
  };
  EXPECT_THAT(mixed(false, 1), ElementsAre(1, 1, 2, 2, 4, 4, 3, 3));
  EXPECT_THAT(mixed(true, 1), ElementsAre(4, 4, 1, 1, 3, 3, 2, 2));
  EXPECT_THAT(mixed(true, 0), ElementsAre(4, 4, 2, 2, 1, 1, 3, 3));
}

// The keys' heads are each pooled before their mean, as a policy with that neighbourhood pools
// them: head 0's 6 on token 2 and head 1's on token 3 meet on page 1 at 6 (pooled over 3, their
// mean is 3, 6, 6, 3 on tokens 1-4), ahead of pages 0 and 2 at 3. The mean pooled after would
// be 3 on tokens 1-4 and rank pages 0, 1, 2 alike. With no question mass the keys' order is the
// whole order.
TEST(CoverThenFillTest, TheKeysRankAsAPolicyPoolsThemHeadByHead) {
  const std::vector<float> question(16, 0.0f);
  const StatisticView view = *StatisticView::Create(question.data(), DType::kFloat32, 2, 8);
  std::vector<float> rows = {0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0};
  ASSERT_TRUE(CoverThenFill(view, CoverMix{.mass = 0.5, .question_kernel = 1, .keys_kernel = 3},
                            /*group_heads=*/2, kPageSize, kSpan, rows)
                  .ok());
  EXPECT_THAT(rows, ElementsAre(3, 3, 4, 4, 2, 2, 1, 1, 3, 3, 4, 4, 2, 2, 1, 1));
}

// Groups rank alone: the second group's question favours page 1, the first's page 2.
TEST(CoverThenFillTest, EachGroupOrdersItsOwnPages) {
  const std::vector<float> question = {0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0};
  const StatisticView view = *StatisticView::Create(question.data(), DType::kFloat32, 2, 8);
  std::vector<float> rows = kKeys;
  ASSERT_TRUE(CoverThenFill(view, CoverMix{.mass = 0.5, .question_kernel = 1, .keys_kernel = 1},
                            /*group_heads=*/1, kPageSize, kSpan, rows)
                  .ok());
  EXPECT_THAT(rows, ElementsAre(3, 3, 1, 1, 4, 4, 2, 2, 3, 3, 4, 4, 1, 1, 2, 2));
}

TEST(CoverThenFillTest, ABadSentValueIsNamedAndTheKeysAreLeft) {
  std::vector<float> question = kQuestion;
  question[9] = std::numeric_limits<float>::quiet_NaN();
  const StatisticView view = *StatisticView::Create(question.data(), DType::kFloat32, 2, 8);
  std::vector<float> rows = kKeys;
  EXPECT_THAT(CoverThenFill(view, CoverMix{}, 2, kPageSize, kSpan, rows),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head 1, token 1")));
  EXPECT_EQ(rows, kKeys);
}

// Past the sink pages, before the tail page or the protected newest pages, whichever are more.
TEST(CoverMixTest, TheSpanLeavesOutTheSinksAndTheProtectedNewestPages) {
  PolicyOptions options;  // page_size 16, sink_tokens 4
  options.protections.tail_page = true;
  CoverSpan span = CoverSpanOf(options, 100);  // 7 pages
  EXPECT_EQ(span.first, 1);
  EXPECT_EQ(span.end, 6);
  EXPECT_EQ(span.sink_tokens, 4);
  EXPECT_EQ(CoverSpanOf(options, 3).sink_tokens, 3);
  options.sink_tokens = 20;
  options.protections.recent_pages = 3;
  span = CoverSpanOf(options, 100);
  EXPECT_EQ(span.first, 2);
  EXPECT_EQ(span.end, 4);
  options.protections = Protections{};
  span = CoverSpanOf(options, 100);
  EXPECT_EQ(span.end, 7);
}

TEST(CoverMixTest, APolicyThatPoolsTokensAgainIsRefused) {
  const Policy& mean = **FindPolicy("mean");
  PolicyOptions options;
  EXPECT_TRUE(ValidateCoverPolicy("rule", mean, options).ok());
  EXPECT_TRUE(ValidateCoverPolicy("rule", **FindPolicy("page_entrokv"), options).ok());
  EXPECT_THAT(ValidateCoverPolicy("rule", **FindPolicy("snapkv"), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rule: ")));
  options.neighbourhood_kernel = 3;
  EXPECT_THAT(ValidateCoverPolicy("rule", mean, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("neighbourhood_kernel 3")));
}

TEST(CoverMixTest, BadParametersAreNamed) {
  EXPECT_TRUE(ValidateCoverMix("mix.", CoverMix{}).ok());
  EXPECT_TRUE(ValidateCoverMix("mix.", CoverMix{.mass = 1.0}).ok());
  EXPECT_THAT(ValidateCoverMix("mix.", CoverMix{.mass = 0.0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mix.mass")));
  EXPECT_THAT(ValidateCoverMix("mix.", CoverMix{.mass = std::numeric_limits<double>::quiet_NaN()}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mix.mass")));
  EXPECT_THAT(ValidateCoverMix("mix.", CoverMix{.mass = 1.5}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mix.mass")));
  EXPECT_THAT(ValidateCoverMix("mix.", CoverMix{.question_kernel = 4}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mix.question_kernel")));
  EXPECT_THAT(ValidateCoverMix("mix.", CoverMix{.keys_kernel = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mix.keys_kernel")));
}

}  // namespace
}  // namespace entrokv
