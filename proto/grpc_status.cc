#include "proto/grpc_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "entrokv/v1/types.pb.h"

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
  // Payloads travel as the details of a google.rpc.Status (entrokv.v1.StatusDetails).
  v1::StatusDetails details;
  status.ForEachPayload([&details](absl::string_view type, const absl::Cord& payload) {
    google::protobuf::Any* any = details.add_details();
    any->set_type_url(std::string(type));
    any->set_value(std::string(payload));
  });
  const std::string message = Bounded(status.message());
  if (details.details_size() == 0) {
    return grpc::Status(static_cast<grpc::StatusCode>(code), message);
  }
  details.set_code(code);
  details.set_message(message);
  return grpc::Status(static_cast<grpc::StatusCode>(code), message, details.SerializeAsString());
}

std::string StatusCodeName(grpc::StatusCode code) {
  const int number = static_cast<int>(code);
  if (number < 0 || number >= kGrpcStatusCodeCount) return absl::StrCat("code ", number);
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(number));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  v1::StatusDetails details;
  if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
    for (const google::protobuf::Any& any : details.details()) {
      out.SetPayload(any.type_url(), absl::Cord(any.value()));
    }
  }
  return out;
}

}  // namespace entrokv
