// The bad requests of a load-generator worker (see load_generator.h): each case sends one
// request the daemon must refuse with its documented code (or, for extreme but valid values,
// answer as the core does), and most check that the private pool did not change.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "bench/load/worker.h"
#include "bench/load/worker_internal.h"
#include "grpcpp/generic/generic_stub.h"
#include "service/validation.h"

namespace entrokv::bench {

using Clock = std::chrono::steady_clock;
using grpc::StatusCode;
using worker_internal::Cut;
using worker_internal::kMaxSequencesPerModel;
using worker_internal::kPrivateShape;
using worker_internal::kSlotBytes;
using worker_internal::kSlots;
using worker_internal::Pages;
using worker_internal::ToCore;
// ---------------------------------------------------------------------------------------------
// Bad requests

Worker::Snapshot Worker::TakeSnapshot() {
  Snapshot snapshot;
  v1::GetPoolStatsRequest request;
  request.set_model_id(private_.id);
  v1::PoolStats stats;
  if (!Expect(Call("GetPoolStats", &v1::CacheManager::Stub::GetPoolStats, request, &stats),
              {StatusCode::OK}, "GetPoolStats " + private_.id)) {
    return snapshot;
  }
  snapshot.used = stats.used_frames();
  snapshot.free = stats.free_frames();
  snapshot.sequences = stats.sequences_active();
  snapshot.evicted = stats.pages_evicted_total();
  snapshot.freed = stats.frames_freed_total();
  return snapshot;
}

void Worker::Unchanged(const char* what, absl::FunctionRef<void()> send) {
  const Snapshot before = TakeSnapshot();
  send();
  const Snapshot after = TakeSnapshot();
  Check(before == after,
        absl::StrCat(what, " changed the pool: used ", before.used, "->", after.used,
                     ", sequences ", before.sequences, "->", after.sequences, ", evicted ",
                     before.evicted, "->", after.evicted));
}

Worker::Sequence* Worker::PrivateSequence() {
  for (Sequence& sequence : private_.sequences) {
    if (sequence.length >= 1) return &sequence;
  }
  if (static_cast<int>(private_.sequences.size()) >= kMaxSequencesPerModel) {
    CloseSequence(private_, 0, false);
  }
  const size_t before = private_.sequences.size();
  OpenSequence(private_, false);
  if (private_.sequences.size() == before || private_.sequences.back().length < 1) return nullptr;
  return &private_.sequences.back();
}

v1::DecideRequest Worker::ValidDecide(const Sequence& sequence, int layer) {
  v1::DecideRequest request;
  request.set_model_id(private_.id);
  request.set_sequence_id(sequence.id);
  request.mutable_budget()->set_pages_per_group(4);
  request.mutable_policy()->set_name("page_entrokv");
  v1::LayerStatistic* input = request.add_layers();
  input->set_layer(layer);
  v1::Statistic* stat = input->mutable_statistic();
  stat->set_dtype(v1::DTYPE_BFLOAT16);
  stat->set_query_heads(private_.shape.query_heads);
  stat->set_tokens(sequence.length);
  stat->set_data(RandomStatistic(private_.shape, sequence.length, v1::DTYPE_BFLOAT16));
  return request;
}

void Worker::BadRequest() {
  const int64_t which = Uniform(0, 21);
  const StatusCode kInvalid = StatusCode::INVALID_ARGUMENT;
  switch (which) {
    case 0: {  // malformed ids
      static const std::string kIds[] = {"", std::string(129, 'a'), "a b", "s\xc3\xbc", "x;y"};
      v1::OpenSequenceRequest request;
      request.set_model_id(private_.id);
      request.set_sequence_id(kIds[Uniform(0, 4)]);
      request.set_initial_tokens(16);
      Unchanged("a malformed sequence_id", [&] {
        v1::OpenSequenceResponse response;
        (void)Expect(Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request, &response,
                          "bad_id"),
                     {kInvalid}, "OpenSequence with a malformed id");
      });
      return;
    }
    case 1: {  // unknown model
      const std::string missing = absl::StrCat(tag_, "-no-such-model");
      if (Chance(50)) {
        v1::GetPoolStatsRequest request;
        request.set_model_id(missing);
        v1::PoolStats response;
        (void)Expect(Call("GetPoolStats", &v1::CacheManager::Stub::GetPoolStats, request, &response,
                          "unknown_model"),
                     {StatusCode::NOT_FOUND}, "GetPoolStats of an unknown model");
      } else {
        v1::OpenSequenceRequest request;
        request.set_model_id(missing);
        request.set_sequence_id(NewSequenceId());
        v1::OpenSequenceResponse response;
        (void)Expect(Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request, &response,
                          "unknown_model"),
                     {StatusCode::NOT_FOUND}, "OpenSequence on an unknown model");
      }
      return;
    }
    case 2: {  // unknown sequence
      const std::string missing = absl::StrCat(tag_, "-no-such-sequence");
      Unchanged("an unknown sequence", [&] {
        if (Chance(50)) {
          v1::AppendTokensRequest request;
          request.set_model_id(private_.id);
          request.set_sequence_id(missing);
          request.set_tokens(3);
          v1::AppendTokensResponse response;
          (void)Expect(Call("AppendTokens", &v1::CacheManager::Stub::AppendTokens, request,
                            &response, "unknown_sequence"),
                       {StatusCode::NOT_FOUND}, "AppendTokens to an unknown sequence");
        } else {
          Sequence fake{missing, 20, {}};
          const v1::DecideRequest request = ValidDecide(fake, 0);
          v1::DecideResponse response;
          (void)Expect(Call("Decide", &v1::CacheManager::Stub::Decide, request, &response,
                            "unknown_sequence"),
                       {StatusCode::NOT_FOUND}, "Decide on an unknown sequence");
        }
      });
      return;
    }
    case 3: {  // duplicates
      Sequence* sequence = PrivateSequence();
      if (sequence == nullptr) return;
      if (Chance(50)) {
        v1::OpenSequenceRequest request;
        request.set_model_id(private_.id);
        request.set_sequence_id(sequence->id);
        request.set_initial_tokens(5);
        Unchanged("a duplicate OpenSequence", [&] {
          v1::OpenSequenceResponse response;
          (void)Expect(Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request,
                            &response, "duplicate"),
                       {StatusCode::ALREADY_EXISTS}, "OpenSequence of an open id");
        });
      } else {
        v1::RegisterModelRequest request;
        request.set_model_id(shared_group_.id);
        v1::ModelGeometry* g = request.mutable_geometry();
        g->set_layers(1);
        g->set_query_heads(2);
        g->set_kv_groups(1);
        g->set_head_dim(4);
        g->set_page_size(16);
        g->set_element_bytes(2);
        request.set_capacity_bytes(1 << 16);
        v1::RegisterModelResponse response;
        (void)Expect(Call("RegisterModel", &v1::CacheManager::Stub::RegisterModel, request,
                          &response, "duplicate"),
                     {StatusCode::ALREADY_EXISTS}, "RegisterModel of a registered id");
      }
      return;
    }
    case 4: {  // token counts out of range
      Sequence* sequence = PrivateSequence();
      if (sequence == nullptr) return;
      static constexpr int64_t kBad[] = {0,
                                         -1,
                                         -5,
                                         int64_t{1} << 31,
                                         int64_t{1} << 40,
                                         std::numeric_limits<int64_t>::max(),
                                         std::numeric_limits<int64_t>::min()};
      const int64_t tokens = kBad[Uniform(0, 6)];
      Unchanged("an out-of-range token count", [&] {
        if (Chance(50) && tokens != 0) {
          v1::OpenSequenceRequest request;
          request.set_model_id(private_.id);
          request.set_sequence_id(NewSequenceId());
          request.set_initial_tokens(tokens);
          v1::OpenSequenceResponse response;
          (void)Expect(Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request,
                            &response, "token_range"),
                       {kInvalid}, absl::StrCat("OpenSequence initial_tokens=", tokens));
        } else {
          v1::AppendTokensRequest request;
          request.set_model_id(private_.id);
          request.set_sequence_id(sequence->id);
          request.set_tokens(tokens);
          v1::AppendTokensResponse response;
          (void)Expect(Call("AppendTokens", &v1::CacheManager::Stub::AppendTokens, request,
                            &response, "token_range"),
                       {kInvalid}, absl::StrCat("AppendTokens tokens=", tokens));
        }
      });
      return;
    }
    case 5: {  // forks out of range
      Sequence* sequence = PrivateSequence();
      if (sequence == nullptr) return;
      const int64_t variant = Uniform(0, 3);
      v1::OpenSequenceRequest request;
      request.set_model_id(private_.id);
      request.set_sequence_id(NewSequenceId());
      StatusCode code = kInvalid;
      if (variant == 0) {
        request.set_prefix_pages(1);  // without a parent
      } else if (variant == 1) {
        request.set_parent_sequence_id(sequence->id);
        request.set_prefix_pages(-1);
      } else if (variant == 2) {
        request.set_parent_sequence_id(absl::StrCat(tag_, "-no-such-parent"));
        code = StatusCode::NOT_FOUND;
      } else {
        request.set_parent_sequence_id(sequence->id);
        request.set_prefix_pages(Pages(sequence->length, private_.shape.page_size) + 1 +
                                 Uniform(0, int64_t{1} << 40));
        code = StatusCode::OUT_OF_RANGE;
      }
      Unchanged("a bad fork", [&] {
        v1::OpenSequenceResponse response;
        (void)Expect(Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request, &response,
                          "fork_range"),
                     {code}, absl::StrCat("a bad fork, variant ", variant));
      });
      return;
    }
    case 6:
    case 7: {  // budgets: missing, out of range, overflowing (issue 12 #6)
      Sequence* sequence = PrivateSequence();
      if (sequence == nullptr) return;
      v1::DecideRequest request = ValidDecide(*sequence, 0);
      v1::Budget* budget = request.mutable_budget();
      const int64_t variant = Uniform(0, 9);
      switch (variant) {
        case 0:
          request.clear_budget();
          break;
        case 1:
          budget->set_pages_per_group(0);
          break;
        case 2:
          budget->set_pages_per_group(-3);
          break;
        case 3:
          budget->set_fraction(1.5);
          break;
        case 4:
          budget->set_fraction(std::nan(""));
          break;
        case 5:
          budget->set_fraction(0);
          break;
        case 6:
          budget->set_token_slots(0);
          break;
        case 7:
          budget->set_token_slots(std::numeric_limits<int64_t>::max());
          break;
        case 8:
          budget->set_token_slots(std::numeric_limits<int64_t>::min());
          break;
        default:
          budget->set_fraction(0.5);
          budget->set_allocator("zigzag");
          break;
      }
      // The library's answer: INVALID_ARGUMENT for all of these, but an overflowing one must
      // be refused by the same range check on both sides, not by luck.
      const StatusCode code =
          static_cast<StatusCode>(service::ResolveBudget(request.budget(), request.has_budget(),
                                                         ToCore(private_.shape), sequence->length)
                                      .status()
                                      .code());
      Check(code == kInvalid, absl::StrCat("the library accepts bad budget variant ", variant));
      Unchanged("a bad budget", [&] {
        v1::DecideResponse response;
        (void)Expect(Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, "budget"),
                     {code}, absl::StrCat("Decide with bad budget variant ", variant));
      });
      return;
    }
    case 8: {  // policy parameters out of range
      Sequence* sequence = PrivateSequence();
      if (sequence == nullptr) return;
      v1::DecideRequest request = ValidDecide(*sequence, 0);
      v1::PolicyParams* policy = request.mutable_policy();
      const int64_t variant = Uniform(0, 9);
      const double nan = std::nan("");
      switch (variant) {
        case 0:
          policy->set_name("lru");
          break;
        case 1:
          policy->set_tau(0);
          break;
        case 2:
          policy->set_tau(-1);
          break;
        case 3:
          policy->set_tau(std::numeric_limits<double>::infinity());
          break;
        case 4:
          policy->set_tau(nan);
          break;
        case 5:
          policy->set_alpha(0);
          break;
        case 6:
          policy->set_alpha(nan);
          break;
        case 7:
          policy->set_sink_tokens(-1);
          break;
        case 8:
          policy->set_protect_recent_pages(-1);
          break;
        default:
          policy->set_scope(static_cast<v1::SelectionScope>(7));
          break;
      }
      Unchanged("a bad policy", [&] {
        v1::DecideResponse response;
        (void)Expect(Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, "policy"),
                     {kInvalid}, absl::StrCat("Decide with bad policy variant ", variant));
      });
      return;
    }
    case 9: {  // huge echoes (issue 12 #9)
      // 1 MB, or half the daemon's message limit when that is smaller.
      const std::string huge(
          static_cast<size_t>(std::min<int64_t>(1 << 20, context_->options->max_message_bytes / 2)),
          'x');
      grpc::Status status;
      if (Chance(50)) {
        Sequence* sequence = PrivateSequence();
        if (sequence == nullptr) return;
        v1::DecideRequest request = ValidDecide(*sequence, 0);
        request.mutable_policy()->set_name(huge);
        v1::DecideResponse response;
        status = Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, "huge_echo");
      } else {
        v1::GetModelRequest request;
        request.set_model_id(huge);
        v1::GetModelResponse response;
        status =
            Call("GetModel", &v1::CacheManager::Stub::GetModel, request, &response, "huge_echo");
      }
      if (Expect(status, {kInvalid}, "a 1 MB name")) {
        Check(status.error_message().size() <= 2048,
              absl::StrCat("a 1 MB name echoed in ", status.error_message().size(), " characters"));
      }
      return;
    }
    case 10: {  // extreme but valid protections (issue 12 #5, #6): the core's answer
      Sequence* sequence = PrivateSequence();
      if (sequence == nullptr) return;
      Tables tables;
      if (!ReadTables(private_, sequence->id, &tables)) return;
      const int layer = static_cast<int>(Uniform(0, private_.shape.layers - 1));
      v1::DecideRequest request = ValidDecide(*sequence, layer);
      v1::PolicyParams params = RandomPolicy();
      if (Chance(50)) {
        params.set_protect_recent_pages(std::numeric_limits<int32_t>::max());
      } else {
        params.set_sink_tokens(std::numeric_limits<int32_t>::max());
        params.set_protect_sink_pages(true);
      }
      *request.mutable_policy() = params;
      v1::DecideResponse response;
      const grpc::Status status =
          Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, "extreme_protection");
      if (Expect(status, {StatusCode::OK}, "Decide with extreme protections") &&
          response.layers_size() == 1) {
        CheckDecision(private_, *sequence, params, request.budget(), false, v1::DTYPE_BFLOAT16,
                      request.layers(0).statistic().data(), layer, response.layers(0), &tables);
      }
      return;
    }
    case 11: {  // statistic shape and values
      Sequence* sequence = PrivateSequence();
      if (sequence == nullptr) return;
      v1::DecideRequest request = ValidDecide(*sequence, 0);
      v1::Statistic* stat = request.mutable_layers(0)->mutable_statistic();
      const int64_t variant = Uniform(0, 9);
      StatusCode code = kInvalid;
      switch (variant) {
        case 0:
          stat->set_dtype(v1::DTYPE_UNSPECIFIED);
          break;
        case 1:
          stat->set_dtype(static_cast<v1::DType>(9));
          break;
        case 2:
          stat->set_query_heads(stat->query_heads() + 1);
          break;
        case 3:
          stat->set_tokens(0);
          break;
        case 4:
          stat->set_tokens(sequence->length + 1);
          stat->set_data(RandomStatistic(private_.shape, sequence->length + 1, v1::DTYPE_BFLOAT16));
          code = StatusCode::FAILED_PRECONDITION;
          break;
        case 5:
          stat->mutable_data()->pop_back();
          break;
        case 6:
          request.mutable_layers(0)->clear_statistic();
          break;
        default: {  // a NaN, an infinity or a negative value in the middle
          static constexpr uint16_t kPoison[] = {0x7FC0, 0x7F80, 0xBF80};  // bf16
          const uint16_t bits = kPoison[variant - 7];
          const size_t at = static_cast<size_t>(Uniform(0, stat->data().size() / 2 - 1)) * 2;
          std::memcpy(&(*stat->mutable_data())[at], &bits, 2);
          break;
        }
      }
      Unchanged("a bad statistic", [&] {
        v1::DecideResponse response;
        (void)Expect(
            Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, "statistic"),
            {code}, absl::StrCat("Decide with bad statistic variant ", variant));
      });
      return;
    }
    case 12: {  // layers out of range, repeated, none
      Sequence* sequence = PrivateSequence();
      if (sequence == nullptr) return;
      v1::DecideRequest request = ValidDecide(*sequence, 0);
      const int64_t variant = Uniform(0, 3);
      if (variant == 0) request.mutable_layers(0)->set_layer(-1);
      if (variant == 1) request.mutable_layers(0)->set_layer(private_.shape.layers);
      if (variant == 2) *request.add_layers() = request.layers(0);
      if (variant == 3) request.clear_layers();
      Unchanged("bad layers", [&] {
        v1::DecideResponse response;
        (void)Expect(Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, "layers"),
                     {kInvalid}, absl::StrCat("Decide with bad layers variant ", variant));
      });
      return;
    }
    case 13: {  // decode-time weights that were never cached
      Sequence* sequence = nullptr;
      int layer = -1;
      for (Sequence& candidate : private_.sequences) {
        for (int l = 0; l < private_.shape.layers && candidate.length >= 1; ++l) {
          if (!candidate.cached_weights.contains(l)) {
            sequence = &candidate;
            layer = l;
          }
        }
      }
      if (sequence == nullptr) return;
      v1::DecideRequest request = ValidDecide(*sequence, layer);
      request.set_use_cached_weights(true);
      Unchanged("use_cached_weights without weights", [&] {
        v1::DecideResponse response;
        (void)Expect(Call("Decide", &v1::CacheManager::Stub::Decide, request, &response,
                          "no_cached_weights"),
                     {StatusCode::FAILED_PRECONDITION}, "use_cached_weights with none cached");
      });
      return;
    }
    case 14:
    case 15:
    case 16:
      BadShm(static_cast<int>(Uniform(0, 7)));
      return;
    case 17:
      BadGarbageUnary();
      return;
    case 18:
      BadGarbageStream();
      return;
    case 19:
      BadDeadline();
      return;
    case 20:
      BadRegister(static_cast<int>(Uniform(0, 8)));
      return;
    default: {  // UnregisterModel refused; replies too large; pool full (issue 12 #3, #4, #7)
      const int64_t variant = Uniform(0, 3);
      if (variant == 0) {
        if (PrivateSequence() == nullptr) return;
        v1::UnregisterModelRequest request;
        request.set_model_id(private_.id);
        Unchanged("UnregisterModel with open sequences", [&] {
          v1::UnregisterModelResponse response;
          (void)Expect(Call("UnregisterModel", &v1::CacheManager::Stub::UnregisterModel, request,
                            &response, "unregister_busy"),
                       {StatusCode::FAILED_PRECONDITION}, "UnregisterModel with open sequences");
        });
      } else if (variant == 1) {
        v1::UnregisterModelRequest request;
        request.set_model_id(absl::StrCat(tag_, "-no-such-model"));
        v1::UnregisterModelResponse response;
        (void)Expect(Call("UnregisterModel", &v1::CacheManager::Stub::UnregisterModel, request,
                          &response, "unregister_unknown"),
                     {StatusCode::NOT_FOUND}, "UnregisterModel of an unknown model");
      } else {
        if (static_cast<int>(private_.sequences.size()) >= kMaxSequencesPerModel) return;
        const int64_t units = int64_t{private_.shape.layers} * private_.shape.kv_groups;
        // variant 2: more frames than the pool has (the reply would fit); 3: a reply beyond
        // --max_message_bytes (checked before anything is allocated).
        const int64_t pages = variant == 2 ? private_.capacity_frames / units + 1
                                           : context_->options->max_message_bytes / units + 1;
        const int64_t tokens = pages * private_.shape.page_size;
        if (tokens > (int64_t{1} << 31) - 1) return;
        v1::OpenSequenceRequest request;
        request.set_model_id(private_.id);
        request.set_sequence_id(NewSequenceId());
        request.set_initial_tokens(tokens);
        Unchanged(variant == 2 ? "an OpenSequence beyond the pool" : "an oversized reply", [&] {
          v1::OpenSequenceResponse response;
          const grpc::Status status =
              Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request, &response,
                   variant == 2 ? "pool_full" : "reply_too_large");
          if (Expect(status, {StatusCode::RESOURCE_EXHAUSTED},
                     absl::StrCat("OpenSequence of ", tokens, " tokens")) &&
              variant == 3) {
            Check(status.error_message().find("max_message_bytes") != std::string::npos,
                  "an oversized reply refused for another reason: " + status.error_message());
          }
        });
        // Nothing was left behind: the id is free.
        v1::CloseSequenceRequest close;
        close.set_model_id(private_.id);
        close.set_sequence_id(request.sequence_id());
        v1::CloseSequenceResponse closed;
        (void)Expect(Call("CloseSequence", &v1::CacheManager::Stub::CloseSequence, close, &closed,
                          "refused_open_left_nothing"),
                     {StatusCode::NOT_FOUND}, "CloseSequence of a refused OpenSequence");
      }
      return;
    }
  }
}

