// GoogleTest matchers for absl::Status, which Debian's Abseil (20220623) does not ship.
#ifndef ENTROKV_CORE_TESTING_STATUS_MATCHERS_H_
#define ENTROKV_CORE_TESTING_STATUS_MATCHERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace entrokv::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tau")))
MATCHER_P2(StatusIs, code, message_matcher, "has code " + absl::StatusCodeToString(code)) {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "status is " << status.ToString();
  return status.code() == code &&
         ::testing::Matches(message_matcher)(std::string(status.message()));
}

MATCHER(IsOk, "is OK") {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "status is " << status.ToString();
  return status.ok();
}

}  // namespace entrokv::testing

#define ENTROKV_ASSERT_OK_AND_ASSIGN(lhs, expr)            \
  auto ENTROKV_CONCAT_(_status_or_, __LINE__) = (expr);    \
  ASSERT_TRUE(ENTROKV_CONCAT_(_status_or_, __LINE__).ok()) \
      << ENTROKV_CONCAT_(_status_or_, __LINE__).status();  \
  lhs = std::move(*ENTROKV_CONCAT_(_status_or_, __LINE__))
#define ENTROKV_CONCAT_INNER_(a, b) a##b
#define ENTROKV_CONCAT_(a, b) ENTROKV_CONCAT_INNER_(a, b)

#endif  // ENTROKV_CORE_TESTING_STATUS_MATCHERS_H_
