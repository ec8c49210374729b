// The daemon's configuration: one struct with documented defaults, validated once.
#ifndef ENTROKV_SERVICE_OPTIONS_H_
#define ENTROKV_SERVICE_OPTIONS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/pool/geometry.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/policy.h"

namespace entrokv::service {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";          // gRPC address; port 0 picks a free port
  std::string metrics_listen = "127.0.0.1:9464";   // Prometheus /metrics; port 0 allowed;
                                                   // empty: no metrics endpoint
  int64_t pool_capacity_bytes = int64_t{1} << 30;  // total arena bytes over every model; also
                                                   // a RegisterModel's default capacity
  Backend backend = Backend::kHost;                // default arena backend
  FrameLayout frame_layout = FrameLayout::kGroup;  // default frame layout
  std::string policy = "page_entrokv";             // default policy
  std::optional<SelectionScope> selection_scope;   // default scope; unset (auto): layer for a
                                                   // LAYER-layout pool, group otherwise
  double tau = 0.5;                                // default softmax temperature
  double alpha = 2.0;                              // default Renyi order
  int sink_tokens = 4;                             // default sink tokens
  bool protect_tail_page = true;                   // default tail-page protection
  int64_t max_message_bytes = 64 << 20;            // max receive (and send) message size
  int max_inflight_decisions = 64;                 // queued + running decision jobs
  int max_models = 256;                            // registered models (each holds an arena fd)
  int64_t max_pool_frames = int64_t{1} << 24;      // frames of one pool (~12 B bookkeeping each)
  int64_t max_sequences_per_model = 65536;         // open sequences of one model
  int worker_threads = 0;                          // scoring threads; 0: hardware threads
  int64_t keepalive_ms = 30000;                    // server keepalive ping interval
  int64_t max_connection_age_ms = 0;               // 0: unlimited; else GOAWAY after this age
  int64_t drain_timeout_ms = 10000;                // grace for in-flight calls at shutdown
  bool reflection = false;                         // gRPC server reflection
  std::string tls_cert;                            // PEM server certificate (with tls_key)
  std::string tls_key;                             // PEM server key
  std::string tls_ca;                              // PEM CA: clients must present a cert it signed
  std::string token_file;                          // file holding the bearer token; empty: none
  std::vector<uid_t> allowed_shm_uids;             // segment owners readable besides our uid
  std::string state_dir;                           // reserved for the crash-recovery journal
};

// INVALID_ARGUMENT naming the option ("--tau: ..."): addresses without a port, non-positive
// sizes and bounds, an unknown policy, bad policy parameters, a TLS key without a certificate
// (or the reverse), a CA without a certificate, unreadable files, an empty token file, a
// state_dir that is not a directory.
[[nodiscard]] absl::Status ValidateServerOptions(const ServerOptions& options);

// The daemon's default scoring parameters, as the core takes them.
[[nodiscard]] PolicyOptions DefaultPolicyOptions(const ServerOptions& options);

// The bearer token in `path`, surrounding whitespace trimmed. INVALID_ARGUMENT naming
// --token_file when it cannot be read or holds no token.
[[nodiscard]] absl::StatusOr<std::string> LoadBearerToken(const std::string& path);

// The whole file at `path`; INVALID_ARGUMENT naming `option` when it cannot be read.
[[nodiscard]] absl::StatusOr<std::string> ReadOptionFile(absl::string_view option,
                                                         const std::string& path);

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_OPTIONS_H_