void Worker::BadShm(int variant) {
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  v1::DecideRequest request = ValidDecide(*sequence, 0);
  v1::Statistic* stat = request.mutable_layers(0)->mutable_statistic();
  const uint64_t length = stat->data().size();
  v1::SharedMemoryRegion* region = stat->mutable_shared_memory();  // clears data
  region->set_segment(segment_);
  region->set_length_bytes(length);
  StatusCode code = StatusCode::INVALID_ARGUMENT;
  const char* name = "shm";
  switch (variant) {
    case 0:  // names the daemon never maps
      static const std::string kNames[] = {"", "/other", "/entrokv/x", "entrokv-x",
                                           "/entrokv" + std::string(300, 'a')};
      region->set_segment(kNames[Uniform(0, 4)]);
      name = "shm_name";
      break;
    case 1:
      region->set_segment(absl::StrCat("/entrokv-", tag_, "-missing"));
      code = StatusCode::NOT_FOUND;
      name = "shm_missing";
      break;
    case 2:  // a segment shorter than the region (issue 12 #1)
      region->set_segment(short_segment_);
      name = "shm_truncated";
      break;
    case 3:  // a FIFO: refused without blocking (issue 12 #2)
      region->set_segment(fifo_path_.substr(std::string("/dev/shm").size()));
      name = "shm_fifo";
      break;
    case 4:
      region->set_segment(dir_path_.substr(std::string("/dev/shm").size()));
      name = "shm_directory";
      break;
    case 5:
      region->set_offset_bytes(1);  // not element-aligned (bf16)
      name = "shm_misaligned";
      break;
    case 6:
      region->set_length_bytes(length + 2);
      name = "shm_length";
      break;
    default:  // a pool arena as the statistic (issue 12 #10)
      region->set_segment(private_.arena_name);
      code = StatusCode::PERMISSION_DENIED;
      name = "shm_arena";
      break;
  }
  Unchanged(name, [&] {
    v1::DecideResponse response;
    (void)Expect(Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, name), {code},
                 absl::StrCat("Decide with ", name, " '", Cut(region->segment()), "'"));
  });
}

