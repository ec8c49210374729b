// The one conversion between absl::Status and grpc::Status (one translation per boundary), shared
// by the daemon (server side) and the C++ client, tests and benchmarks (client side).
#ifndef ENTROKV_PROTO_GRPC_STATUS_H_
#define ENTROKV_PROTO_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace entrokv {

// Same code (the numeric values of both enums are the gRPC codes), same message. Any code
// outside the gRPC range becomes INTERNAL. The status's payloads (absl::Status::SetPayload,
// keyed by type URL) become the details: a serialized entrokv.v1.StatusDetails (the wire form
// of google.rpc.Status), which gRPC sends as the grpc-status-details-bin trailer.
[[nodiscard]] grpc::Status ToGrpcStatus(const absl::Status& status);

// The reverse: same code and message, and the details' entries as payloads; OK stays OK.
[[nodiscard]] absl::Status FromGrpcStatus(const grpc::Status& status);

// The canonical codes, OK (0) to UNAUTHENTICATED (16).
inline constexpr int kGrpcStatusCodeCount = 17;

// A code's canonical name ("INVALID_ARGUMENT"), from Abseil's one table
// (absl::StatusCodeToString: Abseil's codes are gRPC's, number for number); "code N" for a
// number outside the canonical codes.
[[nodiscard]] std::string StatusCodeName(grpc::StatusCode code);

}  // namespace entrokv

#endif  // ENTROKV_PROTO_GRPC_STATUS_H_
