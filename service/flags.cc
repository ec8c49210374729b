#include "service/flags.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/util/status_macros.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address host:port (port 0: any)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address host:port (port 0: any)");
ABSL_FLAG(int64_t, pool_capacity_bytes, int64_t{1} << 30,
          "Arena bytes over all models; the default capacity of a RegisterModel");
ABSL_FLAG(std::string, backend, "host", "Default arena backend: host or cuda");
ABSL_FLAG(std::string, frame_layout, "group", "Default frame layout: group or layer");
ABSL_FLAG(std::string, policy, "page_entrokv", "Default eviction policy");
ABSL_FLAG(std::string, selection_scope, "auto",
          "Default selection scope: auto (layer for a pool in the layer frame layout, group "
          "otherwise), group (one page set per layer and KV group) or layer (one per layer)");
ABSL_FLAG(double, tau, 0.5, "Default softmax temperature of the head weights (> 0)");
ABSL_FLAG(double, alpha, 2.0, "Default Renyi entropy order (> 0, inf allowed)");
ABSL_FLAG(int32_t, sink_tokens, 4, "Default sink tokens left out of the entropy");
ABSL_FLAG(bool, protect_tail_page, true, "Always keep the page being written");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20, "Max gRPC message size in bytes");
ABSL_FLAG(int32_t, max_inflight_decisions, 64,
          "Decision jobs queued or running; more are shed with RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_models, 256,
          "Registered models at most; more RegisterModel calls get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_pool_frames, int64_t{1} << 24,
          "Frames one model's pool may hold; RegisterModel beyond gets RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_sequences_per_model, 65536,
          "Open sequences per model; OpenSequence beyond gets RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, worker_threads, 0, "Scoring threads (0: one per hardware thread)");
ABSL_FLAG(int64_t, keepalive_ms, 30000, "Server keepalive ping interval in ms");
ABSL_FLAG(int64_t, max_connection_age_ms, 0, "Close connections older than this (0: never)");
ABSL_FLAG(int64_t, drain_timeout_ms, 10000, "Grace for in-flight calls on SIGTERM/SIGINT");
ABSL_FLAG(bool, reflection, false, "Serve gRPC server reflection");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (TLS on when set)");
ABSL_FLAG(std::string, tls_key, "", "PEM server private key");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle: require client certificates it signed");
ABSL_FLAG(std::string, allowed_shm_uids, "",
          "Comma-separated uids whose shared-memory segments may be read as statistics, besides "
          "the daemon's own");
ABSL_FLAG(std::string, token_file, "", "File holding the bearer token clients must send");
ABSL_FLAG(std::string, state_dir, "",
          "Directory for the crash-recovery journal (reserved: not yet written)");
ABSL_FLAG(std::string, config, "", "Config file of `name = value` lines; flags win");

namespace entrokv::service {
namespace {

// The flags a config file may set: every daemon flag but --config itself.
const absl::flat_hash_set<std::string>& ConfigurableNames() {
  static const auto* names = new absl::flat_hash_set<std::string>{"listen",
                                                                  "metrics_listen",
                                                                  "pool_capacity_bytes",
                                                                  "backend",
                                                                  "frame_layout",
                                                                  "policy",
                                                                  "selection_scope",
                                                                  "tau",
                                                                  "alpha",
                                                                  "sink_tokens",
                                                                  "protect_tail_page",
                                                                  "max_message_bytes",
                                                                  "max_inflight_decisions",
                                                                  "max_models",
                                                                  "max_pool_frames",
                                                                  "max_sequences_per_model",
                                                                  "worker_threads",
                                                                  "keepalive_ms",
                                                                  "max_connection_age_ms",
                                                                  "drain_timeout_ms",
                                                                  "reflection",
                                                                  "tls_cert",
                                                                  "tls_key",
                                                                  "tls_ca",
                                                                  "token_file",
                                                                  "allowed_shm_uids",
                                                                  "state_dir"};
  return *names;
}

// Names of the flags on the command line: "--name", "--name=v", "-name", "--noname".
absl::flat_hash_set<std::string> CommandLineNames(const std::vector<std::string>& argv) {
  absl::flat_hash_set<std::string> names;
  for (size_t i = 1; i < argv.size(); ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "-")) continue;
    absl::ConsumePrefix(&arg, "-");
    const std::string name(arg.substr(0, arg.find('=')));
    names.insert(name);
    if (absl::StartsWith(name, "no")) names.insert(name.substr(2));
  }
  return names;
}

}  // namespace

std::string ConfigFlag() { return absl::GetFlag(FLAGS_config); }

absl::Status ApplyConfigFile(const std::string& path, const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(const std::string text, ReadOptionFile("config", path));
  const absl::flat_hash_set<std::string> given = CommandLineNames(argv);
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const size_t equals = line.find('=');
    const std::string where = absl::StrCat("--config: ", path, ":", line_number, ": ");
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where, "expected `name = value`"));
    }
    const std::string name(absl::StripAsciiWhitespace(line.substr(0, equals)));
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(equals + 1));
    if (!ConfigurableNames().contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "unknown option '", name, "'"));
    }
    if (given.contains(name)) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "bad value for '", name, "': ", error));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ServerOptions> OptionsFromFlags() {
  ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.pool_capacity_bytes = absl::GetFlag(FLAGS_pool_capacity_bytes);
  auto backend = ParseBackend(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--backend: ", backend.status().message()));
  }
  options.backend = *backend;
  auto layout = ParseFrameLayout(absl::GetFlag(FLAGS_frame_layout));
  if (!layout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--frame_layout: ", layout.status().message()));
  }
  options.frame_layout = *layout;
  options.policy = absl::GetFlag(FLAGS_policy);
  const std::string scope = absl::GetFlag(FLAGS_selection_scope);
  if (scope != "auto") {
    ASSIGN_OR_RETURN(options.selection_scope, ParseSelectionScope("--selection_scope", scope));
  }
  options.tau = absl::GetFlag(FLAGS_tau);
  options.alpha = absl::GetFlag(FLAGS_alpha);
  options.sink_tokens = absl::GetFlag(FLAGS_sink_tokens);
  options.protect_tail_page = absl::GetFlag(FLAGS_protect_tail_page);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_inflight_decisions = absl::GetFlag(FLAGS_max_inflight_decisions);
  options.max_models = absl::GetFlag(FLAGS_max_models);
  options.max_pool_frames = absl::GetFlag(FLAGS_max_pool_frames);
  options.max_sequences_per_model = absl::GetFlag(FLAGS_max_sequences_per_model);
  options.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  options.keepalive_ms = absl::GetFlag(FLAGS_keepalive_ms);
  options.max_connection_age_ms = absl::GetFlag(FLAGS_max_connection_age_ms);
  options.drain_timeout_ms = absl::GetFlag(FLAGS_drain_timeout_ms);
  options.reflection = absl::GetFlag(FLAGS_reflection);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.token_file = absl::GetFlag(FLAGS_token_file);
  for (const absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_allowed_shm_uids), ',', absl::SkipWhitespace())) {
    uint32_t uid = 0;
    if (!absl::SimpleAtoi(item, &uid)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--allowed_shm_uids: '", item, "' is not a uid"));
    }
    options.allowed_shm_uids.push_back(static_cast<uid_t>(uid));
  }
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  return options;
}

}  // namespace entrokv::service
