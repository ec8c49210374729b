#include "service/options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/util/log.h"
#include "core/util/status_macros.h"
#include "service/tls_check.h"

namespace entrokv::service {
namespace {

absl::Status Invalid(absl::string_view option, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", option, ": ", why));
}

// host:port with a numeric port in [0, 65535]; IPv6 hosts in brackets.
absl::Status ValidateAddress(absl::string_view option, const std::string& address) {
  const size_t colon = address.rfind(':');
  if (address.empty() || colon == std::string::npos || colon == 0) {
    return Invalid(option, absl::StrCat("'", address, "' is not host:port"));
  }
  int port = -1;
  if (!absl::SimpleAtoi(absl::string_view(address).substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return Invalid(option, absl::StrCat("'", address, "' has no port in [0, 65535]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateReadableFile(absl::string_view option, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  struct stat info;
  if (::stat(path.c_str(), &info) != 0 || ::access(path.c_str(), R_OK) != 0) {
    return Invalid(option, absl::StrCat("cannot read '", path, "'"));
  }
  if (!S_ISREG(info.st_mode)) {  // a directory would abort the reader; a FIFO would block it
    return Invalid(option, absl::StrCat("'", path, "' is not a regular file"));
  }
  return absl::OkStatus();
}

// Millisecond options that gRPC takes as int and that deadlines add to the clock.
constexpr int64_t kMaxMillis = (int64_t{1} << 31) - 1;

absl::Status ValidateMillis(absl::string_view option, int64_t value, int64_t low, int64_t high) {
  if (value < low || value > high) {
    return Invalid(option, absl::StrCat("must be in [", low, ", ", high, "], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadOptionFile(absl::string_view option, const std::string& path) {
  RETURN_IF_ERROR(ValidateReadableFile(option, path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Invalid(option, absl::StrCat("cannot read '", path, "'"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Invalid(option, absl::StrCat("cannot read '", path, "'"));
  return text;
}

absl::StatusOr<std::string> LoadBearerToken(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadOptionFile("token_file", path));
  const absl::string_view token = absl::StripAsciiWhitespace(text);
  if (token.empty()) return Invalid("token_file", absl::StrCat("'", path, "' holds no token"));
  return std::string(token);
}

PolicyOptions DefaultPolicyOptions(const ServerOptions& options) {
  PolicyOptions policy;
  policy.tau = options.tau;
  policy.alpha = options.alpha;
  policy.sink_tokens = options.sink_tokens;
  policy.neighbourhood_kernel = options.neighbourhood_kernel;
  // Validated at start (ValidateServerOptions).
  policy.neighbourhood =
      ParseNeighbourhoodKind("--neighbourhood_pooling", options.neighbourhood_pooling)
          .value_or(NeighbourhoodKind::kMax);
  policy.protections.tail_page = options.protect_tail_page;
  return policy;
}

CacheLimits ToCacheLimits(const ServerOptions& options) {
  return CacheLimits{.max_sequences_per_model = options.max_sequences_per_model,
                     .max_sequence_bookkeeping_bytes = options.max_sequence_bookkeeping_bytes,
                     .max_model_bookkeeping_bytes = options.max_model_bookkeeping_bytes};
}

PressureOptions ToPressureOptions(const ServerOptions& options) {
  PressureOptions pressure;
  pressure.target_occupancy = options.target_occupancy;
  pressure.tenants = options.tenant_share;
  pressure.admission_hold = absl::Milliseconds(options.admission_hold_ms);
  pressure.max_swap_bytes = options.max_swap_bytes;
  return pressure;
}

wire::Defaults WireDefaults(const ServerOptions& options) {
  wire::Defaults defaults;
  defaults.policy = options.policy;
  defaults.policy_options = DefaultPolicyOptions(options);
  switch (options.selection_scope) {
    case ScopeSetting::kGroup:
      defaults.selection_scope = SelectionScope::kGroup;
      break;
    case ScopeSetting::kLayer:
      defaults.selection_scope = SelectionScope::kLayer;
      break;
    case ScopeSetting::kAuto:
      break;  // nullopt: the pool's layout decides
  }
  defaults.frame_layout = options.frame_layout;
  defaults.backend = options.backend;
  defaults.pool_capacity_bytes = options.pool_capacity_bytes;
  defaults.host_devices = options.host_devices;
  defaults.limits = ToCacheLimits(options);
  return defaults;
}

absl::Status ValidateServerOptions(const ServerOptions& options) {
  RETURN_IF_ERROR(ValidateAddress("listen", options.listen));
  if (!options.metrics_listen.empty()) {  // empty: no metrics endpoint
    RETURN_IF_ERROR(ValidateAddress("metrics_listen", options.metrics_listen));
  }
  if (options.pool_capacity_bytes <= 0) {
    return Invalid("pool_capacity_bytes",
                   absl::StrCat("must be > 0, got ", options.pool_capacity_bytes));
  }
  if (options.host_devices < 1 || options.host_devices > 64) {
    return Invalid("host_devices", absl::StrCat("must be in [1, 64], got ", options.host_devices));
  }
  if (options.rank_wait_ms < 1 || options.rank_wait_ms > 600000) {
    return Invalid("rank_wait_ms",
                   absl::StrCat("must be in [1, 600000], got ", options.rank_wait_ms));
  }
  if (!FindPolicy(options.policy).ok()) {
    return Invalid("policy", FindPolicy(options.policy).status().message());
  }
  if (!(options.tau > 0) || !std::isfinite(options.tau)) {
    return Invalid("tau", absl::StrCat("must be finite and > 0, got ", options.tau));
  }
  if (!(options.alpha > 0)) {
    return Invalid("alpha", absl::StrCat("must be > 0 (inf allowed), got ", options.alpha));
  }
  if (options.sink_tokens < 0) {
    return Invalid("sink_tokens", absl::StrCat("must be >= 0, got ", options.sink_tokens));
  }
  RETURN_IF_ERROR(
      ValidateNeighbourhoodKernel("--neighbourhood_kernel", options.neighbourhood_kernel));
  RETURN_IF_ERROR(
      ParseNeighbourhoodKind("--neighbourhood_pooling", options.neighbourhood_pooling).status());
  if (const absl::Status policy = ValidatePolicyOptions(DefaultPolicyOptions(options));
      !policy.ok()) {
    return Invalid("policy", policy.message());
  }
  if (options.max_message_bytes < 1024 || options.max_message_bytes > (int64_t{2} << 30) - 1) {
    return Invalid("max_message_bytes",
                   absl::StrCat("must be in [1024, 2^31), got ", options.max_message_bytes));
  }
  if (options.max_inflight_decisions < 1) {
    return Invalid("max_inflight_decisions",
                   absl::StrCat("must be >= 1, got ", options.max_inflight_decisions));
  }
  if (options.max_models < 1 || options.max_models > 65536) {
    return Invalid("max_models", absl::StrCat("must be in [1, 65536], got ", options.max_models));
  }
  if (options.max_pool_frames < 1) {
    return Invalid("max_pool_frames", absl::StrCat("must be >= 1, got ", options.max_pool_frames));
  }
  if (options.max_sequences_per_model < 1) {
    return Invalid("max_sequences_per_model",
                   absl::StrCat("must be >= 1, got ", options.max_sequences_per_model));
  }
  for (const auto& [name, value] :
       {std::pair<absl::string_view, int64_t>{"max_sequence_bookkeeping_bytes",
                                              options.max_sequence_bookkeeping_bytes},
        {"max_model_bookkeeping_bytes", options.max_model_bookkeeping_bytes},
        {"max_bookkeeping_bytes", options.max_bookkeeping_bytes}}) {
    if (value < 1) return Invalid(name, absl::StrCat("must be >= 1, got ", value));
  }
  if (options.worker_threads < 0 || options.worker_threads > 1024) {
    return Invalid("worker_threads",
                   absl::StrCat("must be in [0, 1024], got ", options.worker_threads));
  }
  RETURN_IF_ERROR(ValidateMillis("keepalive_ms", options.keepalive_ms, 1000, kMaxMillis));
  RETURN_IF_ERROR(
      ValidateMillis("max_connection_age_ms", options.max_connection_age_ms, 0, kMaxMillis));
  // An hour of grace is already far more than any orchestrator waits before SIGKILL.
  RETURN_IF_ERROR(ValidateMillis("drain_timeout_ms", options.drain_timeout_ms, 0, 3600 * 1000));
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return Invalid(options.tls_cert.empty() ? "tls_cert" : "tls_key",
                   "--tls_cert and --tls_key must be given together");
  }
  if (!options.tls_ca.empty() && options.tls_cert.empty()) {
    return Invalid("tls_ca", "mutual TLS needs --tls_cert and --tls_key too");
  }
  RETURN_IF_ERROR(ValidateReadableFile("tls_cert", options.tls_cert));
  RETURN_IF_ERROR(ValidateReadableFile("tls_key", options.tls_key));
  RETURN_IF_ERROR(ValidateReadableFile("tls_ca", options.tls_ca));
  RETURN_IF_ERROR(ValidateReadableFile("token_file", options.token_file));
  RETURN_IF_ERROR(ParseLogLevel(options.log_level).status());
  if (!options.token_file.empty()) RETURN_IF_ERROR(LoadBearerToken(options.token_file).status());
  if (!options.tls_cert.empty()) {
    ASSIGN_OR_RETURN(const std::string cert, ReadOptionFile("tls_cert", options.tls_cert));
    ASSIGN_OR_RETURN(const std::string key, ReadOptionFile("tls_key", options.tls_key));
    std::string ca;
    if (!options.tls_ca.empty()) {
      ASSIGN_OR_RETURN(ca, ReadOptionFile("tls_ca", options.tls_ca));
    }
    RETURN_IF_ERROR(CheckTlsMaterial(cert, key, ca));
  }
  if (!options.state_dir.empty()) {
    struct stat info;
    if (::stat(options.state_dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      return Invalid("state_dir", absl::StrCat("'", options.state_dir, "' is not a directory"));
    }
  }
  if (const absl::Status pressure = ValidatePressureOptions(ToPressureOptions(options));
      !pressure.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", pressure.message()));
  }
  RETURN_IF_ERROR(ValidateMillis("admission_hold_ms", options.admission_hold_ms, 0, 3600 * 1000));
  if (options.max_swap_bytes < 0) {
    return Invalid("max_swap_bytes", absl::StrCat("must be >= 0, got ", options.max_swap_bytes));
  }
  if (options.state_sync_ms < 0 || options.state_sync_ms > 3600 * 1000) {
    return Invalid("state_sync_ms",
                   absl::StrCat("must be in [0, 3600000], got ", options.state_sync_ms));
  }
  return absl::OkStatus();
}

}  // namespace entrokv::service