void Worker::BadGarbageUnary() {
  // Payloads no message parses: a truncated length-delimited field, a bad wire type, an
  // over-long varint, and a string field that is not UTF-8.
  static const std::string kPayloads[] = {std::string("\x0a\x05\x61\x62", 4), std::string("\x0f"),
                                          std::string(11, '\xff'),
                                          std::string("\x0a\x02\xc3\x28", 4)};
  static constexpr const char* kMethods[] = {"RegisterModel", "GetModel",      "OpenSequence",
                                             "AppendTokens",  "Decide",        "CloseSequence",
                                             "GetPoolStats",  "ListSequences", "UnregisterModel"};
  const std::string method = kMethods[Uniform(0, std::size(kMethods) - 1)];
  const std::string& payload = kPayloads[Uniform(0, std::size(kPayloads) - 1)];
  grpc::GenericStub stub(channel_);
  grpc::ClientContext context;
  PrepareCall(&context, *context_->options,
              std::chrono::milliseconds(context_->options->call_timeout_ms));
  grpc::Slice slice(payload);
  grpc::ByteBuffer in(&slice, 1);
  grpc::ByteBuffer out;
  grpc::Status result;
  absl::Notification done;
  const auto start = Clock::now();
  stub.UnaryCall(&context, "/entrokv.v1.CacheManager/" + method, grpc::StubOptions(), &in, &out,
                 [&](grpc::Status status) {
                   result = std::move(status);
                   done.Notify();
                 });
  done.WaitForNotification();
  CountCall(method.c_str(), std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
            "garbage_unary");
  (void)Expect(result, {StatusCode::INVALID_ARGUMENT}, "unparsable " + method + " request");
}

