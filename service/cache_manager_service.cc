#include "service/cache_manager_service.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/pool/geometry_bounds.h"
#include "core/util/page_count.h"
#include "core/util/status_macros.h"
#include "proto/grpc_status.h"
#include "service/list_pages.h"
#include "wire/checks.h"
#include "wire/convert.h"
#include "wire/pressure.h"
#include "wire/resolve.h"

namespace entrokv::service {
namespace {

using wire::Annotate;
using wire::ValidateId;
using wire::ValidateTokenCount;
using Clock = std::chrono::steady_clock;

// A layer-layout tensor-parallel model's ranks share one block table, so its decisions wait
// for every rank (RankGather). In the group layout each rank decides its own groups alone
// (the decider's shard), as does a model of one rank.
bool GathersRanks(const Model& model) {
  return model.state().ranks() > 1 && model.state().layout() == FrameLayout::kLayer;
}

void FillPoolInfo(const Model& model, v1::PoolInfo* pool) {
  const CacheState& state = model.state();
  const PoolStats stats = state.Stats();
  const ArenaInfo arena = state.arena();
  pool->set_model_id(model.id());
  *pool->mutable_geometry() = wire::ToProto(state.geometry());
  pool->set_frame_layout(wire::ToProto(state.layout()));
  pool->set_backend(wire::ToProto(model.backend()));
  pool->set_capacity_bytes(static_cast<uint64_t>(stats.capacity_bytes));
  pool->set_capacity_frames(stats.capacity_frames);
  pool->set_frame_bytes(static_cast<uint64_t>(stats.frame_bytes));
  if (arena.backend == Backend::kHost) {
    pool->set_arena_name(arena.name);
  } else {
    pool->set_cuda_ipc_handle(arena.ipc_handle);
  }
  pool->set_tensor_parallel_size(state.ranks());
  for (int rank = 0; rank < state.ranks(); ++rank) {
    const ArenaInfo info = state.arena(rank);
    v1::RankArena* out = pool->add_ranks();
    out->set_rank(rank);
    out->set_device(info.device);
    if (info.backend == Backend::kHost) {
      out->set_arena_name(info.name);
    } else {
      out->set_cuda_ipc_handle(info.ipc_handle);
    }
    const RankSpan span = state.rank_span(rank);
    out->set_frame_bytes(static_cast<uint64_t>(span.frame_bytes));
    out->set_first_frame(span.first_frame);
    out->set_frames(span.frames);
  }
}

void FillFrames(const std::vector<FrameAssignment>& frames,
                google::protobuf::RepeatedPtrField<v1::FrameAssignment>* out) {
  out->Reserve(static_cast<int>(frames.size()));
  for (const FrameAssignment& frame : frames) {
    v1::FrameAssignment* wire = out->Add();
    wire->set_layer(frame.layer);
    wire->set_group(frame.group);
    wire->set_page(frame.page);
    wire->set_frame(frame.frame);
  }
}

void FillSequence(const SequenceInfo& info, v1::SequenceInfo* out) {
  out->set_sequence_id(info.id);
  out->set_length_tokens(info.length);
  out->set_live_frames(info.live_frames);
  out->set_tenant(info.tenant);
  out->set_priority(info.priority);
  *out->mutable_pressure() = wire::ToProto(info.pressure);
  for (size_t layer = 0; layer < info.block_tables.size(); ++layer) {
    for (size_t group = 0; group < info.block_tables[layer].size(); ++group) {
      v1::BlockTable* table = out->add_block_tables();
      table->set_layer(static_cast<int32_t>(layer));
      table->set_group(static_cast<int32_t>(group));
      const std::vector<FrameId>& frames = info.block_tables[layer][group];
      table->mutable_frames()->Assign(frames.begin(), frames.end());
    }
  }
}

// Bytes of a varint holding `value` (>= 0).
int64_t VarintBytes(int64_t value) {
  int64_t bytes = 1;
  while (value >= 128) {
    value >>= 7;
    ++bytes;
  }
  return bytes;
}

// RESOURCE_EXHAUSTED naming `field` and --max_message_bytes when a reply listing the frames of
// pages [first_page, end_page) of every (layer, group) could exceed `max_message_bytes`. An
// upper bound (each frame id at the pool's largest), so it never lets a too-large reply pass.
absl::Status CheckReplyFits(const Model& model, int64_t first_page, int64_t end_page,
                            int64_t max_message_bytes, absl::string_view field) {
  const CacheState& state = model.state();
  const ModelGeometry& geometry = state.geometry();
  const int64_t groups = state.layout() == FrameLayout::kGroup ? geometry.kv_groups : 1;
  const int64_t frames = (end_page - first_page) * geometry.layers * groups;
  if (frames <= 0) return absl::OkStatus();
  // FrameAssignment{layer, group, page, frame}: four tagged varints inside a tagged,
  // length-prefixed entry (tag 1 byte, length at most 2 bytes for these sizes).
  const int64_t entry = 3 + (1 + VarintBytes(geometry.layers)) + (1 + VarintBytes(groups)) +
                        (1 + VarintBytes(end_page)) +
                        (1 + VarintBytes(state.Stats().capacity_frames));
  constexpr int64_t kSequenceInfoBytes = 256;  // id (<= 128) and four small fields
  // Compared as a quotient: frames * entry may be far beyond int64 for absurd requests.
  if (frames > (max_message_bytes - kSequenceInfoBytes) / entry) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": the reply would list ", frames, " frames (up to ", entry,
                     " bytes each), more than --max_message_bytes=", max_message_bytes,
                     " allows; nothing was allocated. Ask for fewer tokens and append the rest"));
  }
  return absl::OkStatus();
}

