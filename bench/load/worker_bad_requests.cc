// The bad requests of a load-generator worker (see load_generator.h). BadRequest's table lists
// every case: a name, its share of the draws, and the function that sends it. Each function
// builds its request (most from a valid one, spoiled in one place), states the code and the
// field the daemon must answer with, and, on the private model, checks that nothing changed.
// A few send extreme but valid values and check the answer against the core's.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "bench/load/worker.h"
#include "bench/load/worker_internal.h"
#include "core/util/page_count.h"
#include "grpcpp/generic/generic_stub.h"
#include "wire/resolve.h"

namespace entrokv::bench {

using Clock = std::chrono::steady_clock;
using grpc::StatusCode;
using worker_internal::Cut;
using worker_internal::kMaxSequencesPerModel;
using worker_internal::kSlotBytes;
using worker_internal::kSlots;

namespace {

// Overwrites element `index` of a bf16 statistic with `bits`.
void PoisonBf16(int64_t index, uint16_t bits, v1::Statistic& statistic) {
  std::memcpy(&(*statistic.mutable_data())[static_cast<size_t>(index) * 2], &bits, 2);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The table of cases

void Worker::BadRequest() {
  struct Case {
    const char* name;
    int weight;  // share of the draws
    void (Worker::*send)();
  };
  static constexpr Case kCases[] = {
      {"a malformed sequence id", 1, &Worker::BadId},
      {"an unknown model", 1, &Worker::BadUnknownModel},
      {"an unknown sequence", 1, &Worker::BadUnknownSequence},
      {"a duplicate sequence or model", 1, &Worker::BadDuplicate},
      {"a token count out of range", 1, &Worker::BadTokenCount},
      {"a fork out of range", 1, &Worker::BadFork},
      {"a bad budget", 2, &Worker::BadBudget},
      {"bad policy parameters", 1, &Worker::BadPolicy},
      {"a huge name to echo", 1, &Worker::BadHugeEcho},
      {"extreme but valid protections", 1, &Worker::ExtremeProtections},
      {"a bad statistic", 1, &Worker::BadStatistic},
      {"bad layers", 1, &Worker::BadLayers},
      {"cached weights that were never cached", 1, &Worker::BadNoCachedWeights},
      {"a truncation out of range", 1, &Worker::BadTruncate},
      {"a chunk that is not column sums", 1, &Worker::BadChunk},
      {"a bad shared-memory statistic", 3, &Worker::BadShm},
      {"an unparsable unary message", 1, &Worker::BadGarbageUnary},
      {"an unparsable stream message", 1, &Worker::BadGarbageStream},
      {"a deadline that expires while scoring", 1, &Worker::BadDeadline},
      {"a bad registration", 1, &Worker::BadRegister},
      {"a pool limit", 1, &Worker::BadPoolLimits},
  };
  static constexpr int kTotal =
      std::accumulate(std::begin(kCases), std::end(kCases), 0,
                      [](int sum, const Case& c) { return sum + c.weight; });
  int64_t draw = Uniform(0, kTotal - 1);
  for (const Case& bad : kCases) {
    if (draw < bad.weight) {
      (this->*bad.send)();
      return;
    }
    draw -= bad.weight;
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers

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

Worker::BudgetChoice Worker::ValidBudget() const {
  constexpr int64_t kPagesPerGroup = 4;
  BudgetChoice choice;
  choice.budget.set_pages_per_group(kPagesPerGroup);
  choice.quotas = std::vector<int64_t>(static_cast<size_t>(private_.shape.layers), kPagesPerGroup);
  return choice;
}

v1::DecideRequest Worker::ValidDecide(const Sequence& sequence, int layer) {
  v1::DecideRequest request;
  request.set_model_id(private_.id);
  request.set_sequence_id(sequence.id);
  *request.mutable_budget() = ValidBudget().budget;
  request.mutable_policy()->set_name("page_entrokv");
  v1::LayerStatistic* input = request.add_layers();
  input->set_layer(layer);
  v1::Statistic* stat = input->mutable_statistic();
  stat->set_dtype(v1::DTYPE_BFLOAT16);
  stat->set_query_heads(private_.shape.query_heads);
  stat->set_tokens(sequence.length);
  stat->set_data(RandomStatistic(private_.shape, sequence.length, DType::kBFloat16));
  return request;
}

void Worker::DecideRefused(const v1::DecideRequest& request, const Refusal& refusal,
                           const char* bad_case, const std::string& what) {
  Unchanged(what.c_str(), [&] {
    v1::DecideResponse response;
    (void)ExpectRefusal(
        Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, bad_case), refusal,
        "Decide with " + what);
  });
}

// ---------------------------------------------------------------------------------------------
// Ids, models and sequences

void Worker::BadId() {
  static const std::string kIds[] = {"", std::string(129, 'a'), "a b", "s\xc3\xbc", "x;y"};
  v1::OpenSequenceRequest request;
  request.set_model_id(private_.id);
  request.set_sequence_id(kIds[Uniform(0, 4)]);
  request.set_initial_tokens(16);
  Unchanged("a malformed sequence_id", [&] {
    v1::OpenSequenceResponse response;
    (void)ExpectRefusal(
        Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request, &response, "bad_id"),
        {StatusCode::INVALID_ARGUMENT, "sequence_id"}, "OpenSequence with a malformed id");
  });
}

void Worker::BadUnknownModel() {
  const std::string missing = absl::StrCat(tag_, "-no-such-model");
  const Refusal refusal{StatusCode::NOT_FOUND, "model_id"};
  if (Chance(50)) {
    v1::GetPoolStatsRequest request;
    request.set_model_id(missing);
    v1::PoolStats response;
    (void)ExpectRefusal(Call("GetPoolStats", &v1::CacheManager::Stub::GetPoolStats, request,
                             &response, "unknown_model"),
                        refusal, "GetPoolStats of an unknown model");
  } else {
    v1::OpenSequenceRequest request;
    request.set_model_id(missing);
    request.set_sequence_id(NewSequenceId());
    v1::OpenSequenceResponse response;
    (void)ExpectRefusal(Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request,
                             &response, "unknown_model"),
                        refusal, "OpenSequence on an unknown model");
  }
}

void Worker::BadUnknownSequence() {
  const std::string missing = absl::StrCat(tag_, "-no-such-sequence");
  const Refusal refusal{StatusCode::NOT_FOUND, nullptr};  // the pool's message names the id
  Unchanged("an unknown sequence", [&] {
    if (Chance(50)) {
      v1::AppendTokensRequest request;
      request.set_model_id(private_.id);
      request.set_sequence_id(missing);
      request.set_tokens(3);
      v1::AppendTokensResponse response;
      (void)ExpectRefusal(Call("AppendTokens", &v1::CacheManager::Stub::AppendTokens, request,
                               &response, "unknown_sequence"),
                          refusal, "AppendTokens to an unknown sequence");
    } else {
      Sequence fake{missing, 20, {}};
      const v1::DecideRequest request = ValidDecide(fake, 0);
      v1::DecideResponse response;
      (void)ExpectRefusal(
          Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, "unknown_sequence"),
          refusal, "Decide on an unknown sequence");
    }
  });
}

void Worker::BadDuplicate() {
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  if (Chance(50)) {
    v1::OpenSequenceRequest request;
    request.set_model_id(private_.id);
    request.set_sequence_id(sequence->id);
    request.set_initial_tokens(5);
    Unchanged("a duplicate OpenSequence", [&] {
      v1::OpenSequenceResponse response;
      (void)ExpectRefusal(Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request,
                               &response, "duplicate"),
                          {StatusCode::ALREADY_EXISTS, nullptr}, "OpenSequence of an open id");
    });
    return;
  }
  const v1::RegisterModelRequest request = RegisterRequestFor(
      shared_group_.id, Shape{1, 2, 1, 4, 16, 2, FrameLayout::kGroup}, uint64_t{1} << 16);
  v1::RegisterModelResponse response;
  (void)ExpectRefusal(Call("RegisterModel", &v1::CacheManager::Stub::RegisterModel, request,
                           &response, "duplicate"),
                      {StatusCode::ALREADY_EXISTS, "model_id"}, "RegisterModel of a registered id");
}