void Worker::BadGarbageStream() {
  // One good layer, then a message that does not parse: the first decision comes back, then the
  // stream ends INVALID_ARGUMENT (issue 12 #9).
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  Tables tables;
  if (!ReadTables(private_, sequence->id, &tables)) return;
  const int layer = static_cast<int>(Uniform(0, private_.shape.layers - 1));
  const v1::DecideRequest valid = ValidDecide(*sequence, layer);
  v1::DecideLayerRequest good;
  good.set_model_id(valid.model_id());
  good.set_sequence_id(valid.sequence_id());
  *good.mutable_layer() = valid.layers(0);
  *good.mutable_budget() = valid.budget();
  v1::PolicyParams params = RandomPolicy();
  *good.mutable_policy() = params;
  v1::DecideLayerRequest bad = good;
  bad.set_model_id("\xc3\x28");  // not UTF-8: the daemon cannot parse the message
  grpc::ClientContext context;
  PrepareCall(&context, *context_->options,
              std::chrono::milliseconds(context_->options->call_timeout_ms));
  auto rw = stub_->DecideStream(&context);
  v1::LayerDecision decision;
  auto start = Clock::now();
  const bool first = rw->Write(good) && rw->Read(&decision);
  CountCall("DecideStream", std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
            nullptr);
  if (first) {
    CheckDecision(private_, *sequence, params, good.budget(), false, v1::DTYPE_BFLOAT16,
                  good.layer().statistic().data(), layer, decision, &tables);
  }
  start = Clock::now();
  (void)rw->Write(bad);
  (void)rw->WritesDone();
  while (rw->Read(&decision)) {
  }
  const grpc::Status status = rw->Finish();
  CountCall("DecideStream", std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
            "garbage_stream");
  if (!first) {
    (void)Expect(status, {StatusCode::OK}, "DecideStream's first (good) message");
    return;
  }
  if (Expect(status, {StatusCode::INVALID_ARGUMENT}, "DecideStream with an unparsable message")) {
    Check(status.error_message().find("message 1") != std::string::npos,
          "unparsable stream message not named: " + status.error_message());
  }
}

