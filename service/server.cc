#include "service/server.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/pool/arena.h"
#include "core/util/log.h"
#include "core/util/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "prometheus/exposer.h"
#include "service/arena_names.h"
#include "service/call_guard.h"
#include "store/recovery.h"

namespace entrokv::service {
namespace {

// Reflection per server: linking grpc++_reflection registers its plugin for every server the
// process builds (a static initializer), so this option removes it unless asked for, and adds
// it when asked for and missing.
class ReflectionOption final : public grpc::ServerBuilderOption {
 public:
  explicit ReflectionOption(bool enabled) : enabled_(enabled) {}
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    const std::string name = grpc::reflection::ProtoServerReflectionPlugin().name();
    const auto is_reflection = [&name](const auto& plugin) { return plugin->name() == name; };
    const bool present = std::any_of(plugins->begin(), plugins->end(), is_reflection);
    if (!enabled_) {
      plugins->erase(std::remove_if(plugins->begin(), plugins->end(), is_reflection),
                     plugins->end());
    } else if (!present) {
      plugins->push_back(std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>());
    }
  }

 private:
  bool enabled_;
};

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      options.tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                             : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.private_key, ReadOptionFile("tls_key", options.tls_key));
  ASSIGN_OR_RETURN(pair.cert_chain, ReadOptionFile("tls_cert", options.tls_cert));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_ca.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadOptionFile("tls_ca", options.tls_ca));
  }
  return grpc::SslServerCredentials(ssl);
}

std::string Host(const std::string& address) { return address.substr(0, address.rfind(':')); }

// Host arenas reserve their memory when they are made (core/pool/arena.h), so a /dev/shm
// smaller than the pool would refuse registrations one by one long after start-up: the arenas
// still to be made (the pool less what recovered arenas already hold) must fit in its free
// space now. INVALID_ARGUMENT naming --pool_capacity_bytes otherwise. Each arena's trailer
// (4 KiB) is left to registration's own reservation.
absl::Status CheckShmRoom(int64_t pool_bytes, int64_t held_bytes) {
  struct statvfs fs {};
  if (::statvfs(kShmDirectory, &fs) != 0) return absl::OkStatus();  // the probe arena says why
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  const int64_t size_bytes = static_cast<int64_t>(fs.f_blocks) * static_cast<int64_t>(fs.f_frsize);
  const int64_t needed = pool_bytes - held_bytes;
  if (needed <= free_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--pool_capacity_bytes: ", pool_bytes, " bytes of host arenas do not fit in ", kShmDirectory,
      ": ", needed, " bytes are still to be reserved there and ", free_bytes, " of its ",
      size_bytes, " bytes are free (", needed - free_bytes,
      " short). Mount a larger /dev/shm (docker run --shm-size; in Kubernetes an emptyDir with "
      "medium: Memory and a sizeLimit) or lower --pool_capacity_bytes"));
}