void Worker::BadTokenCount() {
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
    if (Chance(50) && tokens != 0) {  // 0 initial tokens is a valid, empty sequence
      v1::OpenSequenceRequest request;
      request.set_model_id(private_.id);
      request.set_sequence_id(NewSequenceId());
      request.set_initial_tokens(tokens);
      v1::OpenSequenceResponse response;
      (void)ExpectRefusal(Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request,
                               &response, "token_range"),
                          {StatusCode::INVALID_ARGUMENT, "initial_tokens"},
                          absl::StrCat("OpenSequence initial_tokens=", tokens));
    } else {
      v1::AppendTokensRequest request;
      request.set_model_id(private_.id);
      request.set_sequence_id(sequence->id);
      request.set_tokens(tokens);
      v1::AppendTokensResponse response;
      (void)ExpectRefusal(Call("AppendTokens", &v1::CacheManager::Stub::AppendTokens, request,
                               &response, "token_range"),
                          {StatusCode::INVALID_ARGUMENT, "tokens"},
                          absl::StrCat("AppendTokens tokens=", tokens));
    }
  });
}

void Worker::BadFork() {
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  struct Variant {
    const char* what;
    Refusal refusal;
    void (*spoil)(Worker&, const Sequence& parent, v1::OpenSequenceRequest&);
  };
  static constexpr Variant kVariants[] = {
      {"prefix_pages without a parent",
       {StatusCode::INVALID_ARGUMENT, "prefix_pages"},
       [](Worker&, const Sequence&, v1::OpenSequenceRequest& r) { r.set_prefix_pages(1); }},
      {"a negative prefix",
       {StatusCode::INVALID_ARGUMENT, "prefix_pages"},
       [](Worker&, const Sequence& parent, v1::OpenSequenceRequest& r) {
         r.set_parent_sequence_id(parent.id);
         r.set_prefix_pages(-1);
       }},
      {"an unknown parent",
       {StatusCode::NOT_FOUND, nullptr},
       [](Worker& w, const Sequence&, v1::OpenSequenceRequest& r) {
         r.set_parent_sequence_id(absl::StrCat(w.tag_, "-no-such-parent"));
       }},
      {"a prefix beyond the parent",
       {StatusCode::OUT_OF_RANGE, nullptr},
       [](Worker& w, const Sequence& parent, v1::OpenSequenceRequest& r) {
         r.set_parent_sequence_id(parent.id);
         r.set_prefix_pages(PageCount(parent.length, w.private_.shape.page_size) + 1 +
                            w.Uniform(0, int64_t{1} << 40));
       }},
  };
  const Variant& variant = kVariants[Uniform(0, std::size(kVariants) - 1)];
  v1::OpenSequenceRequest request;
  request.set_model_id(private_.id);
  request.set_sequence_id(NewSequenceId());
  variant.spoil(*this, *sequence, request);
  Unchanged("a bad fork", [&] {
    v1::OpenSequenceResponse response;
    (void)ExpectRefusal(Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request,
                             &response, "fork_range"),
                        variant.refusal, absl::StrCat("a fork with ", variant.what));
  });
}