// `status` with the AdmissionHint of `refusal` when the pool refused the call for frames
// (CacheState filled it); as it is otherwise.
absl::Status WithRefusal(absl::Status status, const AdmissionRefusal& refusal) {
  if (!absl::IsResourceExhausted(status) || refusal.missing_frames <= 0) return status;
  return wire::WithAdmissionHint(std::move(status), refusal);
}

// The call's timing for the Decider: read now, its deadline moved to the steady clock (none
// when the client set none).
CallTiming TimingOf(const grpc::CallbackServerContext& context) {
  CallTiming timing;
  const std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    timing.deadline = timing.received + std::chrono::duration_cast<Clock::duration>(
                                            deadline - std::chrono::system_clock::now());
  }
  return timing;
}

// A decision stopped by its call's cancellation (the Decider reports CANCELLED) is
// DEADLINE_EXCEEDED when the call's deadline has passed: that is what stopped it.
absl::Status PastDeadline(const grpc::CallbackServerContext& context, const absl::Status& status) {
  if (absl::IsCancelled(status) && context.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError(status.message());
  }
  return status;
}

}  // namespace

// One unary call: admission, then exactly one Finish that also records the metrics. Every
// unary handler goes through it (Serve, or Decide directly), so none can skip admission or the
// metrics.
class CacheManagerService::UnaryCall {
 public:
  UnaryCall(CacheManagerService* service, grpc::CallbackServerContext* context, Method method)
      : service_(service),
        reactor_(context->DefaultReactor()),
        method_(method),
        start_(Clock::now()) {
    admission_ = service_->Admit(*context);
    if (admission_.ok()) service_->active_calls_.fetch_add(1);
  }

  [[nodiscard]] const absl::Status& admission() const { return admission_; }
  [[nodiscard]] grpc::ServerUnaryReactor* reactor() const { return reactor_; }

  grpc::ServerUnaryReactor* Finish(const absl::Status& status) {
    const grpc::Status wire = ToGrpcStatus(status);
    service_->metrics_->RecordRpc(method_, wire.error_code(),
                                  std::chrono::duration<double>(Clock::now() - start_).count());
    grpc::ServerUnaryReactor* reactor = reactor_;
    const bool admitted = admission_.ok();
    CacheManagerService* service = service_;
    reactor->Finish(wire);
    if (admitted) service->active_calls_.fetch_sub(1);
    return reactor;
  }

 private:
  CacheManagerService* service_;
  grpc::ServerUnaryReactor* reactor_;
  Method method_;
  Clock::time_point start_;
  absl::Status admission_;
};

