// The CacheManager gRPC service (callback API): admission (draining, bearer token), request
// validation, the pool operations, and decisions handed to the worker pool.
#ifndef ENTROKV_SERVICE_CACHE_MANAGER_SERVICE_H_
#define ENTROKV_SERVICE_CACHE_MANAGER_SERVICE_H_

#include <atomic>
#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "entrokv/v1/cache_manager.grpc.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "service/decider.h"
#include "service/device_reader.h"
#include "service/metrics.h"
#include "service/model_registry.h"
#include "service/options.h"
#include "service/rank_gather.h"
#include "service/shm_reader.h"
#include "service/worker_pool.h"
#include "wire/resolve.h"

namespace entrokv::service {

// Handlers never block: pool operations are short mutex-guarded bookkeeping and run inline;
// decisions (scoring) run on `workers`, and excess decisions are shed with RESOURCE_EXHAUSTED.
// `metrics` and `workers` must outlive the service, and the service must outlive the
// grpc::Server it is registered with. Thread-safe.
// The callback service with DecideStream served raw (bytes in, bytes out), so that a message
// that does not parse ends the stream with INVALID_ARGUMENT (a typed read reports it like the
// client's half-close): v1::CacheManager::CallbackService with that one link swapped. A new RPC
// must be added to this chain too (else its calls get UNIMPLEMENTED).
namespace internal {
using v1::CacheManager;
using CallbackServiceWithRawStream =
    CacheManager::WithCallbackMethod_RegisterModel<CacheManager::WithCallbackMethod_GetModel<
        CacheManager::WithCallbackMethod_ListModels<CacheManager::WithCallbackMethod_OpenSequence<
            CacheManager::WithCallbackMethod_AppendTokens<CacheManager::WithCallbackMethod_Decide<
                CacheManager::WithRawCallbackMethod_DecideStream<
                    CacheManager::WithCallbackMethod_CloseSequence<
                        CacheManager::WithCallbackMethod_GetPoolStats<
                            CacheManager::WithCallbackMethod_ListSequences<
                                CacheManager::WithCallbackMethod_UnregisterModel<
                                    CacheManager::WithCallbackMethod_TruncateSequence<
                                        CacheManager::WithCallbackMethod_SwapOutSequence<
                                            CacheManager::WithCallbackMethod_ResumeSequence<
                                                CacheManager::Service>>>>>>>>>>>>>>;
}  // namespace internal

class CacheManagerService final : public internal::CallbackServiceWithRawStream {
 public:
  // `bearer_token` empty: no authentication.
  CacheManagerService(const ServerOptions& options, std::string bearer_token,
                      ServiceMetrics* metrics, WorkerPool* workers);

  // From now on every new call gets UNAVAILABLE; calls already admitted finish.
  void BeginDrain() { draining_.store(true); }
  [[nodiscard]] bool draining() const { return draining_.load(); }
  // Calls admitted and not yet finished.
  [[nodiscard]] int active_calls() const { return active_calls_.load(); }
  [[nodiscard]] ModelRegistry& registry() { return registry_; }
  // The device_buffer statistics' mappings (tests read what is mapped).
  [[nodiscard]] DeviceReader& device_reader() { return device_; }
  [[nodiscard]] Decider& decider() { return decider_; }
  [[nodiscard]] const RankGather& ranks() const { return ranks_; }