// ---------------------------------------------------------------------------------------------
// Decisions

void Worker::BadBudget() {
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  // Missing, out of range, overflowing, an unknown allocator: all INVALID_ARGUMENT naming the
  // budget.
  struct Variant {
    const char* what;
    void (*spoil)(v1::DecideRequest&);
  };
  static constexpr Variant kVariants[] = {
      {"no budget", [](v1::DecideRequest& r) { r.clear_budget(); }},
      {"pages_per_group 0",
       [](v1::DecideRequest& r) { r.mutable_budget()->set_pages_per_group(0); }},
      {"pages_per_group -3",
       [](v1::DecideRequest& r) { r.mutable_budget()->set_pages_per_group(-3); }},
      {"fraction 1.5", [](v1::DecideRequest& r) { r.mutable_budget()->set_fraction(1.5); }},
      {"fraction NaN",
       [](v1::DecideRequest& r) { r.mutable_budget()->set_fraction(std::nan("")); }},
      {"fraction 0", [](v1::DecideRequest& r) { r.mutable_budget()->set_fraction(0); }},
      {"token_slots 0", [](v1::DecideRequest& r) { r.mutable_budget()->set_token_slots(0); }},
      {"token_slots INT64_MAX",
       [](v1::DecideRequest& r) {
         r.mutable_budget()->set_token_slots(std::numeric_limits<int64_t>::max());
       }},
      {"token_slots INT64_MIN",
       [](v1::DecideRequest& r) {
         r.mutable_budget()->set_token_slots(std::numeric_limits<int64_t>::min());
       }},
      {"an unknown allocator",
       [](v1::DecideRequest& r) {
         r.mutable_budget()->set_fraction(0.5);
         r.mutable_budget()->set_allocator("zigzag");
       }},
  };
  v1::DecideRequest request = ValidDecide(*sequence, 0);
  const Variant& variant = kVariants[Uniform(0, std::size(kVariants) - 1)];
  variant.spoil(request);
  // The wire library, which clients share with the daemon, refuses it too: an overflowing
  // budget must be refused by the same range check on both sides, not by luck.
  const absl::Status library = wire::ResolveBudget(request.budget(), request.has_budget(),
                                                   private_.shape.geometry(), sequence->length)
                                   .status();
  Check(library.code() == absl::StatusCode::kInvalidArgument,
        absl::StrCat("the wire library accepts a budget with ", variant.what));
  DecideRefused(request, {StatusCode::INVALID_ARGUMENT, "budget"}, "budget",
                absl::StrCat("a budget with ", variant.what));
}

