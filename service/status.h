// The one place an absl::Status becomes a grpc::Status (STYLE.md §5).
#ifndef ENTROKV_SERVICE_STATUS_H_
#define ENTROKV_SERVICE_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace entrokv::service {

// Same code (the numeric values of both enums are the gRPC codes), same message. Any code
// outside the gRPC range becomes INTERNAL.
[[nodiscard]] grpc::Status ToGrpcStatus(const absl::Status& status);

// The reverse, for code that handles a gRPC result (the client side of tests and benchmarks).
[[nodiscard]] absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_STATUS_H_
