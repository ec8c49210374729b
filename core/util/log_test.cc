#include "core/util/log.h"

#include "absl/time/civil_time.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

TEST(LogTest, LineHasTimestampLevelAndMessage) {
  const absl::Time time =
      absl::FromCivil(absl::CivilSecond(2026, 11, 30, 12, 0, 5), absl::UTCTimeZone()) +
      absl::Milliseconds(42);
  EXPECT_EQ(FormatLogLine(time, LogLevel::kWarning, "drain started"),
            "2026-11-30T12:00:05.042Z entrokvd WARNING: drain started\n");
  EXPECT_EQ(FormatLogLine(time, LogLevel::kError, "x"),
            "2026-11-30T12:00:05.042Z entrokvd ERROR: x\n");
  EXPECT_EQ(FormatLogLine(time, LogLevel::kFatal, "y"),
            "2026-11-30T12:00:05.042Z entrokvd FATAL: y\n");
}

TEST(LogTest, ParsesLevelsAndNamesTheFlag) {
  EXPECT_EQ(*ParseLogLevel("info"), LogLevel::kInfo);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("error"), LogLevel::kError);
  EXPECT_THAT(ParseLogLevel("loud"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--log_level")));
  // Fatal lines cannot be dropped, so "fatal" is no minimum level.
  EXPECT_THAT(ParseLogLevel("fatal"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--log_level")));
}

TEST(LogTest, DropsLinesBelowTheMinimumLevel) {
  SetMinLogLevel(LogLevel::kError);
  ::testing::internal::CaptureStderr();
  LogInfo("dropped");
  LogWarning("dropped too");
  LogError("kept");
  const std::string written = ::testing::internal::GetCapturedStderr();
  SetMinLogLevel(LogLevel::kInfo);
  EXPECT_THAT(written, HasSubstr("ERROR: kept\n"));
  EXPECT_THAT(written, ::testing::Not(HasSubstr("dropped")));
}

TEST(LogDeathTest, FatalWritesItsLineAtAnyLevelAndAborts) {
  EXPECT_DEATH(
      {
        SetMinLogLevel(LogLevel::kError);
        LogFatal("journal write failed; stopping");
      },
      "[0-9]Z entrokvd FATAL: journal write failed; stopping\n");
}

}  // namespace
}  // namespace entrokv
