#include "service/protobuf_log.h"

#include <string>

#include "absl/strings/str_split.h"
#include "entrokv/v1/cache_manager.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::service {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

TEST(LogThrottleTest, AdmitsOnePerIntervalAndCountsTheDropped) {
  LogThrottle throttle(absl::Seconds(10));
  const absl::Time start = absl::FromUnixSeconds(1'000'000);
  EXPECT_THAT(throttle.Admit(start), Optional(0));
  EXPECT_EQ(throttle.Admit(start + absl::Seconds(1)), std::nullopt);
  EXPECT_EQ(throttle.Admit(start + absl::Seconds(5)), std::nullopt);
  EXPECT_EQ(throttle.Admit(start + absl::Seconds(9)), std::nullopt);
  EXPECT_THAT(throttle.Admit(start + absl::Seconds(10)), Optional(3));
  EXPECT_THAT(throttle.Admit(start + absl::Seconds(25)), Optional(0));
}

// A client sending many strings that are not UTF-8 (each one a protobuf log line) leaves one
// line in the daemon's format, not one per request.
TEST(ProtobufLogTest, NonUtf8StringsLeaveOneThrottledLineInTheDaemonsFormat) {
  RouteProtobufLogs(absl::Hours(1));
  v1::OpenSequenceRequest request;
  request.set_model_id("\xc3\x28");
  ::testing::internal::CaptureStderr();
  const std::string wire = request.SerializeAsString();
  int parsed = 0;
  for (int i = 0; i < 100; ++i) parsed += v1::OpenSequenceRequest().ParseFromString(wire);
  const std::string written = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(parsed, 0) << "a string that is not UTF-8 must still make the message unparsable";
  const std::vector<std::string> lines = absl::StrSplit(written, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << written;
  EXPECT_THAT(lines[0], HasSubstr("entrokvd ERROR: protobuf: "));
  EXPECT_THAT(lines[0], HasSubstr("UTF-8"));
}

}  // namespace
}  // namespace entrokv::service
