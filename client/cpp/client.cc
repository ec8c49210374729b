#include "client/cpp/client.h"

#include <algorithm>

#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/grpc_status.h"

namespace entrokv {

Client::Client(const ClientOptions& options) : options_(options) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(options.max_message_bytes);
  arguments.SetMaxSendMessageSize(options.max_message_bytes);
  // Reconnect on our retry schedule: gRPC's default (1 s, growing) would make every retry of a
  // daemon that is just starting fail fast until its own backoff elapses.
  const int backoff_ms = static_cast<int>(options.initial_backoff.count());
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, backoff_ms);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, backoff_ms);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(backoff_ms * 8, 1000));
  channel_ = grpc::CreateCustomChannel(
      options.target,
      options.credentials ? options.credentials : grpc::InsecureChannelCredentials(), arguments);
  stub_ = v1::CacheManager::NewStub(channel_);
}

void Client::Prepare(grpc::ClientContext* context, std::chrono::milliseconds timeout) const {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
  if (!options_.bearer_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.bearer_token);
  }
}

template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> Client::Call(Method method, const Request& request) {
  std::chrono::milliseconds backoff = options_.initial_backoff;
  grpc::Status status;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    Prepare(&context, options_.timeout);
    Response response;
    status = ((*stub_).*method)(&context, request, &response);
    if (status.ok()) return response;
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || attempt >= options_.max_attempts) {
      break;
    }
    if (options_.on_retry) options_.on_retry(attempt, FromGrpcStatus(status), backoff);
    // Back off, but drive the reconnect meanwhile: the retry goes as soon as the channel is
    // connected again, or after the backoff.
    (void)channel_->WaitForConnected(std::chrono::system_clock::now() + backoff);
    backoff *= 2;
  }
  return FromGrpcStatus(status);
}

absl::StatusOr<v1::RegisterModelResponse> Client::RegisterModel(
    const v1::RegisterModelRequest& request) {
  return Call<v1::RegisterModelRequest, v1::RegisterModelResponse>(
      &v1::CacheManager::Stub::RegisterModel, request);
}
absl::StatusOr<v1::GetModelResponse> Client::GetModel(const v1::GetModelRequest& request) {
  return Call<v1::GetModelRequest, v1::GetModelResponse>(&v1::CacheManager::Stub::GetModel,
                                                         request);
}
absl::StatusOr<v1::ListModelsResponse> Client::ListModels() {
  return Call<v1::ListModelsRequest, v1::ListModelsResponse>(&v1::CacheManager::Stub::ListModels,
                                                             v1::ListModelsRequest());
}
absl::StatusOr<v1::OpenSequenceResponse> Client::OpenSequence(
    const v1::OpenSequenceRequest& request) {
  return Call<v1::OpenSequenceRequest, v1::OpenSequenceResponse>(
      &v1::CacheManager::Stub::OpenSequence, request);
}
absl::StatusOr<v1::AppendTokensResponse> Client::AppendTokens(
    const v1::AppendTokensRequest& request) {
  return Call<v1::AppendTokensRequest, v1::AppendTokensResponse>(
      &v1::CacheManager::Stub::AppendTokens, request);
}
absl::StatusOr<v1::DecideResponse> Client::Decide(const v1::DecideRequest& request) {
  return Call<v1::DecideRequest, v1::DecideResponse>(&v1::CacheManager::Stub::Decide, request);
}
absl::StatusOr<v1::TruncateSequenceResponse> Client::TruncateSequence(
    const v1::TruncateSequenceRequest& request) {
  return Call<v1::TruncateSequenceRequest, v1::TruncateSequenceResponse>(
      &v1::CacheManager::Stub::TruncateSequence, request);
}

bool Client::IsNoDecision(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsResourceExhausted(status);
}

