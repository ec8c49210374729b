#include "proto/grpc_status.h"

#include <iterator>

#include "absl/strings/cord.h"
#include "entrokv/v1/types.pb.h"
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

TEST(ToGrpcStatusTest, PayloadsTravelAsStatusDetails) {
  absl::Status status = absl::ResourceExhaustedError("pool exhausted");
  EXPECT_TRUE(ToGrpcStatus(status).error_details().empty());
  status.SetPayload("type.googleapis.com/entrokv.v1.AdmissionHint", absl::Cord("\x08\x01"));
  const grpc::Status wire = ToGrpcStatus(status);
  v1::StatusDetails details;
  ASSERT_TRUE(details.ParseFromString(wire.error_details()));
  EXPECT_EQ(details.code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_EQ(details.message(), "pool exhausted");
  ASSERT_EQ(details.details_size(), 1);
  EXPECT_EQ(details.details(0).type_url(), "type.googleapis.com/entrokv.v1.AdmissionHint");
  EXPECT_EQ(details.details(0).value(), "\x08\x01");
  const absl::Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back, status);  // code, message and payloads
  // Details that do not parse are left out, the code and message kept.
  const absl::Status garbled = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "pool exhausted", "\xff\xff"));
  EXPECT_EQ(garbled, absl::ResourceExhaustedError("pool exhausted"));
}

TEST(FromGrpcStatusTest, OkStaysOk) { EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok()); }

// StatusCodeName reads Abseil's table by gRPC's numbers: that holds only while the two enums
// agree value for value, so every code is checked by name on both sides.
TEST(StatusCodeNameTest, GrpcAndAbseilShareEveryNumber) {
  struct Pair {
    grpc::StatusCode grpc;
    absl::StatusCode absl;
    const char* name;
  };
  const Pair kCodes[] = {
      {grpc::StatusCode::OK, absl::StatusCode::kOk, "OK"},
      {grpc::StatusCode::CANCELLED, absl::StatusCode::kCancelled, "CANCELLED"},
      {grpc::StatusCode::UNKNOWN, absl::StatusCode::kUnknown, "UNKNOWN"},
      {grpc::StatusCode::INVALID_ARGUMENT, absl::StatusCode::kInvalidArgument, "INVALID_ARGUMENT"},
      {grpc::StatusCode::DEADLINE_EXCEEDED, absl::StatusCode::kDeadlineExceeded,
       "DEADLINE_EXCEEDED"},
      {grpc::StatusCode::NOT_FOUND, absl::StatusCode::kNotFound, "NOT_FOUND"},
      {grpc::StatusCode::ALREADY_EXISTS, absl::StatusCode::kAlreadyExists, "ALREADY_EXISTS"},
      {grpc::StatusCode::PERMISSION_DENIED, absl::StatusCode::kPermissionDenied,
       "PERMISSION_DENIED"},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StatusCode::kResourceExhausted,
       "RESOURCE_EXHAUSTED"},
      {grpc::StatusCode::FAILED_PRECONDITION, absl::StatusCode::kFailedPrecondition,
       "FAILED_PRECONDITION"},
      {grpc::StatusCode::ABORTED, absl::StatusCode::kAborted, "ABORTED"},
      {grpc::StatusCode::OUT_OF_RANGE, absl::StatusCode::kOutOfRange, "OUT_OF_RANGE"},
      {grpc::StatusCode::UNIMPLEMENTED, absl::StatusCode::kUnimplemented, "UNIMPLEMENTED"},
      {grpc::StatusCode::INTERNAL, absl::StatusCode::kInternal, "INTERNAL"},
      {grpc::StatusCode::UNAVAILABLE, absl::StatusCode::kUnavailable, "UNAVAILABLE"},
      {grpc::StatusCode::DATA_LOSS, absl::StatusCode::kDataLoss, "DATA_LOSS"},
      {grpc::StatusCode::UNAUTHENTICATED, absl::StatusCode::kUnauthenticated, "UNAUTHENTICATED"},
  };
  ASSERT_EQ(std::size(kCodes), static_cast<size_t>(kGrpcStatusCodeCount));
  for (int i = 0; i < kGrpcStatusCodeCount; ++i) {
    const Pair& pair = kCodes[i];
    EXPECT_EQ(static_cast<int>(pair.grpc), i) << pair.name;
    EXPECT_EQ(static_cast<int>(pair.absl), i) << pair.name;
    EXPECT_EQ(StatusCodeName(pair.grpc), pair.name);
  }
  EXPECT_EQ(StatusCodeName(static_cast<grpc::StatusCode>(17)), "code 17");
  EXPECT_EQ(StatusCodeName(static_cast<grpc::StatusCode>(-1)), "code -1");
}

}  // namespace
}  // namespace entrokv