CacheManagerService::CacheManagerService(const ServerOptions& options, std::string bearer_token,
                                         ServiceMetrics* metrics, WorkerPool* workers)
    : options_(options),
      bearer_token_(bearer_token.empty() ? "" : absl::StrCat("Bearer ", bearer_token)),
      metrics_(metrics),
      workers_(workers),
      registry_(options.pool_capacity_bytes, options.max_models, options.max_bookkeeping_bytes,
                ToCacheLimits(options), metrics),
      shm_(ShmReader::Access{
          .allowed_uids = options.allowed_shm_uids,
          .is_arena = [this](dev_t dev, ino_t ino) { return registry_.IsArena(dev, ino); }}),
      device_(CudaDeviceMemory()),
      wire_defaults_(WireDefaults(options)),
      decider_(wire_defaults_, metrics, &shm_, &device_),
      ranks_(std::chrono::milliseconds(options.rank_wait_ms), options.max_inflight_decisions,
             int64_t{options.max_inflight_decisions} * options.max_message_bytes, &shm_, &device_) {
  registry_.UsePressure(ToPressureOptions(options));
}

absl::Status CacheManagerService::Admit(const grpc::CallbackServerContext& context) const {
  if (draining_.load()) return absl::UnavailableError("entrokvd is draining; retry elsewhere");
  if (!bearer_token_.empty()) {
    const auto& metadata = context.client_metadata();
    const auto it = metadata.find("authorization");
    if (it == metadata.end()) {
      return absl::UnauthenticatedError("authorization: bearer token required");
    }
    const absl::string_view sent(it->second.data(), it->second.size());
    if (sent != bearer_token_) return absl::UnauthenticatedError("authorization: invalid token");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Model>> CacheManagerService::FindModel(absl::string_view id) const {
  RETURN_IF_ERROR(ValidateId("model_id", id));
  return registry_.Find(id);
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* CacheManagerService::Serve(grpc::CallbackServerContext* context,
                                                     Method method, Handler<Request, Response> body,
                                                     const Request* request, Response* response) {
  UnaryCall call(this, context, method);
  if (!call.admission().ok()) return call.Finish(call.admission());
  return call.Finish((this->*body)(*request, response));
}

absl::StatusOr<std::shared_ptr<Model>> CacheManagerService::FindSequenceModel(
    absl::string_view model_id, absl::string_view sequence_id) const {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model, FindModel(model_id));
  RETURN_IF_ERROR(ValidateId("sequence_id", sequence_id));
  return model;
}

absl::Status CacheManagerService::DoRegisterModel(const v1::RegisterModelRequest& request,
                                                  v1::RegisterModelResponse* response) {
  ASSIGN_OR_RETURN(const CacheOptions cache, wire::ResolvePool(request, wire_defaults_));
  RETURN_IF_ERROR(ValidateFrameBounds(cache.geometry, cache.layout));
  // Tiny frames in a large arena cost bookkeeping per frame out of all proportion to the arena.
  const int64_t frames = cache.capacity_bytes / FrameBytes(cache.geometry, cache.layout);
  if (frames > options_.max_pool_frames) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "capacity_bytes: ", frames, " frames of ", FrameBytes(cache.geometry, cache.layout),
        " bytes, more than --max_pool_frames=", options_.max_pool_frames));
  }
  // A geometry whose every sequence would pass the bookkeeping bounds is refused now, before
  // an arena exists, not at its first OpenSequence.
  RETURN_IF_ERROR(Annotate(CacheState::CheckLimits(cache), "geometry"));
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model, registry_.Register(request.model_id(), cache));
  FillPoolInfo(*model, response->mutable_pool());
  return absl::OkStatus();
}

absl::Status CacheManagerService::DoGetModel(const v1::GetModelRequest& request,
                                             v1::GetModelResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model, FindModel(request.model_id()));
  FillPoolInfo(*model, response->mutable_pool());
  return absl::OkStatus();
}

absl::Status CacheManagerService::DoListModels(const v1::ListModelsRequest& /*request*/,
                                               v1::ListModelsResponse* response) {
  for (const std::shared_ptr<Model>& model : registry_.All()) {
    FillPoolInfo(*model, response->add_pools());
  }
  return absl::OkStatus();
}