void Worker::BadPolicy() {
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  struct Variant {
    const char* field;  // INVALID_ARGUMENT naming it
    const char* what;
    void (*spoil)(v1::PolicyParams&);
  };
  static constexpr Variant kVariants[] = {
      {"policy.name", "an unknown name", [](v1::PolicyParams& p) { p.set_name("lru"); }},
      {"policy.tau", "tau 0", [](v1::PolicyParams& p) { p.set_tau(0); }},
      {"policy.tau", "tau -1", [](v1::PolicyParams& p) { p.set_tau(-1); }},
      {"policy.tau", "tau inf",
       [](v1::PolicyParams& p) { p.set_tau(std::numeric_limits<double>::infinity()); }},
      {"policy.tau", "tau NaN", [](v1::PolicyParams& p) { p.set_tau(std::nan("")); }},
      {"policy.alpha", "alpha 0", [](v1::PolicyParams& p) { p.set_alpha(0); }},
      {"policy.alpha", "alpha NaN", [](v1::PolicyParams& p) { p.set_alpha(std::nan("")); }},
      {"policy.sink_tokens", "sink_tokens -1", [](v1::PolicyParams& p) { p.set_sink_tokens(-1); }},
      {"policy.protect_recent_pages", "protect_recent_pages -1",
       [](v1::PolicyParams& p) { p.set_protect_recent_pages(-1); }},
      {"policy.scope", "an unknown scope",
       [](v1::PolicyParams& p) { p.set_scope(static_cast<v1::SelectionScope>(7)); }},
  };
  v1::DecideRequest request = ValidDecide(*sequence, 0);
  const Variant& variant = kVariants[Uniform(0, std::size(kVariants) - 1)];
  variant.spoil(*request.mutable_policy());
  DecideRefused(request, {StatusCode::INVALID_ARGUMENT, variant.field}, "policy",
                absl::StrCat("a policy with ", variant.what));
}

void Worker::BadHugeEcho() {
  // 1 MB, or half the daemon's message limit when that is smaller: the refusal may echo at most
  // a bounded part of it.
  const std::string huge(
      static_cast<size_t>(std::min<int64_t>(1 << 20, context_->options->max_message_bytes / 2)),
      'x');
  grpc::Status status;
  Refusal refusal;
  if (Chance(50)) {
    Sequence* sequence = PrivateSequence();
    if (sequence == nullptr) return;
    v1::DecideRequest request = ValidDecide(*sequence, 0);
    request.mutable_policy()->set_name(huge);
    v1::DecideResponse response;
    status = Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, "huge_echo");
    refusal = {StatusCode::INVALID_ARGUMENT, "policy.name"};
  } else {
    v1::GetModelRequest request;
    request.set_model_id(huge);
    v1::GetModelResponse response;
    status = Call("GetModel", &v1::CacheManager::Stub::GetModel, request, &response, "huge_echo");
    refusal = {StatusCode::INVALID_ARGUMENT, "model_id"};
  }
  if (ExpectRefusal(status, refusal, "a 1 MB name")) {
    Check(status.error_message().size() <= 2048,
          absl::StrCat("a 1 MB name echoed in ", status.error_message().size(), " characters"));
  }
}

