#include "wire/checks.h"

#include <string>

#include "core/pool/sequence.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::wire {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::Eq;
using ::testing::HasSubstr;

TEST(ValidateIdTest, AcceptsAndRejects) {
  EXPECT_THAT(ValidateId("model_id", "org/model-1.5b:v2"), IsOk());
  EXPECT_THAT(ValidateId("model_id", std::string(kMaxIdLength, 'a')), IsOk());
  EXPECT_THAT(ValidateId("model_id", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model_id")));
  EXPECT_THAT(ValidateId("sequence_id", std::string(kMaxIdLength + 1, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sequence_id")));
  EXPECT_THAT(ValidateId("sequence_id", "a b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sequence_id")));
}

TEST(ValidateTokenCountTest, BoundsAreInclusive) {
  EXPECT_THAT(ValidateTokenCount("tokens", 1, 1), IsOk());
  EXPECT_THAT(ValidateTokenCount("tokens", kMaxSequenceTokens, 1), IsOk());
  EXPECT_THAT(ValidateTokenCount("initial_tokens", 0, 0), IsOk());
  EXPECT_THAT(ValidateTokenCount("tokens", 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens: must be in [1, ")));
  EXPECT_THAT(ValidateTokenCount("tokens", kMaxSequenceTokens + 1, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens")));
}

TEST(ValidateAnswerWithinTest, BoundsAreInclusive) {
  EXPECT_THAT(ValidateAnswerWithin("answer_within_ms", 0), IsOk());
  EXPECT_THAT(ValidateAnswerWithin("answer_within_ms", kMaxAnswerWithinMs), IsOk());
  EXPECT_THAT(ValidateAnswerWithin("answer_within_ms", -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("answer_within_ms: must be")));
  EXPECT_THAT(ValidateAnswerWithin("x", kMaxAnswerWithinMs + 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x: must be")));
}

TEST(EchoInputTest, CutsLongInput) {
  EXPECT_EQ(EchoInput("short"), "short");
  const std::string longest(kMaxEchoedChars, 'y');
  EXPECT_EQ(EchoInput(longest), longest);
  EXPECT_EQ(EchoInput(longest + "z"), longest + "...");
  const std::string echoed = EchoInput(std::string(1 << 20, 'x'));
  EXPECT_EQ(echoed, std::string(kMaxEchoedChars, 'x') + "...");
}

TEST(AnnotateTest, PrefixesTheMessageAndKeepsTheCode) {
  EXPECT_THAT(Annotate(absl::OkStatus(), "layer"), IsOk());
  EXPECT_THAT(Annotate(absl::NotFoundError("gone"), "layers[2]"),
              StatusIs(absl::StatusCode::kNotFound, Eq("layers[2]: gone")));
}

}  // namespace
}  // namespace entrokv::wire
