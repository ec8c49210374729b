// A server interceptor for what the CacheManager handlers cannot see: calls to services the
// daemon did not write (gRPC reflection), which must still present the bearer token.
#ifndef ENTROKV_SERVICE_CALL_GUARD_H_
#define ENTROKV_SERVICE_CALL_GUARD_H_

#include <memory>
#include <string>

#include "grpcpp/support/server_interceptor.h"

namespace entrokv::service {

// Makes one CallGuard per call. With an empty token it makes none.
class CallGuardFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `bearer_token`: the raw token (without "Bearer "), or empty for no authentication.
  explicit CallGuardFactory(const std::string& bearer_token);

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  const std::string expected_;  // "Bearer <token>", or empty
};

// True for the methods of gRPC server reflection.
[[nodiscard]] bool IsReflectionMethod(const char* method);

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_CALL_GUARD_H_