void Worker::ExtremeProtections() {
  // Valid, and protecting more pages than the quota: the answer is the core's.
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  Tables tables;
  if (!ReadTables(private_, sequence->id, &tables)) return;
  const int layer = static_cast<int>(Uniform(0, private_.shape.layers - 1));
  v1::DecideRequest request = ValidDecide(*sequence, layer);
  PolicyChoice policy = RandomPolicy(private_.shape.page_size);
  if (Chance(50)) {
    policy.options.protections.recent_pages = std::numeric_limits<int32_t>::max();
    policy.params.set_protect_recent_pages(policy.options.protections.recent_pages);
  } else {
    policy.options.sink_tokens = std::numeric_limits<int32_t>::max();
    policy.options.protections.sink_pages = true;
    policy.params.set_sink_tokens(policy.options.sink_tokens);
    policy.params.set_protect_sink_pages(true);
  }
  *request.mutable_policy() = policy.params;
  v1::DecideResponse response;
  const grpc::Status status =
      Call("Decide", &v1::CacheManager::Stub::Decide, request, &response, "extreme_protection");
  if (Expect(status, {StatusCode::OK}, "Decide with extreme protections") &&
      response.layers_size() == 1) {
    CheckDecision(private_, *sequence, policy, ValidBudget(), false, DType::kBFloat16,
                  request.layers(0).statistic().data(), layer, response.layers(0), &tables);
  }
}

void Worker::BadStatistic() {
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  struct Variant {
    const char* what;
    Refusal refusal;
    void (*spoil)(Worker&, const Sequence&, v1::Statistic&);
  };
  static constexpr Variant kVariants[] = {
      {"an unspecified dtype",
       {StatusCode::INVALID_ARGUMENT, "layers[0].statistic.dtype"},
       [](Worker&, const Sequence&, v1::Statistic& s) { s.set_dtype(v1::DTYPE_UNSPECIFIED); }},
      {"an unknown dtype",
       {StatusCode::INVALID_ARGUMENT, "layers[0].statistic.dtype"},
       [](Worker&, const Sequence&, v1::Statistic& s) { s.set_dtype(static_cast<v1::DType>(9)); }},
      {"one head too many",
       {StatusCode::INVALID_ARGUMENT, "layers[0].statistic.query_heads"},
       [](Worker&, const Sequence&, v1::Statistic& s) { s.set_query_heads(s.query_heads() + 1); }},
      {"no tokens",
       {StatusCode::INVALID_ARGUMENT, "layers[0].statistic.tokens"},
       [](Worker&, const Sequence&, v1::Statistic& s) { s.set_tokens(0); }},
      {"one token more than the sequence",
       {StatusCode::FAILED_PRECONDITION, "layers[0].statistic.tokens"},
       [](Worker& w, const Sequence& sequence, v1::Statistic& s) {
         s.set_tokens(sequence.length + 1);
         s.set_data(w.RandomStatistic(w.private_.shape, sequence.length + 1, DType::kBFloat16));
       }},
      {"a byte short",
       {StatusCode::INVALID_ARGUMENT, "layers[0].statistic.data"},
       [](Worker&, const Sequence&, v1::Statistic& s) { s.mutable_data()->pop_back(); }},
      {"no statistic",
       {StatusCode::INVALID_ARGUMENT, "layers[0].statistic"},
       [](Worker&, const Sequence&, v1::Statistic& s) { s.Clear(); }},
      // A NaN, an infinity or a negative value (bf16) at a random element.
      {"a NaN",
       {StatusCode::INVALID_ARGUMENT, "layers[0]"},
       [](Worker& w, const Sequence&, v1::Statistic& s) {
         PoisonBf16(w.Uniform(0, s.data().size() / 2 - 1), 0x7FC0, s);
       }},
      {"an infinity",
       {StatusCode::INVALID_ARGUMENT, "layers[0]"},
       [](Worker& w, const Sequence&, v1::Statistic& s) {
         PoisonBf16(w.Uniform(0, s.data().size() / 2 - 1), 0x7F80, s);
       }},
      {"a negative value",
       {StatusCode::INVALID_ARGUMENT, "layers[0]"},
       [](Worker& w, const Sequence&, v1::Statistic& s) {
         PoisonBf16(w.Uniform(0, s.data().size() / 2 - 1), 0xBF80, s);
       }},
  };
  v1::DecideRequest request = ValidDecide(*sequence, 0);
  const Variant& variant = kVariants[Uniform(0, std::size(kVariants) - 1)];
  variant.spoil(*this, *sequence, *request.mutable_layers(0)->mutable_statistic());
  DecideRefused(request, variant.refusal, "statistic",
                absl::StrCat("a statistic with ", variant.what));
}

