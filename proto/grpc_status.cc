#include "proto/grpc_status.h"

#include <string>

namespace entrokv {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  if (code <= 0 || code > static_cast<int>(grpc::StatusCode::UNAUTHENTICATED)) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(status.message()));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(code), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace entrokv