absl::Status CacheManagerService::DoOpenSequence(const v1::OpenSequenceRequest& request,
                                                 v1::OpenSequenceResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model,
                   FindSequenceModel(request.model_id(), request.sequence_id()));
  RETURN_IF_ERROR(ValidateTokenCount("initial_tokens", request.initial_tokens(), 0));
  CacheState& state = model->state();
  {
    // The reply lists every new frame; one that gRPC could not send must not leave the
    // sequence behind, so the bound is checked before anything is created.
    const int64_t page_size = state.geometry().page_size;
    const int64_t new_pages = PageCount(request.initial_tokens(), page_size);
    // A prefix beyond any sequence is refused by ForkSequence; here it only must not overflow.
    const int64_t first_page = std::clamp<int64_t>(request.prefix_pages(), 0, int64_t{1} << 40);
    RETURN_IF_ERROR(CheckReplyFits(*model, first_page, first_page + new_pages,
                                   options_.max_message_bytes, "initial_tokens"));
  }
  // --max_sequences_per_model and the bookkeeping bounds are checked by the CacheState under
  // its lock, so concurrent opens cannot pass them together.
  const SequenceTerms terms = wire::ToSequenceTerms(request);
  if (request.parent_sequence_id().empty()) {
    if (request.prefix_pages() != 0) {
      return absl::InvalidArgumentError("prefix_pages: needs parent_sequence_id");
    }
    RETURN_IF_ERROR(state.OpenSequence(request.sequence_id(), 0, terms));
  } else {
    RETURN_IF_ERROR(ValidateId("parent_sequence_id", request.parent_sequence_id()));
    if (request.prefix_pages() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefix_pages: must be >= 0, got ", request.prefix_pages()));
    }
    RETURN_IF_ERROR(state.ForkSequence(request.sequence_id(), request.parent_sequence_id(),
                                       request.prefix_pages(), terms));
  }
  if (request.initial_tokens() > 0) {
    AdmissionRefusal refusal;
    absl::StatusOr<AppendResult> appended =
        state.AppendTokens(request.sequence_id(), request.initial_tokens(),
                           AppendOptions{.admission = true, .refusal = &refusal});
    if (!appended.ok()) {
      // All or nothing: the sequence goes again (its only frames are the shared prefix's).
      (void)state.CloseSequence(request.sequence_id());
      model->RefreshOccupancy();
      return WithRefusal(Annotate(appended.status(), "initial_tokens"), refusal);
    }
    FillFrames(appended->new_frames, response->mutable_new_frames());
  }
  if (model->retired()) {  // UnregisterModel raced this call and missed the new sequence
    (void)state.CloseSequence(request.sequence_id());
    return absl::NotFoundError(
        absl::StrCat("model_id: '", request.model_id(), "' is not registered"));
  }
  ASSIGN_OR_RETURN(const SequenceInfo info,
                   state.GetSequence(request.sequence_id(), /*with_block_tables=*/false));
  FillSequence(info, response->mutable_sequence());
  *response->mutable_pressure() = response->sequence().pressure();
  model->RefreshOccupancy();
  return absl::OkStatus();
}

absl::Status CacheManagerService::DoUnregisterModel(const v1::UnregisterModelRequest& request,
                                                    v1::UnregisterModelResponse* response) {
  RETURN_IF_ERROR(ValidateId("model_id", request.model_id()));
  ASSIGN_OR_RETURN(const int64_t closed, registry_.Unregister(request.model_id(), request.force()));
  device_.ReleaseModel(request.model_id());
  response->set_closed_sequences(closed);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CacheManagerService::UnregisterModel(
    grpc::CallbackServerContext* context, const v1::UnregisterModelRequest* request,
    v1::UnregisterModelResponse* response) {
  return Serve(context, Method::kUnregisterModel, &CacheManagerService::DoUnregisterModel, request,
               response);
}

absl::Status CacheManagerService::DoAppendTokens(const v1::AppendTokensRequest& request,
                                                 v1::AppendTokensResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model,
                   FindSequenceModel(request.model_id(), request.sequence_id()));
  RETURN_IF_ERROR(ValidateTokenCount("tokens", request.tokens(), 1));
  ASSIGN_OR_RETURN(const int64_t length, model->state().SequenceLength(request.sequence_id()));
  const int64_t page_size = model->state().geometry().page_size;
  // From the page holding the last token: a shared tail page is copied on write.
  RETURN_IF_ERROR(CheckReplyFits(*model, length / page_size,
                                 PageCount(length + request.tokens(), page_size),
                                 options_.max_message_bytes, "tokens"));
  AdmissionRefusal refusal;
  absl::StatusOr<AppendResult> appended =
      model->state().AppendTokens(request.sequence_id(), request.tokens(),
                                  AppendOptions{.admission = false, .refusal = &refusal});
  model->RefreshOccupancy();
  if (!appended.ok()) return WithRefusal(appended.status(), refusal);
  response->set_length_tokens(appended->length);
  FillFrames(appended->new_frames, response->mutable_new_frames());
  wire::FillEvicted(appended->evicted, response->mutable_evicted());
  ASSIGN_OR_RETURN(PressureReport pressure, model->state().Pressure(request.sequence_id()));
  pressure.reclaimed_frames = appended->reclaimed_frames;
  *response->mutable_pressure() = wire::ToProto(pressure);
  return absl::OkStatus();
}

