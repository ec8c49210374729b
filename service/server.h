// entrokvd as an object: the gRPC server, health, metrics exposer and worker pool wired
// together. main.cc and the in-process integration tests both start it this way.
#ifndef ENTROKV_SERVICE_SERVER_H_
#define ENTROKV_SERVICE_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "service/arena_names.h"
#include "service/cache_manager_service.h"
#include "service/device_scorers.h"
#include "service/metrics.h"
#include "service/options.h"
#include "service/worker_pool.h"
#include "store/state_store.h"

namespace prometheus {
class Exposer;
}

namespace entrokv::service {

// Health service names: readiness ("" and the service's full name) turns SERVING once the
// backend is usable and NOT_SERVING when draining starts; liveness stays SERVING until exit.
inline constexpr char kServiceHealthName[] = "entrokv.v1.CacheManager";
inline constexpr char kLivenessHealthName[] = "entrokv.v1.CacheManager.liveness";

// Owns everything it starts. Thread-safe for BeginDrain/Shutdown from a signal-handling
// thread; Shutdown must be called (the destructor calls it with no grace otherwise).
class Server {
 public:
  // Validates the options, binds both ports, starts serving. INVALID_ARGUMENT naming the
  // option for bad configuration (nothing bound then); DATA_LOSS naming --state_dir for a
  // damaged journal (nothing bound then); UNAVAILABLE naming --listen or
  // --metrics_listen when a port cannot be bound; the backend's error when it is unusable.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] int metrics_port() const { return metrics_port_; }
  // "127.0.0.1:<port>" of the gRPC listener (the host as configured).
  [[nodiscard]] std::string address() const;
  // "entrokvd listening on HOST:PORT metrics on HOST:PORT"
  [[nodiscard]] std::string ListeningLine() const;
  [[nodiscard]] CacheManagerService& service() { return *service_; }
  [[nodiscard]] ServiceMetrics& metrics() { return *metrics_; }

  // Blocks until no decision job is queued or running (tests: "the worker is done").
  void WaitIdle() { workers_->WaitIdle(); }
  // Readiness NOT_SERVING; new calls get UNAVAILABLE; admitted calls continue.
  void BeginDrain();
  // BeginDrain, wait up to `grace` for admitted calls, then stop (cancelling what remains),
  // finish the queued decisions and close the metrics endpoint. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  Server() = default;

  ServerOptions options_;
  std::unique_ptr<ServiceMetrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<WorkerPool> workers_;
  std::unique_ptr<DeviceScorers> scorers_;  // outlives service_, whose decider uses it
  // The journal and the arena names outlive the service (its models use both).
  std::unique_ptr<store::StateStore> store_;
  std::unique_ptr<ArenaNamer> namer_;
  std::unique_ptr<CacheManagerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  int metrics_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_SERVER_H_
