// entrokv::Client: the C++ client of entrokvd's CacheManager service.
//
// Every call carries a deadline; a call that fails with UNAVAILABLE (daemon restarting, draining
// or not yet listening) is retried with exponential backoff, nothing else is, so a request that
// changed state is never repeated behind the caller's back (UNAVAILABLE means it was not
// processed). Thread-safe: one Client may serve many threads; a LayerStream serves one.
#ifndef ENTROKV_CLIENT_CPP_CLIENT_H_
#define ENTROKV_CLIENT_CPP_CLIENT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "entrokv/v1/cache_manager.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace entrokv {

struct ClientOptions {
  std::string target = "127.0.0.1:50051";         // host:port of entrokvd
  std::chrono::milliseconds timeout{10000};       // deadline of each attempt
  int max_attempts = 4;                           // first try included; UNAVAILABLE only
  std::chrono::milliseconds initial_backoff{50};  // doubles per retry
  std::string bearer_token;                       // sent as "authorization: Bearer ..." when set
  int max_message_bytes = 256 << 20;              // receive and send limit of the channel
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: insecure (loopback)
  // Called before each retry with the attempt that failed (1 = the first), its UNAVAILABLE
  // status and the backoff about to be waited; for logging and tests. Empty: none.
  std::function<void(int attempt, const absl::Status& status, std::chrono::milliseconds backoff)>
      on_retry;
  // Fail-open decisions (TryDecide): the deadline of one decision, not retried. A worker sizes
  // it to what it can wait before it goes on with its cache as it is.
  std::chrono::milliseconds decision_timeout{500};
  // Called with the status of every decision TryDecide did not get (daemon unreachable,
  // restarting, slow or overloaded); for logging. Empty: none.
  std::function<void(const absl::Status& status)> on_no_decision;
};

// Decisions a fail-open caller went without, by the reason it got (Client::no_decisions).
struct NoDecisionCounts {
  int64_t unavailable = 0;         // the daemon unreachable, restarting or draining
  int64_t deadline_exceeded = 0;   // no answer within decision_timeout
  int64_t resource_exhausted = 0;  // shed (--max_inflight_decisions) or over a bound
  [[nodiscard]] int64_t total() const {
    return unavailable + deadline_exceeded + resource_exhausted;
  }
};

class Client {
 public:
  explicit Client(const ClientOptions& options);

  [[nodiscard]] absl::StatusOr<v1::RegisterModelResponse> RegisterModel(
      const v1::RegisterModelRequest& request);
  [[nodiscard]] absl::StatusOr<v1::GetModelResponse> GetModel(const v1::GetModelRequest& request);
  [[nodiscard]] absl::StatusOr<v1::ListModelsResponse> ListModels();
  [[nodiscard]] absl::StatusOr<v1::UnregisterModelResponse> UnregisterModel(
      const v1::UnregisterModelRequest& request);
  [[nodiscard]] absl::StatusOr<v1::OpenSequenceResponse> OpenSequence(
      const v1::OpenSequenceRequest& request);
  [[nodiscard]] absl::StatusOr<v1::AppendTokensResponse> AppendTokens(
      const v1::AppendTokensRequest& request);
  [[nodiscard]] absl::StatusOr<v1::DecideResponse> Decide(const v1::DecideRequest& request);
  // Speculative decoding: drops the last request.tokens() tokens of a sequence.
  [[nodiscard]] absl::StatusOr<v1::TruncateSequenceResponse> TruncateSequence(
      const v1::TruncateSequenceRequest& request);