absl::Status CacheManagerService::DoSwapOutSequence(const v1::SwapOutSequenceRequest& request,
                                                    v1::SwapOutSequenceResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model,
                   FindSequenceModel(request.model_id(), request.sequence_id()));
  ASSIGN_OR_RETURN(const SwapOutResult swapped, model->state().SwapOut(request.sequence_id()));
  response->set_freed_frames(swapped.freed_frames);
  response->set_swapped_bytes(swapped.swapped_bytes);
  model->RefreshOccupancy();
  return absl::OkStatus();
}

absl::Status CacheManagerService::DoResumeSequence(const v1::ResumeSequenceRequest& request,
                                                   v1::ResumeSequenceResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model,
                   FindSequenceModel(request.model_id(), request.sequence_id()));
  CacheState& state = model->state();
  AdmissionRefusal refusal;
  absl::StatusOr<AppendResult> resumed = state.Resume(request.sequence_id(), &refusal);
  model->RefreshOccupancy();
  if (!resumed.ok()) return WithRefusal(resumed.status(), refusal);
  FillFrames(resumed->new_frames, response->mutable_new_frames());
  ASSIGN_OR_RETURN(const SequenceInfo info,
                   state.GetSequence(request.sequence_id(), /*with_block_tables=*/false));
  FillSequence(info, response->mutable_sequence());
  *response->mutable_pressure() = response->sequence().pressure();
  return absl::OkStatus();
}

absl::Status CacheManagerService::DoTruncateSequence(const v1::TruncateSequenceRequest& request,
                                                     v1::TruncateSequenceResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model,
                   FindSequenceModel(request.model_id(), request.sequence_id()));
  RETURN_IF_ERROR(ValidateTokenCount("tokens", request.tokens(), 1));
  // OUT_OF_RANGE naming tokens past the sequence's length (the core's message starts with it).
  ASSIGN_OR_RETURN(const TruncateResult truncated,
                   model->state().TruncateSequence(request.sequence_id(), request.tokens()));
  response->set_length_tokens(truncated.length);
  response->set_frames_freed(static_cast<int64_t>(truncated.freed_frames.size()));
  model->RefreshOccupancy();
  return absl::OkStatus();
}

absl::Status CacheManagerService::DoCloseSequence(const v1::CloseSequenceRequest& request,
                                                  v1::CloseSequenceResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model,
                   FindSequenceModel(request.model_id(), request.sequence_id()));
  CacheState& state = model->state();
  absl::StatusOr<SequenceInfo> info =
      state.GetSequence(request.sequence_id(), /*with_block_tables=*/false);
  if (absl::IsFailedPrecondition(info.status())) {
    // A sequence lost at recovery: closing it is how its client acknowledges the loss.
    return state.CloseSequence(request.sequence_id());
  }
  RETURN_IF_ERROR(info.status());
  RETURN_IF_ERROR(state.CloseSequence(request.sequence_id()));
  device_.ReleaseSequence(model->id(), request.sequence_id());
  response->set_live_frames(info->live_frames);
  model->RefreshOccupancy();
  return absl::OkStatus();
}

absl::Status CacheManagerService::DoGetPoolStats(const v1::GetPoolStatsRequest& request,
                                                 v1::PoolStats* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model, FindModel(request.model_id()));
  const PoolStats stats = model->state().Stats();
  response->set_model_id(model->id());
  response->set_capacity_frames(stats.capacity_frames);
  response->set_used_frames(stats.used_frames);
  response->set_free_frames(stats.free_frames);
  response->set_frame_bytes(static_cast<uint64_t>(stats.frame_bytes));
  response->set_capacity_bytes(static_cast<uint64_t>(stats.capacity_bytes));
  response->set_sequences_active(stats.sequences_active);
  response->mutable_used_frames_per_layer()->Assign(stats.used_frames_per_layer.begin(),
                                                    stats.used_frames_per_layer.end());
  response->set_pages_evicted_total(stats.pages_evicted_total);
  response->set_frames_freed_total(stats.frames_freed_total);
  response->set_bytes_moved_total(stats.bytes_moved_total);
  response->set_bookkeeping_bytes(stats.bookkeeping_bytes);
  wire::FillPressureStats(stats.pressure, response);
  return absl::OkStatus();
}

