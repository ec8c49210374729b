// Every entrokvd option, declared once: type, name, default and help. The table yields the
// ServerOptions field (options.h), the --flag and its --help text (flags.cc), and the copy from
// the flag into ServerOptions; nothing else lists the options.
#ifndef ENTROKV_SERVICE_OPTION_TABLE_H_
#define ENTROKV_SERVICE_OPTION_TABLE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/pool/geometry.h"
#include "core/pool/pressure.h"

namespace entrokv::service {

// --selection_scope: the scope of requests that leave it unspecified. kAuto follows the pool's
// frame layout (layer scope for a LAYER-layout pool, group scope otherwise).
enum class ScopeSetting : uint8_t { kAuto, kGroup, kLayer };

// Abseil flag parsing ("auto" | "group" | "layer"), found by argument-dependent lookup.
bool AbslParseFlag(absl::string_view text, ScopeSetting* setting, std::string* error);
std::string AbslUnparseFlag(ScopeSetting setting);

// --scorer: which scorer decides (service/device_scorers.h). kAuto: the CUDA scorer for pools on
// a GPU where this build and host have one, the CPU otherwise.
enum class ScorerSetting : uint8_t { kAuto, kCpu, kCuda };
bool AbslParseFlag(absl::string_view text, ScorerSetting* setting, std::string* error);
std::string AbslUnparseFlag(ScorerSetting setting);

// --allowed_shm_uids: user ids, given as "1000,1001".
struct UidList : std::vector<uid_t> {
  using std::vector<uid_t>::vector;
};
bool AbslParseFlag(absl::string_view text, UidList* uids, std::string* error);
std::string AbslUnparseFlag(const UidList& uids);

// --tenant_share: tenants and their guaranteed shares, given as "gold=0.5,silver=0.2".
struct TenantShares : std::vector<::entrokv::TenantShare> {
  using std::vector<::entrokv::TenantShare>::vector;
};
bool AbslParseFlag(absl::string_view text, TenantShares* shares, std::string* error);
std::string AbslUnparseFlag(const TenantShares& shares);

}  // namespace entrokv::service

