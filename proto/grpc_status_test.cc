#include "proto/grpc_status.h"

#include "gtest/gtest.h"

namespace entrokv {
namespace {

TEST(ToGrpcStatusTest, KeepsCodeAndMessage) {
  const grpc::Status status = ToGrpcStatus(absl::InvalidArgumentError("tau: must be > 0"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "tau: must be > 0");
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("x")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("x")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(ToGrpcStatusTest, OkIsOk) { EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok()); }

TEST(ToGrpcStatusTest, EveryCodeMapsToTheSameNumber) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), "m");
    EXPECT_EQ(static_cast<int>(ToGrpcStatus(status).error_code()), code);
  }
}

TEST(FromGrpcStatusTest, RoundTrips) {
  const absl::Status back =
      FromGrpcStatus(ToGrpcStatus(absl::FailedPreconditionError("tokens: 3 != 5")));
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(back.message(), "tokens: 3 != 5");
}

TEST(FromGrpcStatusTest, OkStaysOk) { EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok()); }

}  // namespace
}  // namespace entrokv