void Worker::BadDeadline() {
  // A decision over every layer of the deep sequence (8192 tokens, 32 heads) with a deadline of
  // a few milliseconds: it expires while the daemon scores (issue 12 #5). Keeping every page
  // changes nothing whether or not it completes, so a completed one is checked exactly.
  if (deep_sequence_.empty()) return;
  v1::DecideRequest request;
  request.set_model_id(context_->deep_model);
  request.set_sequence_id(deep_sequence_);
  const int64_t pages = Pages(deep_tokens_, deep_shape_.page_size);
  request.mutable_budget()->set_pages_per_group(pages);
  request.mutable_policy()->set_name(Chance(50) ? "page_entrokv" : "snapkv");
  const int64_t layer_bytes = int64_t{deep_shape_.query_heads} * deep_tokens_ * 2;
  for (int l = 0; l < deep_shape_.layers; ++l) {
    v1::LayerStatistic* input = request.add_layers();
    input->set_layer(l);
    v1::Statistic* stat = input->mutable_statistic();
    stat->set_dtype(v1::DTYPE_BFLOAT16);
    stat->set_query_heads(deep_shape_.query_heads);
    stat->set_tokens(deep_tokens_);
    v1::SharedMemoryRegion* region = stat->mutable_shared_memory();
    region->set_segment(segment_);
    region->set_offset_bytes(static_cast<uint64_t>(kSlots * kSlotBytes + l * layer_bytes));
    region->set_length_bytes(static_cast<uint64_t>(layer_bytes));
  }
  static constexpr int kDeadlinesMs[] = {1, 2, 4, 8, 16};
  v1::DecideResponse response;
  const grpc::Status status =
      Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, "deadline",
           kDeadlinesMs[Uniform(0, std::size(kDeadlinesMs) - 1)]);
  if (!Expect(status, {StatusCode::OK, StatusCode::DEADLINE_EXCEEDED},
              "a deep Decide with a short deadline") ||
      !status.ok()) {
    return;
  }
  bool all_kept = response.layers_size() == deep_shape_.layers;
  for (const v1::LayerDecision& layer : response.layers()) {
    for (const v1::GroupDecision& group : layer.groups()) {
      all_kept &= group.kept_pages_size() == pages && group.evicted_pages_size() == 0;
    }
    all_kept &= layer.groups_size() == deep_shape_.kv_groups && layer.freed_frames_size() == 0;
  }
  Check(all_kept, "a deep Decide keeping every page evicted some");
}