  grpc::ServerUnaryReactor* RegisterModel(grpc::CallbackServerContext* context,
                                          const v1::RegisterModelRequest* request,
                                          v1::RegisterModelResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* request,
                                     v1::GetModelResponse* response) override;
  grpc::ServerUnaryReactor* OpenSequence(grpc::CallbackServerContext* context,
                                         const v1::OpenSequenceRequest* request,
                                         v1::OpenSequenceResponse* response) override;
  grpc::ServerUnaryReactor* AppendTokens(grpc::CallbackServerContext* context,
                                         const v1::AppendTokensRequest* request,
                                         v1::AppendTokensResponse* response) override;
  grpc::ServerUnaryReactor* Decide(grpc::CallbackServerContext* context,
                                   const v1::DecideRequest* request,
                                   v1::DecideResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DecideStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* CloseSequence(grpc::CallbackServerContext* context,
                                          const v1::CloseSequenceRequest* request,
                                          v1::CloseSequenceResponse* response) override;
  grpc::ServerUnaryReactor* GetPoolStats(grpc::CallbackServerContext* context,
                                         const v1::GetPoolStatsRequest* request,
                                         v1::PoolStats* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* ListSequences(grpc::CallbackServerContext* context,
                                          const v1::ListSequencesRequest* request,
                                          v1::ListSequencesResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterModel(grpc::CallbackServerContext* context,
                                            const v1::UnregisterModelRequest* request,
                                            v1::UnregisterModelResponse* response) override;
  grpc::ServerUnaryReactor* TruncateSequence(grpc::CallbackServerContext* context,
                                             const v1::TruncateSequenceRequest* request,
                                             v1::TruncateSequenceResponse* response) override;
  // Pool pressure: preemption by swapping.
  grpc::ServerUnaryReactor* SwapOutSequence(grpc::CallbackServerContext* context,
                                            const v1::SwapOutSequenceRequest* request,
                                            v1::SwapOutSequenceResponse* response) override;
  grpc::ServerUnaryReactor* ResumeSequence(grpc::CallbackServerContext* context,
                                           const v1::ResumeSequenceRequest* request,
                                           v1::ResumeSequenceResponse* response) override;

  // The handlers' bodies without gRPC: every unary method above calls one of them between
  // admission and Finish (Decide and DecideStream: FindModel, then decider()). Public so that
  // the request fuzzer (tests/fuzz) runs exactly the handlers' validation and actions.
  // NOT_FOUND / INVALID_ARGUMENT naming model_id.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Model>> FindModel(absl::string_view id) const;
  // FindModel, and sequence_id checked (INVALID_ARGUMENT naming it).
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Model>> FindSequenceModel(
      absl::string_view model_id, absl::string_view sequence_id) const;
  [[nodiscard]] absl::Status DoRegisterModel(const v1::RegisterModelRequest& request,
                                             v1::RegisterModelResponse* response);
  [[nodiscard]] absl::Status DoUnregisterModel(const v1::UnregisterModelRequest& request,
                                               v1::UnregisterModelResponse* response);
  [[nodiscard]] absl::Status DoGetModel(const v1::GetModelRequest& request,
                                        v1::GetModelResponse* response);
  [[nodiscard]] absl::Status DoListModels(const v1::ListModelsRequest& request,
                                          v1::ListModelsResponse* response);
  [[nodiscard]] absl::Status DoOpenSequence(const v1::OpenSequenceRequest& request,
                                            v1::OpenSequenceResponse* response);
  [[nodiscard]] absl::Status DoAppendTokens(const v1::AppendTokensRequest& request,
                                            v1::AppendTokensResponse* response);
  [[nodiscard]] absl::Status DoCloseSequence(const v1::CloseSequenceRequest& request,
                                             v1::CloseSequenceResponse* response);
  [[nodiscard]] absl::Status DoTruncateSequence(const v1::TruncateSequenceRequest& request,
                                                v1::TruncateSequenceResponse* response);
  [[nodiscard]] absl::Status DoGetPoolStats(const v1::GetPoolStatsRequest& request,
                                            v1::PoolStats* response);
  [[nodiscard]] absl::Status DoListSequences(const v1::ListSequencesRequest& request,
                                             v1::ListSequencesResponse* response);
  [[nodiscard]] absl::Status DoSwapOutSequence(const v1::SwapOutSequenceRequest& request,
                                               v1::SwapOutSequenceResponse* response);
  [[nodiscard]] absl::Status DoResumeSequence(const v1::ResumeSequenceRequest& request,
                                              v1::ResumeSequenceResponse* response);

 private:
  class UnaryCall;
  class StreamReactor;

  // A synchronous unary handler body: validates, acts, fills the response; the status it
  // returns is the call's.
  template <typename Request, typename Response>
  using Handler = absl::Status (CacheManagerService::*)(const Request&, Response*);

  // The one wrapper of every synchronous unary handler: admission, the body, one Finish that
  // records the metrics.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context, Method method,
                                  Handler<Request, Response> body, const Request* request,
                                  Response* response);

  // UNAVAILABLE while draining, UNAUTHENTICATED for a missing or wrong bearer token.
  [[nodiscard]] absl::Status Admit(const grpc::CallbackServerContext& context) const;
  // RESOURCE_EXHAUSTED naming max_inflight_decisions: a decision shed by the worker pool.
  [[nodiscard]] absl::Status Overloaded() const;
  // A Decide of a tensor-parallel model (or one naming a rank): gathered with the other
  // ranks' (RankGather), decided once, each rank's call finished with the decision.
  void DecideRanks(Model& model, const v1::DecideRequest& request,
                   const std::shared_ptr<UnaryCall>& call, grpc::CallbackServerContext* context,
                   v1::DecideResponse* response, const CallTiming& timing);
  // A complete set of ranks (Decide or DecideStream): decided once, every rank answered.
  void DecideForRanks(Model& model, RankGather::Complete& complete,
                      const std::function<bool()>& cancelled, const CallTiming& timing);

  const ServerOptions options_;
  const std::string bearer_token_;  // "Bearer <token>", or empty
  ServiceMetrics* const metrics_;
  WorkerPool* const workers_;
  ModelRegistry registry_;
  ShmReader shm_;
  DeviceReader device_;  // device_buffer statistics' mappings, released with their sequences
  const wire::Defaults wire_defaults_;  // WireDefaults(options_), built once
  Decider decider_;
  RankGather ranks_;  // tensor-parallel decisions waiting for their ranks
  std::atomic<bool> draining_{false};
  std::atomic<int> active_calls_{0};
};

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_CACHE_MANAGER_SERVICE_H_
