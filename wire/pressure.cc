#include "wire/pressure.h"

#include <string>

#include "absl/strings/cord.h"

namespace entrokv::wire {

SequenceTerms ToSequenceTerms(const v1::OpenSequenceRequest& request) {
  SequenceTerms terms;
  terms.tenant = request.tenant();
  terms.priority = request.priority();
  if (request.has_auto_budget()) terms.auto_floor = request.auto_budget().floor_fraction();
  return terms;
}

v1::PressureInfo ToProto(const PressureReport& report) {
  v1::PressureInfo info;
  info.set_quota_frames(report.quota_frames);
  info.set_live_frames(report.live_frames);
  info.set_floor_frames(report.floor_frames);
  info.set_occupancy(report.occupancy);
  info.set_target_occupancy(report.target_occupancy);
  info.set_reclaimed_frames(report.reclaimed_frames);
  info.set_preempt(report.preempt);
  return info;
}

v1::AdmissionHint ToProto(const AdmissionRefusal& refusal) {
  v1::AdmissionHint hint;
  hint.set_outcome(refusal.refused ? v1::AdmissionHint::OUTCOME_REFUSED
                                   : v1::AdmissionHint::OUTCOME_DELAYED);
  hint.set_missing_frames(refusal.missing_frames);
  hint.set_reclaiming_frames(refusal.reclaiming_frames);
  hint.set_retry_after_ms(refusal.retry_after_ms);
  for (const std::string& id : refusal.preempt) hint.add_preempt_sequence_ids(id);
  return hint;
}

absl::Status WithAdmissionHint(absl::Status status, const AdmissionRefusal& refusal) {
  if (status.ok()) return status;
  status.SetPayload(kAdmissionHintType, absl::Cord(ToProto(refusal).SerializeAsString()));
  return status;
}

std::optional<v1::AdmissionHint> AdmissionHintOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kAdmissionHintType);
  if (!payload.has_value()) return std::nullopt;
  v1::AdmissionHint hint;
  if (!hint.ParseFromString(std::string(*payload))) return std::nullopt;
  return hint;
}

void FillEvicted(const std::vector<AppendResult::Evicted>& evicted,
                 google::protobuf::RepeatedPtrField<v1::GroupEviction>* out) {
  for (const AppendResult::Evicted& group : evicted) {
    v1::GroupEviction* wire = out->Add();
    wire->set_layer(group.layer);
    wire->set_group(group.group);
    wire->mutable_pages()->Assign(group.pages.begin(), group.pages.end());
  }
}

void FillPressureStats(const PressureStats& stats, v1::PoolStats* out) {
  out->set_target_occupancy(stats.target_occupancy);
  out->set_frames_reclaimed_admission_total(stats.frames_reclaimed_admission);
  out->set_frames_reclaimed_target_total(stats.frames_reclaimed_target);
  out->set_admissions_delayed_total(stats.admissions_delayed);
  out->set_admissions_refused_total(stats.admissions_refused);
  out->set_preemptions_total(stats.preemptions);
  out->set_sequences_swapped(stats.sequences_swapped);
  out->set_swapped_bytes(stats.swapped_bytes);
  for (const TenantUsageStats& tenant : stats.tenants) {
    v1::TenantUsage* usage = out->add_tenants();
    usage->set_tenant(tenant.tenant);
    usage->set_used_frames(tenant.used_frames);
    usage->set_share(tenant.share);
    usage->set_guaranteed_frames(tenant.guaranteed_frames);
  }
}

}  // namespace entrokv::wire