void SetReadiness(grpc::Server& server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  health->SetServingStatus(kServiceHealthName, serving);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  RETURN_IF_ERROR(ValidateServerOptions(options));
  std::string token;
  if (!options.token_file.empty()) {
    ASSIGN_OR_RETURN(token, LoadBearerToken(options.token_file));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, MakeCredentials(options));

  std::unique_ptr<Server> server(new Server());
  server->options_ = options;
  // The journal is opened and read before anything is bound: a damaged one stops the start.
  std::vector<store::RecoveredModel> recovered;
  if (!options.state_dir.empty()) {
    ASSIGN_OR_RETURN(
        server->store_,
        store::StateStore::Open(options.state_dir,
                                {.sync_interval = absl::Milliseconds(options.state_sync_ms),
                                 .accept_loss = options.state_accept_loss}));
    if (const auto& rollback = server->store_->rolled_back(); rollback.has_value()) {
      LogWarning(absl::StrCat(
          "--state_dir: accepted a journal that lost synced writes (--state_accept_loss): ",
          rollback->reason, "; starting from write ", rollback->journal_write,
          ". What clients did after it is gone: their sequences are missing (NOT_FOUND) or "
          "shorter, and frames they were given may be handed out again"));
    }
    ASSIGN_OR_RETURN(recovered, store::LoadState(*server->store_));
  }
  if (const int removed = RemoveDeadDaemonArenas(); removed > 0) {
    LogInfo(absl::StrCat("removed ", removed,
                         " shared-memory objects of entrokvd processes no longer running"));
  }
  if (server->store_ != nullptr) {
    absl::StatusOr<std::unique_ptr<ArenaNamer>> namer =
        ArenaNamer::ForState(server->store_->instance());
    if (!namer.ok()) {
      return absl::Status(namer.status().code(), absl::StrCat("--state_dir: ", options.state_dir,
                                                              ": ", namer.status().message()));
    }
    server->namer_ = *std::move(namer);
  } else {
    ASSIGN_OR_RETURN(server->namer_, ArenaNamer::ForProcess());
  }
  std::vector<std::string> tenants;
  for (const TenantShare& tenant : options.tenant_share) tenants.push_back(tenant.name);
  server->metrics_ = std::make_unique<ServiceMetrics>(std::move(tenants));
  const int threads = options.worker_threads > 0
                          ? options.worker_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  server->workers_ = std::make_unique<WorkerPool>(threads, options.max_inflight_decisions);
  ASSIGN_OR_RETURN(server->scorers_, DeviceScorers::Create(options.scorer));
  LogInfo(absl::StrCat("scoring: ", server->scorers_->description()));
  server->service_ = std::make_unique<CacheManagerService>(options, token, server->metrics_.get(),
                                                           server->workers_.get());
  server->service_->decider().UseDeviceScorers(server->scorers_.get());
  ModelRegistry& registry = server->service_->registry();
  registry.UseArenaNames(server->namer_.get());
  if (server->store_ != nullptr) {
    registry.UseStore(server->store_.get());
    RETURN_IF_ERROR(registry.Recover(std::move(recovered)));
    LogInfo(absl::StrCat("--state_dir=", options.state_dir, ": journaling to ",
                         server->store_->path(), ", synced every ", options.state_sync_ms, " ms"));
  }
  if (options.backend == Backend::kHost) {
    RETURN_IF_ERROR(CheckShmRoom(options.pool_capacity_bytes, registry.reserved_bytes()));
  }

  if (!options.metrics_listen.empty()) {
    try {
      server->exposer_ = std::make_unique<prometheus::Exposer>(options.metrics_listen, 2);
    } catch (const std::exception& error) {
      return absl::UnavailableError(absl::StrCat("--metrics_listen: cannot serve on ",
                                                 options.metrics_listen, ": ", error.what()));
    }
    server->exposer_->RegisterCollectable(server->metrics_->registry());
    const std::vector<int> metrics_ports = server->exposer_->GetListeningPorts();
    server->metrics_port_ = metrics_ports.empty() ? 0 : metrics_ports.front();
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(options.keepalive_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(std::min<int64_t>(options.keepalive_ms, 20000)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Let clients ping as often as every 5 s without being told off (GOAWAY too_many_pings).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  if (options.max_connection_age_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               static_cast<int>(options.max_connection_age_ms));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               static_cast<int>(options.drain_timeout_ms));
  }
  builder.SetOption(std::make_unique<ReflectionOption>(options.reflection));
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> guards;
  guards.push_back(std::make_unique<CallGuardFactory>(token, server->metrics_.get()));
  builder.experimental().SetInterceptorCreators(std::move(guards));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot serve on ", options.listen, " (port in use?)"));
  }
  SetReadiness(*server->server_, false);
  if (grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService()) {
    health->SetServingStatus(kLivenessHealthName, true);
  }
  // The pool is ready when the default backend can make an arena; until then NOT_SERVING.
  absl::StatusOr<std::unique_ptr<MemoryArena>> probe = CreateArena(options.backend, "probe", 4096);
  if (!probe.ok()) {
    server->Shutdown(absl::ZeroDuration());
    return absl::Status(probe.status().code(),
                        absl::StrCat("--backend: ", probe.status().message()));
  }
  probe->reset();
  SetReadiness(*server->server_, true);
  return server;
}

Server::~Server() { Shutdown(absl::ZeroDuration()); }

std::string Server::address() const { return absl::StrCat(Host(options_.listen), ":", port_); }

std::string Server::ListeningLine() const {
  if (options_.metrics_listen.empty()) {
    return absl::StrCat("entrokvd listening on ", address(), " metrics off");
  }
  return absl::StrCat("entrokvd listening on ", address(), " metrics on ",
                      Host(options_.metrics_listen), ":", metrics_port_);
}

void Server::BeginDrain() {
  if (service_ != nullptr) service_->BeginDrain();
  if (server_ != nullptr) SetReadiness(*server_, false);
}

namespace {
constexpr absl::Duration kDrainLinger = absl::Milliseconds(250);
}  // namespace

void Server::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  BeginDrain();
  const absl::Time deadline = absl::Now() + grace;
  while (service_ != nullptr && service_->active_calls() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  // Linger a moment with admission closed: calls already on the wire when the last in-flight
  // call ended are then refused with UNAVAILABLE (retry elsewhere) by the service, instead of
  // being cancelled by the transport's shutdown.
  absl::SleepFor(std::max(absl::ZeroDuration(), std::min(kDrainLinger, deadline - absl::Now())));
  // With no admitted call left there is nothing to wait for: gRPC's Shutdown would otherwise
  // wait for clients to close their idle connections (one idle channel held the exit 4 s), so
  // it gets the rest of the grace only while calls remain, and stops at once otherwise.
  const bool idle = service_ == nullptr || service_->active_calls() == 0;
  const absl::Duration left = idle ? absl::ZeroDuration() : deadline - absl::Now();
  if (server_ != nullptr) {
    server_->Shutdown(
        std::chrono::system_clock::now() +
        std::chrono::microseconds(std::max<int64_t>(0, absl::ToInt64Microseconds(left))));
  }
  if (workers_ != nullptr) workers_->WaitIdle();
  if (server_ != nullptr) server_->Wait();
  exposer_.reset();  // civetweb takes about 1.5 s to stop
}

}  // namespace entrokv::service