absl::Status CacheManagerService::DoListSequences(const v1::ListSequencesRequest& request,
                                                  v1::ListSequencesResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model, FindModel(request.model_id()));
  ASSIGN_OR_RETURN(const int32_t page_size, ListPageSize(request.page_size()));
  ListOptions list;
  ASSIGN_OR_RETURN(list.after_id, DecodePageToken(request.page_token()));
  list.max_sequences = page_size;
  list.with_block_tables = request.include_block_tables();
  // Bounds what the page builds, not only what gRPC would refuse to send.
  list.max_table_entries = std::max<int64_t>(
      1,
      (options_.max_message_bytes - int64_t{page_size} * kListedSequenceBytes) / kListedEntryBytes);
  absl::StatusOr<SequencePage> page = model->state().ListSequencePage(list);
  if (absl::IsResourceExhausted(page.status())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "include_block_tables: ", page.status().message(),
        " (--max_message_bytes=", options_.max_message_bytes, "); list without block tables"));
  }
  RETURN_IF_ERROR(page.status());
  for (const SequenceInfo& info : page->sequences) FillSequence(info, response->add_sequences());
  if (page->more && !page->sequences.empty()) {
    response->set_next_page_token(EncodePageToken(page->sequences.back().id));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CacheManagerService::RegisterModel(
    grpc::CallbackServerContext* context, const v1::RegisterModelRequest* request,
    v1::RegisterModelResponse* response) {
  return Serve(context, Method::kRegisterModel, &CacheManagerService::DoRegisterModel, request,
               response);
}

grpc::ServerUnaryReactor* CacheManagerService::GetModel(grpc::CallbackServerContext* context,
                                                        const v1::GetModelRequest* request,
                                                        v1::GetModelResponse* response) {
  return Serve(context, Method::kGetModel, &CacheManagerService::DoGetModel, request, response);
}

grpc::ServerUnaryReactor* CacheManagerService::ListModels(grpc::CallbackServerContext* context,
                                                          const v1::ListModelsRequest* request,
                                                          v1::ListModelsResponse* response) {
  return Serve(context, Method::kListModels, &CacheManagerService::DoListModels, request, response);
}

grpc::ServerUnaryReactor* CacheManagerService::OpenSequence(grpc::CallbackServerContext* context,
                                                            const v1::OpenSequenceRequest* request,
                                                            v1::OpenSequenceResponse* response) {
  return Serve(context, Method::kOpenSequence, &CacheManagerService::DoOpenSequence, request,
               response);
}

grpc::ServerUnaryReactor* CacheManagerService::AppendTokens(grpc::CallbackServerContext* context,
                                                            const v1::AppendTokensRequest* request,
                                                            v1::AppendTokensResponse* response) {
  return Serve(context, Method::kAppendTokens, &CacheManagerService::DoAppendTokens, request,
               response);
}

grpc::ServerUnaryReactor* CacheManagerService::SwapOutSequence(
    grpc::CallbackServerContext* context, const v1::SwapOutSequenceRequest* request,
    v1::SwapOutSequenceResponse* response) {
  return Serve(context, Method::kSwapOutSequence, &CacheManagerService::DoSwapOutSequence, request,
               response);
}

grpc::ServerUnaryReactor* CacheManagerService::ResumeSequence(
    grpc::CallbackServerContext* context, const v1::ResumeSequenceRequest* request,
    v1::ResumeSequenceResponse* response) {
  return Serve(context, Method::kResumeSequence, &CacheManagerService::DoResumeSequence, request,
               response);
}

grpc::ServerUnaryReactor* CacheManagerService::CloseSequence(
    grpc::CallbackServerContext* context, const v1::CloseSequenceRequest* request,
    v1::CloseSequenceResponse* response) {
  return Serve(context, Method::kCloseSequence, &CacheManagerService::DoCloseSequence, request,
               response);
}

grpc::ServerUnaryReactor* CacheManagerService::TruncateSequence(
    grpc::CallbackServerContext* context, const v1::TruncateSequenceRequest* request,
    v1::TruncateSequenceResponse* response) {
  return Serve(context, Method::kTruncateSequence, &CacheManagerService::DoTruncateSequence,
               request, response);
}

grpc::ServerUnaryReactor* CacheManagerService::GetPoolStats(grpc::CallbackServerContext* context,
                                                            const v1::GetPoolStatsRequest* request,
                                                            v1::PoolStats* response) {
  return Serve(context, Method::kGetPoolStats, &CacheManagerService::DoGetPoolStats, request,
               response);
}

grpc::ServerUnaryReactor* CacheManagerService::ListSequences(
    grpc::CallbackServerContext* context, const v1::ListSequencesRequest* request,
    v1::ListSequencesResponse* response) {
  return Serve(context, Method::kListSequences, &CacheManagerService::DoListSequences, request,
               response);
}

// Decide is the one unary call that finishes on a worker thread: the same UnaryCall admits it
// and finishes it, the scoring runs on the worker pool.
grpc::ServerUnaryReactor* CacheManagerService::Decide(grpc::CallbackServerContext* context,
                                                      const v1::DecideRequest* request,
                                                      v1::DecideResponse* response) {
  auto call = std::make_shared<UnaryCall>(this, context, Method::kDecide);
  if (!call->admission().ok()) return call->Finish(call->admission());
  absl::StatusOr<std::shared_ptr<Model>> model = FindModel(request->model_id());
  if (!model.ok()) return call->Finish(model.status());
  grpc::ServerUnaryReactor* reactor = call->reactor();
  const CallTiming timing = TimingOf(*context);
  // The worker may finish the reactor before this returns it; gRPC allows either order.
  const bool accepted = workers_->TrySubmit(
      [this, call, context, request, response, timing, model = *std::move(model)] {
        if (GathersRanks(*model)) {
          DecideRanks(*model, *request, call, context, response, timing);
          return;
        }
        const absl::Status status = decider_.Decide(
            *model, *request, [context] { return context->IsCancelled(); }, response, timing);
        call->Finish(PastDeadline(*context, status));
      });
  if (!accepted) return call->Finish(Overloaded());
  return reactor;
}

// One rank's Decide of a tensor-parallel model: waits in ranks_ (no thread held) until every
// rank's request is there; the one that completes the set decides for all, over every rank's
// query heads, and answers each rank the same decision.
void CacheManagerService::DecideRanks(Model& model, const v1::DecideRequest& request,
                                      const std::shared_ptr<UnaryCall>& call,
                                      grpc::CallbackServerContext* context,
                                      v1::DecideResponse* response, const CallTiming& timing) {
  RankGather::Reply reply = [call, context, response](const absl::Status& status,
                                                      const v1::DecideResponse* decision) {
    if (status.ok()) *response = *decision;
    call->Finish(PastDeadline(*context, status));
  };
  absl::StatusOr<std::optional<RankGather::Complete>> added =
      ranks_.Add(model, request, std::move(reply));
  if (!added.ok()) {
    call->Finish(added.status());
    return;
  }
  if (!added->has_value()) return;  // answered when the last rank comes, or at rank_wait_ms
  DecideForRanks(
      model, **added, [context] { return context->IsCancelled(); }, timing);
}

void CacheManagerService::DecideForRanks(Model& model, RankGather::Complete& complete,
                                         const std::function<bool()>& cancelled,
                                         const CallTiming& timing) {
  v1::DecideResponse decision;
  const absl::Status status =
      decider_.Decide(model, complete.request, cancelled, &decision, timing);
  for (RankGather::Reply& each : complete.replies) each(status, status.ok() ? &decision : nullptr);
}

absl::Status CacheManagerService::Overloaded() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("max_inflight_decisions: ", options_.max_inflight_decisions,
                   " decisions in flight; retry with backoff"));
}

