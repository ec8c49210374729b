// Pool pressure on the wire: the one translation between the contract's pressure messages
// (types.proto, "Pool pressure") and the core's (core/pool/pressure.h), shared by entrokvd, the
// CLI and the C++ client.
#ifndef ENTROKV_WIRE_PRESSURE_H_
#define ENTROKV_WIRE_PRESSURE_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "core/pool/pressure.h"
#include "core/pool/sequence.h"
#include "entrokv/v1/cache_manager.pb.h"
#include "entrokv/v1/types.pb.h"

namespace entrokv::wire {

// The status payload (absl::Status::SetPayload) an AdmissionHint travels under; ToGrpcStatus
// sends every payload in the grpc-status-details-bin trailer as a StatusDetails.
inline constexpr char kAdmissionHintType[] = "type.googleapis.com/entrokv.v1.AdmissionHint";

// An OpenSequence's tenant, priority and AutoBudget, unchecked (CacheState checks them, naming
// the request's fields).
[[nodiscard]] SequenceTerms ToSequenceTerms(const v1::OpenSequenceRequest& request);

[[nodiscard]] v1::PressureInfo ToProto(const PressureReport& report);
[[nodiscard]] v1::AdmissionHint ToProto(const AdmissionRefusal& refusal);

// `status` (RESOURCE_EXHAUSTED) carrying `refusal` as an AdmissionHint payload.
[[nodiscard]] absl::Status WithAdmissionHint(absl::Status status, const AdmissionRefusal& refusal);
// The AdmissionHint a status carries, if any.
[[nodiscard]] std::optional<v1::AdmissionHint> AdmissionHintOf(const absl::Status& status);

// The pages a call evicted from the caller's own sequence.
void FillEvicted(const std::vector<AppendResult::Evicted>& evicted,
                 google::protobuf::RepeatedPtrField<v1::GroupEviction>* out);
// PoolStats' pressure fields.
void FillPressureStats(const PressureStats& stats, v1::PoolStats* out);

}  // namespace entrokv::wire

#endif  // ENTROKV_WIRE_PRESSURE_H_
