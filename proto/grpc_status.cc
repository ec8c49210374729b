#include "proto/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace entrokv {

namespace {

// Messages travel in the trailers, which the client caps (8 KiB by default); the handlers
// already cut echoed input (EchoInput), this is the last guard.
constexpr size_t kMaxMessageChars = 2048;

std::string Bounded(absl::string_view message) {
  if (message.size() <= kMaxMessageChars) return std::string(message);
  return std::string(message.substr(0, kMaxMessageChars)) + "...";
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  if (code <= 0 || code > static_cast<int>(grpc::StatusCode::UNAUTHENTICATED)) {
    return grpc::Status(grpc::StatusCode::INTERNAL, Bounded(status.message()));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(code), Bounded(status.message()));
}

std::string StatusCodeName(grpc::StatusCode code) {
  const int number = static_cast<int>(code);
  if (number < 0 || number >= kGrpcStatusCodeCount) return absl::StrCat("code ", number);
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(number));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace entrokv