// X(type, name, default, help). Types are spelled fully qualified: the flags are declared at
// global scope.
#define ENTROKV_SERVER_OPTIONS(X)                                                                  \
  X(std::string, listen, "127.0.0.1:50051", "gRPC listen address host:port (port 0: any)")         \
  X(std::string, metrics_listen, "127.0.0.1:9464",                                                 \
    "Prometheus /metrics address host:port (port 0: any; empty: no metrics endpoint)")             \
  X(int64_t, pool_capacity_bytes, int64_t{1} << 30,                                                \
    "Arena bytes over all models; the default capacity of a RegisterModel")                        \
  X(::entrokv::Backend, backend, ::entrokv::Backend::kHost, "Default arena backend: host or cuda") \
  X(int32_t, host_devices, 1,                                                                      \
    "Devices host arenas stand in for (RegisterModel devices below it), in [1, 64]; the cuda "     \
    "backend uses the host's CUDA devices")                                                        \
  X(int64_t, rank_wait_ms, 2000,                                                                   \
    "How long a tensor-parallel model's decision waits for its last rank's request after the "     \
    "first, in ms; then every waiting rank gets DEADLINE_EXCEEDED")                                \
  X(::entrokv::FrameLayout, frame_layout, ::entrokv::FrameLayout::kGroup,                          \
    "Default frame layout: group or layer")                                                        \
  X(std::string, policy, "page_entrokv", "Default eviction policy")                                \
  X(::entrokv::service::ScopeSetting, selection_scope, ::entrokv::service::ScopeSetting::kAuto,    \
    "Default selection scope: auto (layer for a pool in the layer frame layout, group "            \
    "otherwise), group (one page set per layer and KV group) or layer (one per layer)")            \
  X(::entrokv::service::ScorerSetting, scorer, ::entrokv::service::ScorerSetting::kAuto,           \
    "Which scorer decides: auto (the CUDA scorer for pools on a GPU, where this build and host "   \
    "have one; the CPU otherwise), cpu, or cuda (every pool on a GPU; no start without one). "     \
    "Both give the same decisions")                                                                \
  X(double, tau, 0.5, "Default softmax temperature of the head weights (> 0)")                     \
  X(double, alpha, 2.0, "Default Renyi entropy order (> 0, inf allowed)")                          \
  X(int32_t, sink_tokens, 4, "Default sink tokens left out of the entropy")                        \
  X(int32_t, neighbourhood_kernel, 1,                                                              \
    "Default neighbourhood pooling width in tokens (odd, in [1, 63]; 1: off) of each head's row "  \
    "before its group's pooling (page_entrokv, raw_entropy, mean, max, h2o)")                      \
  X(std::string, neighbourhood_pooling, "max", "Default neighbourhood pooling: max or mean")       \
  X(bool, protect_tail_page, true, "Always keep the page being written")                           \
  X(int64_t, max_message_bytes, 64 << 20, "Max gRPC message size in bytes (receive and send)")     \
  X(int32_t, max_inflight_decisions, 64,                                                           \
    "Decision jobs queued or running; more are shed with RESOURCE_EXHAUSTED")                      \
  X(int32_t, max_models, 256,                                                                      \
    "Registered models at most; more RegisterModel calls get RESOURCE_EXHAUSTED")                  \
  X(int64_t, max_pool_frames, int64_t{1} << 24,                                                    \
    "Frames one model's pool may hold; RegisterModel beyond gets RESOURCE_EXHAUSTED")              \
  X(int64_t, max_sequences_per_model, 65536,                                                       \
    "Open sequences per model; OpenSequence beyond gets RESOURCE_EXHAUSTED")                       \
  X(int64_t, max_sequence_bookkeeping_bytes, int64_t{256} << 20,                                   \
    "Bookkeeping bytes one sequence may hold (block tables, head weights); RegisterModel of a "    \
    "geometry whose empty sequence is larger, and OpenSequence/AppendTokens beyond, get "          \
    "RESOURCE_EXHAUSTED")                                                                          \
  X(int64_t, max_model_bookkeeping_bytes, int64_t{2} << 30,                                        \
    "Bookkeeping bytes one model may hold (its pool's and every open sequence's); calls "          \
    "beyond get RESOURCE_EXHAUSTED")                                                               \
  X(int64_t, max_bookkeeping_bytes, int64_t{512} << 20,                                            \
    "Bookkeeping bytes every model together may hold (pools and sequences); RegisterModel, "       \
    "OpenSequence and AppendTokens beyond get RESOURCE_EXHAUSTED before allocating")               \
  X(int32_t, worker_threads, 0, "Scoring threads (0: one per hardware thread)")                    \
  X(int64_t, keepalive_ms, 30000, "Server keepalive ping interval in ms")                          \
  X(int64_t, max_connection_age_ms, 0, "Close connections older than this (0: never)")             \
  X(int64_t, drain_timeout_ms, 10000, "Grace for in-flight calls on SIGTERM/SIGINT")               \
  X(bool, reflection, false, "Serve gRPC server reflection")                                       \
  X(std::string, tls_cert, "", "PEM server certificate (TLS on when set, with --tls_key)")         \
  X(std::string, tls_key, "", "PEM server private key")                                            \
  X(std::string, tls_ca, "", "PEM CA bundle: require client certificates it signed")               \
  X(::entrokv::service::UidList, allowed_shm_uids, ::entrokv::service::UidList(),                  \
    "Comma-separated uids whose shared-memory segments may be read as statistics, besides "        \
    "the daemon's own")                                                                            \
  X(std::string, token_file, "", "File holding the bearer token clients must send")                \
  X(std::string, state_dir, "",                                                                    \
    "Directory of the crash-recovery journal (LevelDB); empty: nothing survives a restart")        \
  X(int64_t, state_sync_ms, 100,                                                                   \
    "Sync the journal to disk at most this many ms after a change (0: on every change)")           \
  X(bool, state_accept_loss, false,                                                                \
    "Start from a --state_dir journal that lost synced writes (refused otherwise), logging what "  \
    "was lost")                                                                                    \
  X(std::string, log_level, "info", "Least severe log line written: info, warning or error")       \
  X(double, target_occupancy, 0.9,                                                                 \
    "Pool occupancy (used / capacity frames) kept by reclaiming from sequences with "              \
    "server-chosen budgets, in (0, 1]")                                                            \
  X(::entrokv::service::TenantShares, tenant_share, ::entrokv::service::TenantShares(),            \
    "Tenants and their guaranteed shares of every pool, reclaimed last: name=share,... (at most "  \
    "16 tenants, shares summing to at most 1; \"\" is the default tenant)")                        \
  X(int64_t, admission_hold_ms, 5000,                                                              \
    "How long a refused admission keeps its place (its age, the frames held for it) without a "    \
    "retry, in ms")                                                                                \
  X(int64_t, max_swap_bytes, int64_t{1} << 30,                                                     \
    "Host bytes swapped-out sequences may hold together (SwapOutSequence); 0: swapping off")

#endif  // ENTROKV_SERVICE_OPTION_TABLE_H_