void Worker::BadLayers() {
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  struct Variant {
    const char* what;
    const char* field;  // INVALID_ARGUMENT naming it
    void (*spoil)(const Shape&, v1::DecideRequest&);
  };
  static constexpr Variant kVariants[] = {
      {"layer -1", "layers[0].layer",
       [](const Shape&, v1::DecideRequest& r) { r.mutable_layers(0)->set_layer(-1); }},
      {"a layer past the model", "layers[0].layer",
       [](const Shape& s, v1::DecideRequest& r) { r.mutable_layers(0)->set_layer(s.layers); }},
      {"a layer twice", "layers[1].layer",
       [](const Shape&, v1::DecideRequest& r) { *r.add_layers() = r.layers(0); }},
      {"no layers", "layers", [](const Shape&, v1::DecideRequest& r) { r.clear_layers(); }},
  };
  v1::DecideRequest request = ValidDecide(*sequence, 0);
  const Variant& variant = kVariants[Uniform(0, std::size(kVariants) - 1)];
  variant.spoil(private_.shape, request);
  DecideRefused(request, {StatusCode::INVALID_ARGUMENT, variant.field}, "layers", variant.what);
}

void Worker::BadNoCachedWeights() {
  // Decode-time weights for a layer that never had a fresh decision.
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
  DecideRefused(request, {StatusCode::FAILED_PRECONDITION, "use_cached_weights"},
                "no_cached_weights", "use_cached_weights and none cached");
}

void Worker::BadTruncate() {
  // Speculative rollback of nothing, of a negative count, or of more than the sequence holds.
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  const int64_t past = sequence->length + Uniform(1, 1000);
  const int64_t kBad[] = {0, -1, std::numeric_limits<int64_t>::min(), past,
                          std::numeric_limits<int64_t>::max()};
  const int64_t tokens = kBad[Uniform(0, 4)];
  // Outside [1, 2^31 - 1] is a bad count, as for every token count; a good count past the
  // length is OUT_OF_RANGE (the same request is valid on a longer sequence).
  const bool bad_count = tokens < 1 || tokens > std::numeric_limits<int32_t>::max();
  const Refusal refusal = bad_count ? Refusal{StatusCode::INVALID_ARGUMENT, "tokens"}
                                    : Refusal{StatusCode::OUT_OF_RANGE, "tokens"};
  Unchanged("a truncation out of range", [&] {
    v1::TruncateSequenceRequest request;
    request.set_model_id(private_.id);
    request.set_sequence_id(sequence->id);
    request.set_tokens(tokens);
    v1::TruncateSequenceResponse response;
    (void)ExpectRefusal(Call("TruncateSequence", &v1::CacheManager::Stub::TruncateSequence, request,
                             &response, "truncate_range"),
                        refusal, absl::StrCat("TruncateSequence tokens=", tokens));
  });
}

void Worker::BadChunk() {
  // A chunk of a chunked prefill must be ACCUMULATED column sums: a last row, or no statistic,
  // added to the running sum is refused.
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  v1::DecideRequest request = ValidDecide(*sequence, 0);
  request.mutable_layers(0)->set_accumulate(true);
  if (Chance(50)) {
    request.mutable_layers(0)->mutable_statistic()->set_kind(v1::STATISTIC_KIND_LAST_ROW);
  } else {
    request.mutable_layers(0)->clear_statistic();
  }
  DecideRefused(request, {StatusCode::INVALID_ARGUMENT, "layers[0].accumulate"}, "bad_chunk",
                "accumulate without column sums");
}