absl::StatusOr<std::optional<v1::DecideResponse>> Client::TryDecide(
    const v1::DecideRequest& request) {
  grpc::ClientContext context;
  Prepare(&context, options_.decision_timeout);
  v1::DecideResponse response;
  const absl::Status status = FromGrpcStatus(stub_->Decide(&context, request, &response));
  if (status.ok()) return std::optional<v1::DecideResponse>(std::move(response));
  if (!IsNoDecision(status)) return status;
  if (absl::IsUnavailable(status)) {
    no_decision_unavailable_.fetch_add(1);
  } else if (absl::IsDeadlineExceeded(status)) {
    no_decision_deadline_.fetch_add(1);
  } else {
    no_decision_exhausted_.fetch_add(1);
  }
  if (options_.on_no_decision) options_.on_no_decision(status);
  return std::optional<v1::DecideResponse>();
}

NoDecisionCounts Client::no_decisions() const {
  return {.unavailable = no_decision_unavailable_.load(),
          .deadline_exceeded = no_decision_deadline_.load(),
          .resource_exhausted = no_decision_exhausted_.load()};
}

absl::StatusOr<v1::CloseSequenceResponse> Client::CloseSequence(
    const v1::CloseSequenceRequest& request) {
  return Call<v1::CloseSequenceRequest, v1::CloseSequenceResponse>(
      &v1::CacheManager::Stub::CloseSequence, request);
}
absl::StatusOr<v1::SwapOutSequenceResponse> Client::SwapOutSequence(
    const v1::SwapOutSequenceRequest& request) {
  return Call<v1::SwapOutSequenceRequest, v1::SwapOutSequenceResponse>(
      &v1::CacheManager::Stub::SwapOutSequence, request);
}

absl::StatusOr<v1::ResumeSequenceResponse> Client::ResumeSequence(
    const v1::ResumeSequenceRequest& request) {
  return Call<v1::ResumeSequenceRequest, v1::ResumeSequenceResponse>(
      &v1::CacheManager::Stub::ResumeSequence, request);
}

absl::StatusOr<v1::PoolStats> Client::GetPoolStats(const v1::GetPoolStatsRequest& request) {
  return Call<v1::GetPoolStatsRequest, v1::PoolStats>(&v1::CacheManager::Stub::GetPoolStats,
                                                      request);
}
absl::StatusOr<v1::UnregisterModelResponse> Client::UnregisterModel(
    const v1::UnregisterModelRequest& request) {
  return Call<v1::UnregisterModelRequest, v1::UnregisterModelResponse>(
      &v1::CacheManager::Stub::UnregisterModel, request);
}
absl::StatusOr<v1::ListSequencesResponse> Client::ListSequences(
    const v1::ListSequencesRequest& request) {
  return Call<v1::ListSequencesRequest, v1::ListSequencesResponse>(
      &v1::CacheManager::Stub::ListSequences, request);
}

absl::Status Client::ForEachSequence(
    v1::ListSequencesRequest request,
    const std::function<absl::Status(const v1::SequenceInfo&)>& visit) {
  request.clear_page_token();
  while (true) {
    absl::StatusOr<v1::ListSequencesResponse> page = ListSequences(request);
    if (!page.ok()) return page.status();
    for (const v1::SequenceInfo& sequence : page->sequences()) {
      if (absl::Status status = visit(sequence); !status.ok()) return status;
    }
    if (page->next_page_token().empty()) return absl::OkStatus();
    request.set_page_token(page->next_page_token());
  }
}

absl::StatusOr<std::string> Client::Health(const std::string& service) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::ClientContext context;
  Prepare(&context, options_.timeout);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = health->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

std::unique_ptr<Client::LayerStream> Client::OpenDecideStream(
    std::chrono::milliseconds stream_timeout) {
  std::unique_ptr<LayerStream> stream(new LayerStream());
  Prepare(&stream->context_, stream_timeout);
  stream->stream_ = stub_->DecideStream(&stream->context_);
  return stream;
}

bool Client::LayerStream::Write(const v1::DecideLayerRequest& request) {
  return stream_->Write(request);
}

bool Client::LayerStream::Read(v1::LayerDecision* decision) { return stream_->Read(decision); }

absl::Status Client::LayerStream::Finish() {
  if (!writes_done_) {
    stream_->WritesDone();
    writes_done_ = true;
  }
  v1::LayerDecision unread;
  while (stream_->Read(&unread)) {
  }
  return FromGrpcStatus(stream_->Finish());
}

}  // namespace entrokv