// DecideStream: read one layer, score it on the worker pool, write its decision, read the
// next. One message in flight per stream keeps the decisions in order and bounds memory; the
// reactor deletes itself in OnDone.
class CacheManagerService::StreamReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamReactor(CacheManagerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), start_(Clock::now()) {
    const absl::Status admission = service_->Admit(*context);
    if (!admission.ok()) {
      admitted_ = false;
      FinishWith(admission);
      return;
    }
    service_->active_calls_.fetch_add(1);
    StartRead(&request_bytes_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or the call ended)
      FinishWith(absl::OkStatus());
      return;
    }
    if (service_->draining()) {
      FinishWith(absl::UnavailableError("entrokvd is draining; retry elsewhere"));
      return;
    }
    request_.Clear();
    if (!grpc::SerializationTraits<v1::DecideLayerRequest>::Deserialize(&request_bytes_, &request_)
             .ok()) {
      FinishWith(absl::InvalidArgumentError(
          absl::StrCat("DecideStream: message ", messages_,
                       " is not a parsable entrokv.v1.DecideLayerRequest")));
      return;
    }
    ++messages_;
    absl::StatusOr<std::shared_ptr<Model>> model = service_->FindModel(request_.model_id());
    if (!model.ok()) {
      FinishWith(model.status());
      return;
    }
    timing_ = TimingOf(*context_);  // answer_within_ms counts from this message
    const bool accepted = service_->workers_->TrySubmit([this, model = *std::move(model)] {
      if (request_.has_rank() && GathersRanks(*model)) {
        ProcessRank(*model);
      } else {
        Process(*model);
      }
    });
    if (!accepted) FinishWith(service_->Overloaded());
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      FinishWith(absl::CancelledError("stream closed while writing a decision"));
      return;
    }
    StartRead(&request_bytes_);
  }

  void OnDone() override {
    service_->metrics_->RecordRpc(Method::kDecideStream, final_code_,
                                  std::chrono::duration<double>(Clock::now() - start_).count());
    if (admitted_) service_->active_calls_.fetch_sub(1);
    delete this;
  }

 private:
  void Process(Model& model) {
    response_.Clear();
    const absl::Status status = service_->decider_.DecideLayer(
        model, request_, [this] { return context_->IsCancelled(); }, &response_, timing_);
    if (!status.ok()) {
      FinishWith(PastDeadline(*context_, status));
      return;
    }
    Write();
  }

  // One rank's layer of a tensor-parallel model: the layer as a one-layer Decide of that rank,
  // gathered with the other ranks' streams in the service's RankGather (no thread waits: the
  // stream reads its next message only after the reply, which the rank completing the set
  // sends, or the wait's deadline, or a bad rank).
  void ProcessRank(Model& model) {
    v1::DecideRequest request;
    request.set_model_id(request_.model_id());
    request.set_sequence_id(request_.sequence_id());
    *request.add_layers() = request_.layer();
    *request.mutable_budget() = request_.budget();
    *request.mutable_policy() = request_.policy();
    request.set_use_cached_weights(request_.use_cached_weights());
    request.set_degrade_on_deadline(request_.degrade_on_deadline());
    request.set_answer_within_ms(request_.answer_within_ms());
    request.set_rank(request_.rank());
    RankGather::Reply reply = [this](const absl::Status& status,
                                     const v1::DecideResponse* decision) {
      if (!status.ok()) {
        FinishWith(PastDeadline(*context_, status));
        return;
      }
      response_ = decision->layers(0);
      Write();
    };
    absl::StatusOr<std::optional<RankGather::Complete>> added =
        service_->ranks_.Add(model, request, std::move(reply));
    if (!added.ok()) {
      FinishWith(added.status());
      return;
    }
    if (!added->has_value()) return;
    service_->DecideForRanks(
        model, **added, [this] { return context_->IsCancelled(); }, timing_);
  }

  // Sends response_ and reads the next message when it is written.
  void Write() {
    bool own_buffer = false;
    response_bytes_.Clear();
    if (const grpc::Status serialized = grpc::SerializationTraits<v1::LayerDecision>::Serialize(
            response_, &response_bytes_, &own_buffer);
        !serialized.ok()) {
      FinishWith(absl::InternalError(
          absl::StrCat("DecideStream: cannot serialize a decision: ", serialized.error_message())));
      return;
    }
    StartWrite(&response_bytes_);
  }

  void FinishWith(const absl::Status& status) {
    const grpc::Status wire = ToGrpcStatus(status);
    final_code_ = wire.error_code();
    Finish(wire);
  }

  CacheManagerService* service_;
  grpc::CallbackServerContext* context_;
  Clock::time_point start_;
  bool admitted_ = true;
  grpc::StatusCode final_code_ = grpc::StatusCode::OK;
  int64_t messages_ = 0;  // parsed so far, to name the one that is not
  CallTiming timing_;     // of the message being decided
  grpc::ByteBuffer request_bytes_;
  grpc::ByteBuffer response_bytes_;
  v1::DecideLayerRequest request_;
  v1::LayerDecision response_;
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CacheManagerService::DecideStream(
    grpc::CallbackServerContext* context) {
  return new StreamReactor(this, context);
}

}  // namespace entrokv::service