void Worker::BadShm() {
  struct Variant {
    const char* name;  // the case's name in the tally
    Refusal refusal;
    void (*spoil)(Worker&, v1::SharedMemoryRegion&);
  };
  static constexpr const char* kSegment = "layers[0].statistic.shared_memory.segment";
  static constexpr Variant kVariants[] = {
      // Names the daemon never maps.
      {"shm_name",
       {StatusCode::INVALID_ARGUMENT, kSegment},
       [](Worker& w, v1::SharedMemoryRegion& r) {
         static const std::string kNames[] = {"", "/other", "/entrokv/x", "entrokv-x",
                                              "/entrokv" + std::string(300, 'a')};
         r.set_segment(kNames[w.Uniform(0, 4)]);
       }},
      {"shm_missing",
       {StatusCode::NOT_FOUND, kSegment},
       [](Worker& w, v1::SharedMemoryRegion& r) {
         r.set_segment(absl::StrCat("/entrokv-", w.tag_, "-missing"));
       }},
      // A segment shorter than the region.
      {"shm_truncated",
       {StatusCode::INVALID_ARGUMENT, "layers[0].statistic.shared_memory"},
       [](Worker& w, v1::SharedMemoryRegion& r) { r.set_segment(w.short_segment_); }},
      // A FIFO: refused without blocking.
      {"shm_fifo",
       {StatusCode::INVALID_ARGUMENT, kSegment},
       [](Worker& w, v1::SharedMemoryRegion& r) {
         r.set_segment(w.fifo_path_.substr(std::string("/dev/shm").size()));
       }},
      {"shm_directory",
       {StatusCode::INVALID_ARGUMENT, kSegment},
       [](Worker& w, v1::SharedMemoryRegion& r) {
         r.set_segment(w.dir_path_.substr(std::string("/dev/shm").size()));
       }},
      // Not element-aligned (bf16).
      {"shm_misaligned",
       {StatusCode::INVALID_ARGUMENT, "layers[0].statistic.shared_memory.offset_bytes"},
       [](Worker&, v1::SharedMemoryRegion& r) { r.set_offset_bytes(1); }},
      {"shm_length",
       {StatusCode::INVALID_ARGUMENT, "layers[0].statistic.shared_memory.length_bytes"},
       [](Worker&, v1::SharedMemoryRegion& r) { r.set_length_bytes(r.length_bytes() + 2); }},
      // A pool arena as the statistic.
      {"shm_arena",
       {StatusCode::PERMISSION_DENIED, kSegment},
       [](Worker& w, v1::SharedMemoryRegion& r) { r.set_segment(w.private_.arena_name); }},
  };
  const Variant& variant = kVariants[Uniform(0, std::size(kVariants) - 1)];
  Sequence* sequence = PrivateSequence();
  if (sequence == nullptr) return;
  v1::DecideRequest request = ValidDecide(*sequence, 0);
  v1::Statistic* stat = request.mutable_layers(0)->mutable_statistic();
  const uint64_t length = stat->data().size();
  v1::SharedMemoryRegion* region = stat->mutable_shared_memory();  // clears data
  region->set_segment(segment_);
  region->set_length_bytes(length);
  variant.spoil(*this, *region);
  DecideRefused(request, variant.refusal, variant.name,
                absl::StrCat(variant.name, " '", Cut(region->segment()), "'"));
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
  // gRPC's own refusal: no field to name.
  (void)ExpectRefusal(result, {StatusCode::INVALID_ARGUMENT, nullptr},
                      "unparsable " + method + " request");
}

