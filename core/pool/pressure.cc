#include "core/pool/pressure.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace entrokv {
namespace {

// Tenant names become metric label values: short and plain.
constexpr size_t kMaxTenantName = 64;

bool PlainName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxTenantName) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidatePressureOptions(const PressureOptions& options) {
  if (!(options.target_occupancy > 0.0 && options.target_occupancy <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_occupancy: must be in (0, 1], got ", options.target_occupancy));
  }
  if (options.tenants.size() > static_cast<size_t>(kMaxTenants)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant_share: ", options.tenants.size(), " tenants, at most ", kMaxTenants));
  }
  absl::flat_hash_set<std::string> seen;
  double total = 0.0;
  for (const TenantShare& tenant : options.tenants) {
    if (!PlainName(tenant.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tenant_share: tenant '", tenant.name.substr(0, kMaxTenantName),
                       "' must be 1..64 characters of [A-Za-z0-9_.-]"));
    }
    if (tenant.name == kDefaultTenantLabel) {
      return absl::InvalidArgumentError(
          absl::StrCat("tenant_share: '", kDefaultTenantLabel,
                       "' names the default tenant \"\" in the metrics; choose another name"));
    }
    if (!seen.insert(tenant.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tenant_share: tenant '", tenant.name, "' is named twice"));
    }
    if (!(tenant.share >= 0.0 && tenant.share <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tenant_share: tenant '", tenant.name, "' has share ", tenant.share, ", not in [0, 1]"));
    }
    total += tenant.share;
  }
  if (total > 1.0 + 1e-9) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant_share: the shares sum to ", total, ", more than 1"));
  }
  return absl::OkStatus();
}

absl::Status ValidateFloor(absl::string_view field, double floor_fraction) {
  if (!(floor_fraction > 0.0 && floor_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be in (0, 1], got ", floor_fraction));
  }
  return absl::OkStatus();
}

absl::Status ValidateSequenceTerms(const SequenceTerms& terms,
                                   std::span<const TenantShare> tenants) {
  if (!terms.tenant.empty() &&
      std::none_of(tenants.begin(), tenants.end(),
                   [&terms](const TenantShare& t) { return t.name == terms.tenant; })) {
    std::vector<std::string> names;
    for (const TenantShare& t : tenants) names.push_back(t.name);
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant: '", terms.tenant.substr(0, kMaxTenantName),
        "' is not a tenant of this daemon (--tenant_share: ",
        names.empty() ? "none" : absl::StrJoin(names, ", "), "; \"\" is the default tenant)"));
  }
  if (terms.priority < kMinPriority || terms.priority > kMaxPriority) {
    return absl::InvalidArgumentError(absl::StrCat("priority: must be in [", kMinPriority, ", ",
                                                   kMaxPriority, "], got ", terms.priority));
  }
  if (terms.auto_floor.has_value()) {
    return ValidateFloor("auto_budget.floor_fraction", *terms.auto_floor);
  }
  return absl::OkStatus();
}

int64_t FloorFrames(double floor_fraction, int64_t uncompressed_frames) {
  return static_cast<int64_t>(std::ceil(floor_fraction * static_cast<double>(uncompressed_frames)));
}

std::vector<std::string> ChooseVictims(std::span<const VictimCandidate> candidates,
                                       int32_t priority, int64_t order, int64_t missing) {
  std::vector<const VictimCandidate*> eligible;
  for (const VictimCandidate& candidate : candidates) {
    if (candidate.priority < priority ||
        (candidate.priority == priority && candidate.admitted > order)) {
      eligible.push_back(&candidate);
    }
  }
  std::sort(eligible.begin(), eligible.end(), [](const auto* a, const auto* b) {
    if (a->priority != b->priority) return a->priority < b->priority;
    return a->admitted > b->admitted;  // the youngest first
  });
  std::vector<std::string> victims;
  int64_t covered = 0;
  for (const VictimCandidate* candidate : eligible) {
    if (covered >= missing) break;
    victims.push_back(candidate->id);
    covered += candidate->frees;
  }
  return victims;
}

}  // namespace entrokv