void Worker::BadRegister(int variant) {
  v1::RegisterModelRequest request;
  request.set_model_id(absl::StrCat(tag_, "-bad-model"));
  v1::ModelGeometry* g = request.mutable_geometry();
  g->set_layers(2);
  g->set_query_heads(4);
  g->set_kv_groups(2);
  g->set_head_dim(4);
  g->set_page_size(16);
  g->set_element_bytes(2);
  request.set_capacity_bytes(1 << 20);
  StatusCode code = StatusCode::INVALID_ARGUMENT;
  switch (variant) {
    case 0:
      request.clear_geometry();
      break;
    case 1:
      g->set_layers(0);
      break;
    case 2:
      g->set_layers(5000);
      break;  // issue 12 #4: bookkeeping bounded
    case 3:
      g->set_query_heads(5);
      break;
    case 4:
      request.set_frame_layout(static_cast<v1::FrameLayout>(9));
      break;
    case 5:
      request.set_backend(static_cast<v1::Backend>(9));
      break;
    case 6:
      request.set_capacity_bytes(std::numeric_limits<uint64_t>::max());
      break;
    case 7:  // tiny frames in a huge arena: more frames than --max_pool_frames
      g->set_head_dim(1);
      g->set_element_bytes(1);
      request.set_capacity_bytes(uint64_t{1} << 62);
      code = StatusCode::RESOURCE_EXHAUSTED;
      break;
    default:
      request.set_model_id("bad model id");
      break;
  }
  v1::RegisterModelResponse response;
  (void)Expect(
      Call("RegisterModel", &v1::CacheManager::Stub::RegisterModel, request, &response, "register"),
      {code}, absl::StrCat("RegisterModel variant ", variant));
  // Nothing was registered.
  v1::GetModelRequest get;
  get.set_model_id(absl::StrCat(tag_, "-bad-model"));
  v1::GetModelResponse got;
  (void)Expect(Call("GetModel", &v1::CacheManager::Stub::GetModel, get, &got),
               {StatusCode::NOT_FOUND}, "GetModel of a refused registration");
}

}  // namespace entrokv::bench
