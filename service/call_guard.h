// A server interceptor for what the CacheManager handlers cannot see: calls to services the
// daemon did not write (gRPC reflection), which must still present the bearer token, and unary
// requests that do not parse, which gRPC answers itself (UNIMPLEMENTED, no message) without
// calling a handler, so they would be neither explained nor counted.
#ifndef ENTROKV_SERVICE_CALL_GUARD_H_
#define ENTROKV_SERVICE_CALL_GUARD_H_

#include <memory>
#include <string>

#include "grpcpp/support/server_interceptor.h"
#include "service/metrics.h"

namespace entrokv::service {

// Makes a guard for reflection calls (when a token is set) and for unary CacheManager calls;
// none for the rest.
class CallGuardFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `bearer_token`: the raw token (without "Bearer "), or empty for no authentication.
  // `metrics` must outlive the server.
  CallGuardFactory(const std::string& bearer_token, ServiceMetrics* metrics);

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  const std::string expected_;  // "Bearer <token>", or empty
  ServiceMetrics* const metrics_;
};

// True for the methods of gRPC server reflection.
[[nodiscard]] bool IsReflectionMethod(const char* method);

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_CALL_GUARD_H_