void Worker::BadGarbageStream() {
  // One good layer, then a message that does not parse: the first decision comes back, then the
  // stream ends INVALID_ARGUMENT naming the message.
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
  const PolicyChoice policy = RandomPolicy(private_.shape.page_size);
  *good.mutable_policy() = policy.params;
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
    CheckDecision(private_, *sequence, policy, ValidBudget(), false, DType::kBFloat16,
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
  // a few milliseconds: it expires while the daemon scores. Keeping every page changes nothing
  // whether or not it completes, so a completed one is checked exactly.
  if (deep_sequence_.empty()) return;
  v1::DecideRequest request;
  request.set_model_id(context_->deep_model);
  request.set_sequence_id(deep_sequence_);
  const int64_t pages = PageCount(deep_tokens_, deep_shape_.page_size);
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

// ---------------------------------------------------------------------------------------------
// Registration and pool limits

void Worker::BadRegister() {
  struct Variant {
    const char* what;
    Refusal refusal;
    void (*spoil)(v1::RegisterModelRequest&);
  };
  static constexpr Variant kVariants[] = {
      {"no geometry",
       {StatusCode::INVALID_ARGUMENT, "geometry"},
       [](v1::RegisterModelRequest& r) { r.clear_geometry(); }},
      {"no layers",
       {StatusCode::INVALID_ARGUMENT, "geometry.layers"},
       [](v1::RegisterModelRequest& r) { r.mutable_geometry()->set_layers(0); }},
      // Bookkeeping bounded.
      {"5000 layers",
       {StatusCode::INVALID_ARGUMENT, "geometry.layers"},
       [](v1::RegisterModelRequest& r) { r.mutable_geometry()->set_layers(5000); }},
      {"query heads not a multiple of the groups",
       {StatusCode::INVALID_ARGUMENT, "geometry.query_heads"},
       [](v1::RegisterModelRequest& r) { r.mutable_geometry()->set_query_heads(5); }},
      {"an unknown frame layout",
       {StatusCode::INVALID_ARGUMENT, "frame_layout"},
       [](v1::RegisterModelRequest& r) { r.set_frame_layout(static_cast<v1::FrameLayout>(9)); }},
      {"an unknown backend",
       {StatusCode::INVALID_ARGUMENT, "backend"},
       [](v1::RegisterModelRequest& r) { r.set_backend(static_cast<v1::Backend>(9)); }},
      {"a capacity beyond int64",
       {StatusCode::INVALID_ARGUMENT, "capacity_bytes"},
       [](v1::RegisterModelRequest& r) {
         r.set_capacity_bytes(std::numeric_limits<uint64_t>::max());
       }},
      // Tiny frames in a huge arena: more frames than --max_pool_frames.
      {"more frames than --max_pool_frames",
       {StatusCode::RESOURCE_EXHAUSTED, "capacity_bytes"},
       [](v1::RegisterModelRequest& r) {
         r.mutable_geometry()->set_head_dim(1);
         r.mutable_geometry()->set_element_bytes(1);
         r.set_capacity_bytes(uint64_t{1} << 62);
       }},
      {"a malformed id",
       {StatusCode::INVALID_ARGUMENT, "model_id"},
       [](v1::RegisterModelRequest& r) { r.set_model_id("bad model id"); }},
  };
  const Variant& variant = kVariants[Uniform(0, std::size(kVariants) - 1)];
  const std::string id = absl::StrCat(tag_, "-bad-model");
  v1::RegisterModelRequest request =
      RegisterRequestFor(id, Shape{2, 4, 2, 4, 16, 2, FrameLayout::kGroup}, uint64_t{1} << 20);
  variant.spoil(request);
  v1::RegisterModelResponse response;
  (void)ExpectRefusal(
      Call("RegisterModel", &v1::CacheManager::Stub::RegisterModel, request, &response, "register"),
      variant.refusal, absl::StrCat("RegisterModel with ", variant.what));
  // Nothing was registered.
  v1::GetModelRequest get;
  get.set_model_id(id);
  v1::GetModelResponse got;
  (void)Expect(Call("GetModel", &v1::CacheManager::Stub::GetModel, get, &got),
               {StatusCode::NOT_FOUND}, "GetModel of a refused registration");
}

void Worker::BadPoolLimits() {
  // UnregisterModel refused; a pool too small; a reply too large.
  const int64_t variant = Uniform(0, 3);
  if (variant == 0) {
    if (PrivateSequence() == nullptr) return;
    v1::UnregisterModelRequest request;
    request.set_model_id(private_.id);
    Unchanged("UnregisterModel with open sequences", [&] {
      v1::UnregisterModelResponse response;
      (void)ExpectRefusal(Call("UnregisterModel", &v1::CacheManager::Stub::UnregisterModel, request,
                               &response, "unregister_busy"),
                          {StatusCode::FAILED_PRECONDITION, "force"},
                          "UnregisterModel with open sequences");
    });
    return;
  }
  if (variant == 1) {
    v1::UnregisterModelRequest request;
    request.set_model_id(absl::StrCat(tag_, "-no-such-model"));
    v1::UnregisterModelResponse response;
    (void)ExpectRefusal(Call("UnregisterModel", &v1::CacheManager::Stub::UnregisterModel, request,
                             &response, "unregister_unknown"),
                        {StatusCode::NOT_FOUND, "model_id"}, "UnregisterModel of an unknown model");
    return;
  }
  if (static_cast<int>(private_.sequences.size()) >= kMaxSequencesPerModel) return;
  const int64_t units = int64_t{private_.shape.layers} * private_.shape.kv_groups;
  // variant 2: more frames than the pool has (the reply would fit); 3: a reply beyond
  // --max_message_bytes (checked before anything is allocated).
  const bool pool_full = variant == 2;
  const int64_t pages = pool_full ? private_.capacity_frames / units + 1
                                  : context_->options->max_message_bytes / units + 1;
  const int64_t tokens = pages * private_.shape.page_size;
  if (tokens > (int64_t{1} << 31) - 1) return;
  v1::OpenSequenceRequest request;
  request.set_model_id(private_.id);
  request.set_sequence_id(NewSequenceId());
  request.set_initial_tokens(tokens);
  Unchanged(pool_full ? "an OpenSequence beyond the pool" : "an oversized reply", [&] {
    v1::OpenSequenceResponse response;
    const grpc::Status status = Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request,
                                     &response, pool_full ? "pool_full" : "reply_too_large");
    if (ExpectRefusal(status, {StatusCode::RESOURCE_EXHAUSTED, "initial_tokens"},
                      absl::StrCat("OpenSequence of ", tokens, " tokens")) &&
        !pool_full) {
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

}  // namespace entrokv::bench
