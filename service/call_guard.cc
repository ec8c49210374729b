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

// A unary CacheManager call whose request did not parse: the status says so, with the field
// the protocol would name (the request itself), and the metrics count it under its method.
class ParseGuard final : public grpc::experimental::Interceptor {
 public:
  ParseGuard(Method method, ServiceMetrics* metrics) : method_(method), metrics_(metrics) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsable_ = true;
    }
    if (unparsable_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("request: not a parsable entrokv.v1 ", MethodName(method_), " request")));
      metrics_->RecordRpc(method_, grpc::StatusCode::INVALID_ARGUMENT, 0.0);
    }
    methods->Proceed();
  }

 private:
  const Method method_;
  ServiceMetrics* const metrics_;
  bool unparsable_ = false;
};

constexpr absl::string_view kServicePrefix = "/entrokv.v1.CacheManager/";

}  // namespace

bool IsReflectionMethod(const char* method) {
  return method != nullptr && absl::StartsWith(method, "/grpc.reflection.");
}

CallGuardFactory::CallGuardFactory(const std::string& bearer_token, ServiceMetrics* metrics)
    : expected_(bearer_token.empty() ? "" : absl::StrCat("Bearer ", bearer_token)),
      metrics_(metrics) {}

grpc::experimental::Interceptor* CallGuardFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  if (IsReflectionMethod(info->method())) {
    return expected_.empty() ? nullptr : new ReflectionGuard(info, &expected_);
  }
  if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY || info->method() == nullptr ||
      !absl::StartsWith(info->method(), kServicePrefix)) {
    return nullptr;
  }
  const absl::string_view name = absl::string_view(info->method()).substr(kServicePrefix.size());
  for (int m = 0; m < kMethodCount; ++m) {
    if (MethodName(static_cast<Method>(m)) == name) {
      return new ParseGuard(static_cast<Method>(m), metrics_);
    }
  }
  return nullptr;
}

}  // namespace entrokv::service