  // Fail-open: a decision, or nullopt when none can be had within options.decision_timeout
  // (the daemon unreachable, restarting, draining or slow: UNAVAILABLE, DEADLINE_EXCEEDED; or
  // shed: RESOURCE_EXHAUSTED). nullopt comes quickly, is counted (no_decisions) and reported
  // (on_no_decision); the worker keeps its cache as it is, and the channel reconnects by itself
  // on the retry schedule, so later calls find the daemon once it is back. One attempt, never
  // retried: a decision late is a decision lost. Other errors (a bad request, an unknown
  // sequence) are returned as errors: they are the caller's to fix, not the daemon's health.
  // A deadline miss may still have been applied by the daemon just after the client gave up
  // (docs/service.md, "Errors"): a worker whose cache the daemon owns rereads the block tables
  // (ListSequences) before it relies on them.
  [[nodiscard]] absl::StatusOr<std::optional<v1::DecideResponse>> TryDecide(
      const v1::DecideRequest& request);
  // True for the codes a fail-open caller treats as "no decision" (see TryDecide); for a
  // LayerStream's Finish status too.
  [[nodiscard]] static bool IsNoDecision(const absl::Status& status);
  // Decisions TryDecide went without so far.
  [[nodiscard]] NoDecisionCounts no_decisions() const;
  [[nodiscard]] absl::StatusOr<v1::CloseSequenceResponse> CloseSequence(
      const v1::CloseSequenceRequest& request);
  [[nodiscard]] absl::StatusOr<v1::PoolStats> GetPoolStats(const v1::GetPoolStatsRequest& request);
  // Pool pressure. An admission the pool refuses (OpenSequence, AppendTokens, ResumeSequence)
  // fails RESOURCE_EXHAUSTED with a serialized v1::AdmissionHint as the status's payload under
  // "type.googleapis.com/entrokv.v1.AdmissionHint" (how many frames are missing, when to retry).
  [[nodiscard]] absl::StatusOr<v1::SwapOutSequenceResponse> SwapOutSequence(
      const v1::SwapOutSequenceRequest& request);
  [[nodiscard]] absl::StatusOr<v1::ResumeSequenceResponse> ResumeSequence(
      const v1::ResumeSequenceRequest& request);
  // One page of the model's sequences (request.page_token empty: the first).
  [[nodiscard]] absl::StatusOr<v1::ListSequencesResponse> ListSequences(
      const v1::ListSequencesRequest& request);
  // Every sequence of the model, page by page from the first (request.page_token is ignored),
  // in id order: `visit` gets each one; its first error stops the walk and is returned. A
  // sequence open throughout the walk is visited exactly once; one opened or closed meanwhile
  // may or may not be. Each page is its own call with its own deadline.
  [[nodiscard]] absl::Status ForEachSequence(
      v1::ListSequencesRequest request,
      const std::function<absl::Status(const v1::SequenceInfo&)>& visit);

  // Feeds layer statistics as prefill runs and receives the decisions in order. Not retried:
  // a broken stream reports its status from Read/Finish.
  class LayerStream {
   public:
    // Sends one layer; false when the stream is broken (call Finish for the status).
    [[nodiscard]] bool Write(const v1::DecideLayerRequest& request);
    // Receives the next decision in order; false when the stream has ended.
    [[nodiscard]] bool Read(v1::LayerDecision* decision);
    // Half-closes, drains unread decisions, and returns the final status.
    [[nodiscard]] absl::Status Finish();

   private:
    friend class Client;
    LayerStream() = default;
    grpc::ClientContext context_;
    std::unique_ptr<grpc::ClientReaderWriter<v1::DecideLayerRequest, v1::LayerDecision>> stream_;
    bool writes_done_ = false;
  };
  // The stream's deadline is `stream_timeout` from now (a whole prefill).
  // grpc.health.v1 Check of `service` ("" = readiness of the whole server): "SERVING",
  // "NOT_SERVING", or "UNKNOWN"; the call's error when the daemon does not answer.
  [[nodiscard]] absl::StatusOr<std::string> Health(const std::string& service = "");

  [[nodiscard]] std::unique_ptr<LayerStream> OpenDecideStream(
      std::chrono::milliseconds stream_timeout = std::chrono::minutes(5));

 private:
  template <typename Request, typename Response, typename Method>
  absl::StatusOr<Response> Call(Method method, const Request& request);
  void Prepare(grpc::ClientContext* context, std::chrono::milliseconds timeout) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CacheManager::Stub> stub_;
  std::atomic<int64_t> no_decision_unavailable_{0};
  std::atomic<int64_t> no_decision_deadline_{0};
  std::atomic<int64_t> no_decision_exhausted_{0};
};

}  // namespace entrokv

#endif  // ENTROKV_CLIENT_CPP_CLIENT_H_
