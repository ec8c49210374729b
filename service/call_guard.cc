#include "service/call_guard.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"

namespace entrokv::service {
namespace {

using grpc::experimental::InterceptionHookPoints;

// Reflection describes every method and message of the daemon: with a bearer token configured
// it is as private as the CacheManager itself. Reflection is served by gRPC's own handler, so
// a call without the token is cancelled as soon as its metadata arrives (the handler then
// reads nothing), and its status, should one still be sent, is UNAUTHENTICATED.
class ReflectionGuard final : public grpc::experimental::Interceptor {
 public:
  ReflectionGuard(grpc::experimental::ServerRpcInfo* info, const std::string* expected)
      : info_(info), expected_(expected) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      bool authorized = false;
      if (const auto* metadata = methods->GetRecvInitialMetadata(); metadata != nullptr) {
        const auto it = metadata->find("authorization");
        authorized = it != metadata->end() &&
                     absl::string_view(it->second.data(), it->second.size()) == *expected_;
      }
      if (!authorized) {
        refused_ = true;
        info_->server_context()->TryCancel();
      }
    }
    if (refused_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      methods->ModifySendStatus(
          grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization: bearer token required"));
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* info_;
  const std::string* expected_;
  bool refused_ = false;
};

}  // namespace

bool IsReflectionMethod(const char* method) {
  return method != nullptr && absl::StartsWith(method, "/grpc.reflection.");
}

CallGuardFactory::CallGuardFactory(const std::string& bearer_token)
    : expected_(bearer_token.empty() ? "" : absl::StrCat("Bearer ", bearer_token)) {}

grpc::experimental::Interceptor* CallGuardFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  if (expected_.empty() || !IsReflectionMethod(info->method())) return nullptr;
  return new ReflectionGuard(info, &expected_);
}

}  // namespace entrokv::service
