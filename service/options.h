// The daemon's configuration: one struct with documented defaults, validated once.
#ifndef ENTROKV_SERVICE_OPTIONS_H_
#define ENTROKV_SERVICE_OPTIONS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/pool/cache_state.h"
#include "core/pool/geometry.h"
#include "core/scoring/policy.h"
#include "service/option_table.h"
#include "wire/resolve.h"

namespace entrokv::service {

// Field by field what option_table.h declares: `type name = default;` for every option.
struct ServerOptions {
#define ENTROKV_OPTION_FIELD(type, name, default_value, help) type name = default_value;
  ENTROKV_SERVER_OPTIONS(ENTROKV_OPTION_FIELD)
#undef ENTROKV_OPTION_FIELD
};

// INVALID_ARGUMENT naming the option ("--tau: ..."): addresses without a port, non-positive
// sizes and bounds, an unknown policy, bad policy parameters, a TLS key without a certificate
// (or the reverse), a CA without a certificate, unreadable files, an empty token file, a
// state_dir that is not a directory, a negative state_sync_ms, an unknown log_level.
[[nodiscard]] absl::Status ValidateServerOptions(const ServerOptions& options);

// The daemon's default scoring parameters, as the core takes them.
[[nodiscard]] PolicyOptions DefaultPolicyOptions(const ServerOptions& options);

// The bookkeeping bounds of every model (--max_sequences_per_model and the
// --max_*_bookkeeping_bytes flags).
[[nodiscard]] CacheLimits ToCacheLimits(const ServerOptions& options);

// Every pool's pressure settings (--target_occupancy, --tenant_share, --admission_hold_ms,
// --max_swap_bytes); where swapped bytes go is the registry's to add.
[[nodiscard]] PressureOptions ToPressureOptions(const ServerOptions& options);

// What a request falls back on where it leaves a field unset (--policy and its parameters,
// --selection_scope, --frame_layout, --backend, --pool_capacity_bytes, the bookkeeping bounds):
// the one place the daemon's options become the wire library's defaults.
[[nodiscard]] wire::Defaults WireDefaults(const ServerOptions& options);

// The bearer token in `path`, surrounding whitespace trimmed. INVALID_ARGUMENT naming
// --token_file when it cannot be read or holds no token.
[[nodiscard]] absl::StatusOr<std::string> LoadBearerToken(const std::string& path);

// The whole file at `path`; INVALID_ARGUMENT naming `option` when it cannot be read.
[[nodiscard]] absl::StatusOr<std::string> ReadOptionFile(absl::string_view option,
                                                         const std::string& path);

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_OPTIONS_H_
