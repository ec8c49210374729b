#include "bench/load/worker.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "bench/load/daemon_probe.h"
#include "core/pool/geometry.h"
#include "core/scoring/decision.h"
#include "core/scoring/fused_scorer.h"
#include "core/util/dtype.h"
#include "grpcpp/generic/generic_stub.h"
#include "service/options.h"
#include "service/validation.h"

namespace entrokv::bench {
namespace {

using Clock = std::chrono::steady_clock;
using grpc::StatusCode;

constexpr int64_t kMaxTokens = 1536;  // ordinary sequences stay below (cheap under ASan)
constexpr int kMaxSequencesPerModel = 4;
constexpr int kSlots = 8;  // statistics one call may reference in the worker's segment
constexpr int64_t kSlotBytes = int64_t{12} * kMaxTokens * 4;  // the largest layer statistic
constexpr uint64_t kPrivateCapacityBytes = uint64_t{4} << 20;
constexpr const char* kPolicies[] = {"page_entrokv",     "raw_entropy", "mean", "max",
                                     "head_independent", "snapkv",      "h2o",  "streaming"};

// The private model: only its worker uses it, so decisions and counters are checked exactly.
constexpr Shape kPrivateShape{3, 8, 2, 4, 16, 2, v1::FRAME_LAYOUT_GROUP};

int64_t Pages(int64_t tokens, int page_size) { return (tokens + page_size - 1) / page_size; }

std::string CodeName(StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int index = static_cast<int>(code);
  return index >= 0 && index < 17 ? kNames[index] : absl::StrCat("code ", index);
}

std::string Cut(const std::string& text) {
  return text.size() <= 300 ? text : absl::StrCat(text.substr(0, 300), "...");
}

DType ToCore(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16:
      return DType::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    default:
      return DType::kFloat32;
  }
}

ModelGeometry ToCore(const Shape& shape) {
  ModelGeometry geometry;
  geometry.layers = shape.layers;
  geometry.query_heads = shape.query_heads;
  geometry.kv_groups = shape.kv_groups;
  geometry.head_dim = shape.head_dim;
  geometry.page_size = shape.page_size;
  geometry.element_bytes = shape.element_bytes;
  return geometry;
}

// Ascending, distinct, in [0, pages).
bool PageList(const google::protobuf::RepeatedField<int32_t>& pages, int64_t count) {
  for (int i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || pages[i] >= count || (i > 0 && pages[i] <= pages[i - 1])) return false;
  }
  return true;
}

// Frames of a reply: inside the pool, on a real (layer, group, page), one (layer, group, page)
// per frame; in the LAYER layout the kv_groups entries of one (layer, page) name the same frame
// (core/pool/sequence.h, AppendResult).
bool FrameList(const google::protobuf::RepeatedPtrField<v1::FrameAssignment>& frames,
               const Shape& shape, int64_t capacity_frames, int64_t first_page, int64_t end_page) {
  std::map<int32_t, std::pair<int32_t, int64_t>> owner;  // frame -> (layer, page)
  std::set<std::tuple<int32_t, int32_t, int64_t>> entries;
  for (const v1::FrameAssignment& f : frames) {
    if (f.frame() < 0 || f.frame() >= capacity_frames || f.layer() < 0 ||
        f.layer() >= shape.layers || f.group() < 0 || f.group() >= shape.kv_groups ||
        f.page() < first_page || f.page() >= end_page ||
        !entries.emplace(f.layer(), f.group(), f.page()).second) {
      return false;
    }
    const auto [it, fresh] = owner.emplace(f.frame(), std::make_pair(f.layer(), f.page()));
    if (!fresh && (shape.layout == v1::FRAME_LAYOUT_GROUP ||
                   it->second != std::make_pair(f.layer(), f.page()))) {
      return false;
    }
  }
  return true;
}

}  // namespace

void RunContext::Problem(const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  if (problems_.size() < 50) problems_.push_back(text);
  if (options->on_problem) options->on_problem(text);
}

std::vector<std::string> RunContext::problems() const {
  std::lock_guard<std::mutex> lock(mu_);
  return problems_;
}

Worker::Worker(RunContext* context, int index)
    : context_(context),
      index_(index),
      tag_(absl::StrCat(context->tag, "-w", index)),
      rng_(context->options->seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  args.SetInt("entrokv.loadgen.worker", index);  // a connection of its own, like a real worker
  channel_ =
      grpc::CreateCustomChannel(context->options->target, grpc::InsecureChannelCredentials(), args);
  stub_ = v1::CacheManager::NewStub(channel_);
  private_.shape = kPrivateShape;
  private_.exact = true;
  shared_group_.id = context->shared_group_model;
  shared_group_.shape = Shape{4, 8, 4, 4, 16, 2, v1::FRAME_LAYOUT_GROUP};
  shared_group_.registered = true;
  shared_layer_.id = context->shared_layer_model;
  shared_layer_.shape = Shape{2, 12, 2, 4, 16, 2, v1::FRAME_LAYOUT_LAYER};
  shared_layer_.registered = true;
  deep_shape_ = Shape{6, 32, 8, 1, 16, 2, v1::FRAME_LAYOUT_GROUP};
  deep_tokens_ = 8192;

  // The worker's segments: statistics (slots, then the deep sequence's layers), one too short
  // for any statistic, a FIFO and a directory (issue 12 #1, #2).
  segment_ = absl::StrCat("/entrokv-", tag_);
  short_segment_ = absl::StrCat("/entrokv-", tag_, "-short");
  fifo_path_ = absl::StrCat("/dev/shm/entrokv-", tag_, "-fifo");
  dir_path_ = absl::StrCat("/dev/shm/entrokv-", tag_, "-dir");
  const int64_t deep_bytes =
      int64_t{deep_shape_.layers} * deep_shape_.query_heads * deep_tokens_ * 2;
  if (const int fd = ::shm_open(segment_.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600); fd >= 0) {
    if (::ftruncate(fd, kSlots * kSlotBytes + deep_bytes) != 0) segment_.clear();
    ::close(fd);
  } else {
    segment_.clear();
  }
  if (const int fd = ::shm_open(short_segment_.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
      fd >= 0) {
    (void)::ftruncate(fd, 100);
    ::close(fd);
  }
  (void)::mkfifo(fifo_path_.c_str(), 0600);
  (void)::mkdir(dir_path_.c_str(), 0700);
}

Worker::~Worker() {
  if (!segment_.empty()) ::shm_unlink(segment_.c_str());
  ::shm_unlink(short_segment_.c_str());
  ::unlink(fifo_path_.c_str());
  ::rmdir(dir_path_.c_str());
}

int64_t Worker::Uniform(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
}

std::string Worker::NewSequenceId() { return absl::StrCat(tag_, "-s", next_id_++); }

void Worker::Run() {
  OpenDeep();
  while (!context_->stop.load() && !context_->daemon_dead.load()) {
    ++step_;
    Step();
  }
  Finish();
}

// ---------------------------------------------------------------------------------------------
// Calls and checks

template <typename Request, typename Response, typename Method>
grpc::Status Worker::Call(const char* kind, Method method, const Request& request,
                          Response* response, const char* bad_case, int timeout_ms) {
  grpc::ClientContext context;
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : context_->options->call_timeout_ms));
  if (!context_->options->bearer_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + context_->options->bearer_token);
  }
  const auto start = Clock::now();
  grpc::Status status = ((*stub_).*method)(&context, request, response);
  CountCall(kind, std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
            bad_case);
  return status;
}

void Worker::CountCall(const char* kind, double ms, const char* bad_case) {
  ++tally_.requests;
  tally_.latency_ms[kind].push_back(static_cast<float>(ms));
  if (bad_case != nullptr) {
    ++tally_.bad_requests;
    ++tally_.bad_cases[bad_case];
  }
  const int64_t sent = context_->requests.fetch_add(1) + 1;
  if (context_->options->max_requests > 0 && sent >= context_->options->max_requests) {
    context_->stop.store(true);
  }
}

void Worker::Wrong(const std::string& what) {
  ++tally_.wrong_answers;
  context_->Problem(absl::StrCat("wrong answer (seed ", context_->options->seed, ", worker ",
                                 index_, ", step ", step_, "): ", what));
}

void Worker::Check(bool ok, const std::string& what) {
  ++tally_.checked;
  if (!ok) Wrong(what);
}

void Worker::Unavailable(const std::string& what) {
  ++tally_.unavailable;
  if (!ProcessAlive(context_->daemon_pid)) {
    if (!context_->daemon_dead.exchange(true)) {
      context_->Problem(absl::StrCat("crash: entrokvd (pid ", context_->daemon_pid,
                                     ") is gone; last call: ", what));
    }
    context_->stop.store(true);
    return;
  }
  context_->Problem(absl::StrCat("unavailable (worker ", index_, ", step ", step_, "): ", what));
}

bool Worker::Expect(const grpc::Status& status, std::initializer_list<StatusCode> codes,
                    const std::string& what) {
  ++tally_.checked;
  for (const StatusCode code : codes) {
    if (status.error_code() == code) return true;
  }
  if (status.error_code() == StatusCode::UNAVAILABLE) {
    Unavailable(absl::StrCat(what, ": ", Cut(status.error_message())));
    return false;
  }
  std::vector<std::string> names;
  for (const StatusCode code : codes) names.push_back(CodeName(code));
  Wrong(absl::StrCat(what, ": got ", CodeName(status.error_code()), " (",
                     Cut(status.error_message()), "), expected ", absl::StrJoin(names, " or ")));
  return false;
}

// ---------------------------------------------------------------------------------------------
// The step

void Worker::Step() {
  if (!private_.registered) {
    RegisterPrivate();
    return;
  }
  if (Chance(context_->options->bad_percent)) {
    BadRequest();
    return;
  }
  Model& model = Chance(50) ? private_ : (Chance(50) ? shared_group_ : shared_layer_);
  const int64_t action = Uniform(0, 99);
  if (action < 12) {
    if (static_cast<int>(model.sequences.size()) >= kMaxSequencesPerModel) {
      CloseSequence(model, static_cast<size_t>(Uniform(0, model.sequences.size() - 1)), true);
    } else {
      OpenSequence(model, /*fork=*/false);
    }
  } else if (action < 18) {
    OpenSequence(model, /*fork=*/true);
  } else if (action < 33) {
    AppendTokens(model);
  } else if (action < 53) {
    Decide(model, /*stream=*/false, /*by_shm=*/Chance(50));
  } else if (action < 65) {
    Decide(model, /*stream=*/true, /*by_shm=*/Chance(50));
  } else if (action < 75) {
    if (!model.sequences.empty()) {
      CloseSequence(model, static_cast<size_t>(Uniform(0, model.sequences.size() - 1)), Chance(30));
    }
  } else if (action < 85) {
    ConsistencyCheck();
  } else if (action < 90) {
    SharedPoolCheck(Chance(50) ? shared_group_ : shared_layer_);
  } else if (action < 95) {
    Browse();
  } else if (action < 97) {
    ScrapeMetrics();
  } else {
    UnregisterPrivate();
  }
}

void Worker::Finish() {
  // Close everything, then the private pool must be empty before it goes.
  for (Model* model : {&private_, &shared_group_, &shared_layer_}) {
    // One attempt each: a close that fails is reported, and the pool check below counts what
    // it left.
    for (size_t n = model->sequences.size(); n > 0 && !context_->daemon_dead.load(); --n) {
      CloseSequence(*model, n - 1, false);
    }
    model->sequences.clear();
  }
  if (!deep_sequence_.empty() && !context_->daemon_dead.load()) {
    v1::CloseSequenceRequest request;
    request.set_model_id(context_->deep_model);
    request.set_sequence_id(deep_sequence_);
    v1::CloseSequenceResponse response;
    (void)Expect(Call("CloseSequence", &v1::CacheManager::Stub::CloseSequence, request, &response),
                 {StatusCode::OK}, "close the deep sequence");
    deep_sequence_.clear();
  }
  if (private_.registered && !context_->daemon_dead.load()) {
    const Snapshot end = TakeSnapshot();
    if (end.used != 0 || end.sequences != 0 || end.free != private_.capacity_frames) {
      tally_.leaked_frames += std::max<int64_t>(end.used, 0);
      context_->Problem(absl::StrCat("leak: model ", private_.id, " has ", end.used,
                                     " used frames and ", end.sequences,
                                     " sequences after every sequence was closed"));
    }
    UnregisterPrivate();
  }
}

// ---------------------------------------------------------------------------------------------
// Ordinary lifecycle

void Worker::RegisterPrivate() {
  private_.id = absl::StrCat(tag_, "-p", generation_++);
  v1::RegisterModelRequest request;
  request.set_model_id(private_.id);
  v1::ModelGeometry* g = request.mutable_geometry();
  g->set_layers(kPrivateShape.layers);
  g->set_query_heads(kPrivateShape.query_heads);
  g->set_kv_groups(kPrivateShape.kv_groups);
  g->set_head_dim(kPrivateShape.head_dim);
  g->set_page_size(kPrivateShape.page_size);
  g->set_element_bytes(kPrivateShape.element_bytes);
  request.set_capacity_bytes(kPrivateCapacityBytes);
  request.set_frame_layout(kPrivateShape.layout);
  request.set_backend(v1::BACKEND_HOST);
  v1::RegisterModelResponse response;
  const grpc::Status status =
      Call("RegisterModel", &v1::CacheManager::Stub::RegisterModel, request, &response);
  if (!Expect(status, {StatusCode::OK}, "RegisterModel " + private_.id)) return;
  const v1::PoolInfo& pool = response.pool();
  Check(pool.model_id() == private_.id && pool.frame_bytes() > 0 &&
            pool.capacity_bytes() == pool.capacity_frames() * pool.frame_bytes() &&
            pool.capacity_bytes() <= kPrivateCapacityBytes &&
            pool.capacity_bytes() + pool.frame_bytes() > kPrivateCapacityBytes &&
            pool.frame_layout() == v1::FRAME_LAYOUT_GROUP && !pool.arena_name().empty(),
        "RegisterModel: pool info " + Cut(pool.ShortDebugString()));
  private_.registered = true;
  private_.capacity_frames = pool.capacity_frames();
  private_.arena_name = pool.arena_name();
  private_.sequences.clear();
}

void Worker::UnregisterPrivate() {
  if (!private_.registered) return;
  const bool force = Chance(50);
  if (!force) {
    while (!private_.sequences.empty()) {
      const size_t before = private_.sequences.size();
      CloseSequence(private_, before - 1, false);
      if (private_.sequences.size() == before) return;  // a wrong answer: already reported
    }
  }
  v1::UnregisterModelRequest request;
  request.set_model_id(private_.id);
  request.set_force(force);
  v1::UnregisterModelResponse response;
  const grpc::Status status =
      Call("UnregisterModel", &v1::CacheManager::Stub::UnregisterModel, request, &response);
  if (!Expect(status, {StatusCode::OK}, "UnregisterModel " + private_.id)) return;
  Check(response.closed_sequences() == static_cast<int64_t>(force ? private_.sequences.size() : 0),
        absl::StrCat("UnregisterModel: closed_sequences ", response.closed_sequences(),
                     ", expected ", private_.sequences.size()));
  private_.registered = false;
  private_.sequences.clear();
  // Gone: the pool answers NOT_FOUND now.
  v1::GetPoolStatsRequest stats;
  stats.set_model_id(private_.id);
  v1::PoolStats pool;
  (void)Expect(Call("GetPoolStats", &v1::CacheManager::Stub::GetPoolStats, stats, &pool),
               {StatusCode::NOT_FOUND}, "GetPoolStats of an unregistered model");
}

void Worker::OpenSequence(Model& model, bool fork) {
  if (!model.registered) return;
  if (static_cast<int>(model.sequences.size()) >= kMaxSequencesPerModel) return;
  v1::OpenSequenceRequest request;
  request.set_model_id(model.id);
  request.set_sequence_id(NewSequenceId());
  const int page = model.shape.page_size;
  int64_t base = 0;                              // tokens shared with the parent
  std::map<int, std::vector<double>> inherited;  // a fork starts with the parent's weights
  if (fork) {
    if (model.sequences.empty()) return;
    const Sequence& parent = model.sequences[Uniform(0, model.sequences.size() - 1)];
    inherited = parent.cached_weights;
    const int64_t prefix = Uniform(0, Pages(parent.length, page));
    request.set_parent_sequence_id(parent.id);
    request.set_prefix_pages(prefix);
    base = std::min(parent.length, prefix * page);
  }
  const int64_t initial = Chance(10) ? 0 : Uniform(1, std::max<int64_t>(1, 600 - base));
  request.set_initial_tokens(initial);
  v1::OpenSequenceResponse response;
  const grpc::Status status =
      Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request, &response);
  if (!Expect(status, {StatusCode::OK}, "OpenSequence " + request.sequence_id())) return;
  const int64_t length = base + initial;
  const int64_t units = int64_t{model.shape.layers} * model.shape.kv_groups;
  const int64_t fresh_pages = Pages(length, page) - Pages(base, page);
  const int64_t frames = response.new_frames_size();
  // A fork whose shared tail page is partial copies it on the first write: one more frame per
  // table (Sequence::Append's copy-on-write).
  Check(response.sequence().sequence_id() == request.sequence_id() &&
            response.sequence().length_tokens() == length && frames >= fresh_pages * units &&
            frames <= (fresh_pages + (base % page != 0 ? 1 : 0)) * units &&
            FrameList(response.new_frames(), model.shape,
                      model.capacity_frames > 0 ? model.capacity_frames
                                                : std::numeric_limits<int32_t>::max(),
                      base / page, Pages(length, page)),
        absl::StrCat("OpenSequence ", request.sequence_id(), " (fork ", fork, ", base ", base,
                     ", initial ", initial, "): length ", response.sequence().length_tokens(), ", ",
                     frames, " new frames"));
  model.sequences.push_back(Sequence{request.sequence_id(), length, std::move(inherited)});
}

void Worker::AppendTokens(Model& model) {
  if (model.sequences.empty()) {
    OpenSequence(model, false);
    return;
  }
  const size_t index = static_cast<size_t>(Uniform(0, model.sequences.size() - 1));
  Sequence& sequence = model.sequences[index];
  const int64_t tokens = Uniform(1, 64);
  if (sequence.length + tokens > kMaxTokens) {
    CloseSequence(model, index, false);
    return;
  }
  v1::AppendTokensRequest request;
  request.set_model_id(model.id);
  request.set_sequence_id(sequence.id);
  request.set_tokens(tokens);
  v1::AppendTokensResponse response;
  const grpc::Status status =
      Call("AppendTokens", &v1::CacheManager::Stub::AppendTokens, request, &response);
  if (!Expect(status, {StatusCode::OK}, "AppendTokens " + sequence.id)) return;
  const int page = model.shape.page_size;
  const int64_t length = sequence.length + tokens;
  const int64_t units = int64_t{model.shape.layers} * model.shape.kv_groups;
  const int64_t fresh = (Pages(length, page) - Pages(sequence.length, page)) * units;
  const int64_t frames = response.new_frames_size();
  // The tail page may come back (evicted) or be copied (shared): at most one more per table.
  Check(response.length_tokens() == length && frames >= fresh && frames <= fresh + units &&
            FrameList(response.new_frames(), model.shape,
                      model.capacity_frames > 0 ? model.capacity_frames
                                                : std::numeric_limits<int32_t>::max(),
                      sequence.length / page, Pages(length, page)),
        absl::StrCat("AppendTokens ", sequence.id, " +", tokens, ": length ",
                     response.length_tokens(), " (expected ", length, "), ", frames,
                     " new frames (", fresh, " fresh)"));
  sequence.length = length;
}

void Worker::CloseSequence(Model& model, size_t index, bool verify_gone) {
  const std::string id = model.sequences[index].id;
  v1::CloseSequenceRequest request;
  request.set_model_id(model.id);
  request.set_sequence_id(id);
  v1::CloseSequenceResponse response;
  const grpc::Status status =
      Call("CloseSequence", &v1::CacheManager::Stub::CloseSequence, request, &response);
  if (!Expect(status, {StatusCode::OK}, "CloseSequence " + id)) {
    if (status.error_code() == StatusCode::UNAVAILABLE) return;
    model.sequences.erase(model.sequences.begin() + index);  // it is gone either way
    return;
  }
  const int64_t pages = Pages(model.sequences[index].length, model.shape.page_size);
  Check(response.live_frames() >= 0 &&
            response.live_frames() <= pages * model.shape.layers * model.shape.kv_groups,
        absl::StrCat("CloseSequence ", id, ": live_frames ", response.live_frames()));
  model.sequences.erase(model.sequences.begin() + index);
  if (!verify_gone) return;
  // A closed sequence is NOT_FOUND (a bad request by design).
  v1::AppendTokensRequest append;
  append.set_model_id(model.id);
  append.set_sequence_id(id);
  append.set_tokens(1);
  v1::AppendTokensResponse appended;
  (void)Expect(Call("AppendTokens", &v1::CacheManager::Stub::AppendTokens, append, &appended,
                    "closed_sequence"),
               {StatusCode::NOT_FOUND}, "AppendTokens to closed sequence " + id);
}

void Worker::OpenDeep() {
  if (context_->deep_model.empty() || segment_.empty()) return;
  v1::OpenSequenceRequest request;
  request.set_model_id(context_->deep_model);
  request.set_sequence_id(absl::StrCat(tag_, "-deep"));
  request.set_initial_tokens(deep_tokens_);
  v1::OpenSequenceResponse response;
  if (!Expect(Call("OpenSequence", &v1::CacheManager::Stub::OpenSequence, request, &response),
              {StatusCode::OK}, "OpenSequence of the deep sequence")) {
    return;
  }
  deep_sequence_ = request.sequence_id();
  // Its statistic, layer after layer, after the slots of the worker's segment.
  const std::string values = RandomStatistic(deep_shape_, deep_tokens_, v1::DTYPE_BFLOAT16);
  const int fd = ::shm_open(segment_.c_str(), O_RDWR, 0);
  if (fd < 0) return;
  for (int l = 0; l < deep_shape_.layers; ++l) {
    (void)::pwrite(
        fd, values.data(), values.size(),
        static_cast<off_t>(kSlots * kSlotBytes + l * static_cast<int64_t>(values.size())));
  }
  ::close(fd);
}

bool Worker::ReadTables(Model& model, const std::string& sequence_id, Tables* tables) {
  v1::ListSequencesRequest request;
  request.set_model_id(model.id);
  request.set_include_block_tables(true);
  v1::ListSequencesResponse response;
  if (!Expect(Call("ListSequences", &v1::CacheManager::Stub::ListSequences, request, &response),
              {StatusCode::OK}, "ListSequences " + model.id)) {
    return false;
  }
  const Shape& s = model.shape;
  for (const v1::SequenceInfo& info : response.sequences()) {
    if (info.sequence_id() != sequence_id) continue;
    tables->assign(s.layers, std::vector<std::vector<int32_t>>(s.kv_groups));
    for (const v1::BlockTable& table : info.block_tables()) {
      if (table.layer() < 0 || table.layer() >= s.layers || table.group() < 0 ||
          table.group() >= s.kv_groups) {
        Wrong(absl::StrCat("ListSequences: block table of layer ", table.layer(), " group ",
                           table.group()));
        return false;
      }
      (*tables)[table.layer()][table.group()].assign(table.frames().begin(), table.frames().end());
    }
    return true;
  }
  Wrong("ListSequences: open sequence " + sequence_id + " is missing");
  return false;
}

void Worker::ConsistencyCheck() {
  if (!private_.registered) return;
  v1::ListSequencesRequest list;
  list.set_model_id(private_.id);
  list.set_include_block_tables(true);
  v1::ListSequencesResponse listed;
  if (!Expect(Call("ListSequences", &v1::CacheManager::Stub::ListSequences, list, &listed),
              {StatusCode::OK}, "ListSequences " + private_.id)) {
    return;
  }
  v1::GetPoolStatsRequest request;
  request.set_model_id(private_.id);
  v1::PoolStats stats;
  if (!Expect(Call("GetPoolStats", &v1::CacheManager::Stub::GetPoolStats, request, &stats),
              {StatusCode::OK}, "GetPoolStats " + private_.id)) {
    return;
  }
  const Shape& s = private_.shape;
  std::set<int32_t> frames;
  std::vector<std::set<int32_t>> per_layer(s.layers);
  std::string problem;
  if (listed.sequences_size() != static_cast<int>(private_.sequences.size())) {
    problem = absl::StrCat(listed.sequences_size(), " sequences listed, ",
                           private_.sequences.size(), " open");
  }
  for (const v1::SequenceInfo& info : listed.sequences()) {
    const auto it = std::find_if(private_.sequences.begin(), private_.sequences.end(),
                                 [&](const Sequence& q) { return q.id == info.sequence_id(); });
    if (it == private_.sequences.end()) {
      problem = "unknown sequence " + info.sequence_id() + " listed";
      continue;
    }
    if (info.length_tokens() != it->length) {
      problem =
          absl::StrCat(it->id, " has ", info.length_tokens(), " tokens, ", it->length, " appended");
    }
    int64_t live = 0;
    if (info.block_tables_size() != s.layers * s.kv_groups) problem = "block table count";
    for (const v1::BlockTable& table : info.block_tables()) {
      if (table.frames_size() != Pages(it->length, s.page_size)) problem = "block table length";
      for (const int32_t frame : table.frames()) {
        if (frame < 0) continue;
        ++live;
        if (frame >= private_.capacity_frames) problem = absl::StrCat("frame ", frame);
        frames.insert(frame);
        if (table.layer() >= 0 && table.layer() < s.layers) per_layer[table.layer()].insert(frame);
      }
    }
    if (live != info.live_frames()) {
      problem = absl::StrCat(it->id, ": live_frames ", info.live_frames(), ", tables name ", live);
    }
  }
  if (stats.used_frames() + stats.free_frames() != stats.capacity_frames() ||
      stats.capacity_frames() != private_.capacity_frames) {
    problem = absl::StrCat("used ", stats.used_frames(), " + free ", stats.free_frames(),
                           " != capacity ", stats.capacity_frames());
  }
  if (stats.used_frames() != static_cast<int64_t>(frames.size())) {
    problem = absl::StrCat("used_frames ", stats.used_frames(), " but the block tables name ",
                           frames.size(), " distinct frames");
  }
  if (stats.sequences_active() != static_cast<int64_t>(private_.sequences.size())) {
    problem = absl::StrCat("sequences_active ", stats.sequences_active());
  }
  for (int l = 0; l < s.layers && l < stats.used_frames_per_layer_size(); ++l) {
    if (stats.used_frames_per_layer(l) != static_cast<int64_t>(per_layer[l].size())) {
      problem = absl::StrCat("used_frames_per_layer[", l, "] ", stats.used_frames_per_layer(l),
                             ", tables name ", per_layer[l].size());
    }
  }
  Check(problem.empty(), "private pool " + private_.id + ": " + problem);
}

void Worker::SharedPoolCheck(Model& model) {
  v1::GetPoolStatsRequest request;
  request.set_model_id(model.id);
  v1::PoolStats stats;
  if (!Expect(Call("GetPoolStats", &v1::CacheManager::Stub::GetPoolStats, request, &stats),
              {StatusCode::OK}, "GetPoolStats " + model.id)) {
    return;
  }
  int64_t per_layer = 0;
  for (const int64_t used : stats.used_frames_per_layer()) per_layer += used;
  Check(stats.used_frames() + stats.free_frames() == stats.capacity_frames() &&
            per_layer == stats.used_frames() &&
            stats.used_frames_per_layer_size() == model.shape.layers &&
            stats.sequences_active() >= static_cast<int64_t>(model.sequences.size()),
        absl::StrCat("shared pool ", model.id, ": ", Cut(stats.ShortDebugString())));
}

void Worker::Browse() {
  if (Chance(50)) {
    v1::ListModelsRequest request;
    v1::ListModelsResponse response;
    if (!Expect(Call("ListModels", &v1::CacheManager::Stub::ListModels, request, &response),
                {StatusCode::OK}, "ListModels")) {
      return;
    }
    int found = 0;
    for (const v1::PoolInfo& pool : response.pools()) {
      found += pool.model_id() == shared_group_.id || pool.model_id() == shared_layer_.id ||
               (private_.registered && pool.model_id() == private_.id);
    }
    Check(found == 2 + (private_.registered ? 1 : 0),
          absl::StrCat("ListModels: ", found, " of this worker's models listed"));
    return;
  }
  Model& model = Chance(50) ? shared_group_ : shared_layer_;
  v1::GetModelRequest request;
  request.set_model_id(model.id);
  v1::GetModelResponse response;
  if (!Expect(Call("GetModel", &v1::CacheManager::Stub::GetModel, request, &response),
              {StatusCode::OK}, "GetModel " + model.id)) {
    return;
  }
  const v1::ModelGeometry& g = response.pool().geometry();
  Check(g.layers() == model.shape.layers && g.query_heads() == model.shape.query_heads &&
            g.kv_groups() == model.shape.kv_groups && g.page_size() == model.shape.page_size &&
            response.pool().frame_layout() == model.shape.layout,
        "GetModel " + model.id + ": " + Cut(response.pool().ShortDebugString()));
}

void Worker::ScrapeMetrics() {
  const int port = context_->options->metrics_port;
  if (port <= 0) return;
  const auto start = Clock::now();
  const std::string body = HttpGet(port, "/metrics");
  CountCall("/metrics", std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
            nullptr);
  // Every family is there, and no label carries a sequence id (R11).
  Check(
      body.find("entrokv_rpc_requests_total") != std::string::npos &&
          body.find("entrokv_pool_frames") != std::string::npos &&
          body.find(context_->tag + "-w" + std::to_string(index_) + "-s") == std::string::npos,
      absl::StrCat("/metrics: ", body.empty() ? "no answer" : "a family missing or a sequence id"));
}

// ---------------------------------------------------------------------------------------------
// Decisions

v1::PolicyParams Worker::RandomPolicy() {
  v1::PolicyParams params;
  params.set_name(kPolicies[Uniform(0, std::size(kPolicies) - 1)]);
  static constexpr double kTaus[] = {0.25, 0.5, 1.0, 2.0};
  static constexpr double kAlphas[] = {0.5, 1.0, 2.0, std::numeric_limits<double>::infinity()};
  static constexpr int kSinks[] = {0, 4, 17};
  static constexpr int kRecent[] = {0, 0, 1, 3};
  params.set_tau(kTaus[Uniform(0, 3)]);
  params.set_alpha(kAlphas[Uniform(0, 3)]);
  params.set_sink_tokens(kSinks[Uniform(0, 2)]);
  params.set_protect_tail_page(Chance(70));
  params.set_protect_sink_pages(Chance(30));
  params.set_protect_recent_pages(kRecent[Uniform(0, 3)]);
  params.set_scope(Chance(50) ? v1::SELECTION_SCOPE_GROUP : v1::SELECTION_SCOPE_LAYER);
  return params;
}

v1::Budget Worker::RandomBudget(const Model& model, int64_t tokens) {
  v1::Budget budget;
  const int64_t pages = Pages(tokens, model.shape.page_size);
  const int64_t kind = Uniform(0, 3);
  if (kind <= 1) {
    budget.set_pages_per_group(Uniform(1, pages + 2));
    return budget;
  }
  if (kind == 2) {
    static constexpr double kFractions[] = {0.1, 0.25, 0.5, 0.75, 1.0};
    budget.set_fraction(kFractions[Uniform(0, 4)]);
  } else {
    budget.set_token_slots(Uniform(1, tokens * model.shape.kv_groups * model.shape.layers));
  }
  if (Chance(50)) budget.set_allocator("pyramid");
  return budget;
}

std::string Worker::RandomStatistic(const Shape& shape, int64_t tokens, v1::DType dtype) {
  // Heavy-tailed, non-negative, some exact zeros; from a generator seeded by the worker's own,
  // so a seed gives the same values.
  std::mt19937 values(static_cast<uint32_t>(rng_()));
  std::exponential_distribution<float> draw(1.0f);
  const int64_t count = shape.query_heads * tokens;
  const int width = dtype == v1::DTYPE_FLOAT32 ? 4 : 2;
  std::string out(static_cast<size_t>(count * width), '\0');
  for (int64_t i = 0; i < count; ++i) {
    const float v = (values() % 16 == 0) ? 0.0f : draw(values) * draw(values);
    if (width == 4) {
      std::memcpy(&out[i * 4], &v, 4);
    } else {
      const uint16_t bits = dtype == v1::DTYPE_BFLOAT16 ? FloatToBFloat16(v) : FloatToFloat16(v);
      std::memcpy(&out[i * 2], &bits, 2);
    }
  }
  return out;
}

void Worker::CheckDecision(Model& model, Sequence& sequence, const v1::PolicyParams& params,
                           const v1::Budget& budget, bool use_cached, v1::DType dtype,
                           const std::string& data, int layer, const v1::LayerDecision& decision,
                           Tables* tables) {
  const Shape& s = model.shape;
  const int64_t tokens = sequence.length;
  const int64_t pages = Pages(tokens, s.page_size);
  const std::string what = absl::StrCat("decision of ", sequence.id, " layer ", layer, " (",
                                        params.name(), ", ", Cut(budget.ShortDebugString()), ")");
  bool shape_ok = decision.layer() == layer && decision.tokens() == tokens &&
                  decision.page_count() == pages && decision.policy() == params.name() &&
                  decision.scope() == params.scope() && decision.groups_size() == s.kv_groups;
  for (int g = 0; shape_ok && g < decision.groups_size(); ++g) {
    const v1::GroupDecision& group = decision.groups(g);
    shape_ok = group.group() == g && PageList(group.kept_pages(), pages) &&
               PageList(group.evicted_pages(), pages);
    std::set<int32_t> kept(group.kept_pages().begin(), group.kept_pages().end());
    for (const int32_t page : group.evicted_pages()) shape_ok &= !kept.contains(page);
  }
  Check(shape_ok, what + ": malformed " + Cut(decision.ShortDebugString()));
  if (!shape_ok || tables == nullptr) return;

  // The core's own decision on the same statistic and the same live pages.
  const service::ServerOptions defaults;
  absl::StatusOr<service::ResolvedPolicy> policy =
      service::ResolvePolicy(params, defaults, s.page_size);
  absl::StatusOr<service::ResolvedBudget> quotas =
      service::ResolveBudget(budget, true, ToCore(s), tokens);
  absl::StatusOr<SelectionScope> scope = service::ResolveScope(
      params.scope(), defaults,
      s.layout == v1::FRAME_LAYOUT_LAYER ? FrameLayout::kLayer : FrameLayout::kGroup);
  if (!policy.ok() || !quotas.ok() || !scope.ok()) {
    Wrong(what + ": the daemon decided what the library refuses");
    return;
  }
  LayerRequest request;
  if (!data.empty()) {
    absl::StatusOr<StatisticView> view =
        StatisticView::Create(data.data(), ToCore(dtype), s.query_heads, tokens);
    if (!view.ok()) {
      Wrong(what + ": the generator's statistic is not a statistic");
      return;
    }
    request.statistic = *view;
  }
  request.query_heads = s.query_heads;
  request.kv_groups = s.kv_groups;
  request.tokens = tokens;
  request.quota_pages = quotas->pages_per_layer[layer];
  request.scope = *scope;
  std::vector<uint8_t> live;
  bool any_evicted = false;
  const auto& layer_tables = (*tables)[layer];
  for (int g = 0; g < s.kv_groups; ++g) {
    if (static_cast<int64_t>(layer_tables[g].size()) != pages) {
      Wrong(what + ": block table length");
      return;
    }
    for (const int32_t frame : layer_tables[g]) {
      live.push_back(frame >= 0 ? 1 : 0);
      any_evicted |= frame < 0;
    }
  }
  if (!any_evicted) live.clear();
  request.live_pages = live;
  std::vector<double> cached;
  if (use_cached) {
    cached = sequence.cached_weights[layer];
    request.cached_weights = cached;
  }
  FusedScorer scorer(policy->options);
  absl::StatusOr<LayerDecision> expected = scorer.DecideLayer(*policy->policy, request);
  if (!expected.ok()) {
    Wrong(what +
          ": the daemon decided, the core refuses: " + std::string(expected.status().message()));
    return;
  }
  std::string mismatch;
  if (decision.quota_pages() != expected->quota_pages) {
    mismatch = absl::StrCat("quota ", decision.quota_pages(), ", expected ", expected->quota_pages);
  }
  std::set<int32_t> evicted_frames;
  for (int g = 0; g < s.kv_groups && mismatch.empty(); ++g) {
    const std::vector<int32_t>& want = expected->groups[g].kept_pages;
    const v1::GroupDecision& got = decision.groups(g);
    if (!std::equal(want.begin(), want.end(), got.kept_pages().begin(), got.kept_pages().end())) {
      mismatch = absl::StrCat("group ", g, " kept [", absl::StrJoin(got.kept_pages(), ","),
                              "], the core keeps [", absl::StrJoin(want, ","), "]");
      break;
    }
    const std::vector<double>& weights = expected->groups[g].weights;
    bool weights_ok = static_cast<int>(weights.size()) == got.weights_size();
    for (size_t i = 0; weights_ok && i < weights.size(); ++i) {
      weights_ok = std::abs(weights[i] - got.weights(static_cast<int>(i))) <= 1e-9;
    }
    if (!weights_ok) mismatch = absl::StrCat("group ", g, " weights differ from the core's");
    std::vector<int32_t> evicted;
    std::set<int32_t> kept(want.begin(), want.end());
    for (int64_t p = 0; p < pages; ++p) {
      if (layer_tables[g][p] >= 0 && !kept.contains(static_cast<int32_t>(p))) {
        evicted.push_back(static_cast<int32_t>(p));
        evicted_frames.insert(layer_tables[g][p]);
      }
    }
    if (!std::equal(evicted.begin(), evicted.end(), got.evicted_pages().begin(),
                    got.evicted_pages().end())) {
      mismatch = absl::StrCat("group ", g, " evicted [", absl::StrJoin(got.evicted_pages(), ","),
                              "], live before and not kept: [", absl::StrJoin(evicted, ","), "]");
    }
  }
  for (const int32_t frame : decision.freed_frames()) {
    if (mismatch.empty() && !evicted_frames.contains(frame)) {
      mismatch = absl::StrCat("freed frame ", frame, " was not an evicted page's");
    }
  }
  Check(mismatch.empty(), what + ": " + mismatch);
  // The state after: evicted pages are gone; fresh weights are cached for decode-time calls.
  for (int g = 0; g < s.kv_groups; ++g) {
    std::set<int32_t> kept(decision.groups(g).kept_pages().begin(),
                           decision.groups(g).kept_pages().end());
    for (int64_t p = 0; p < pages; ++p) {
      if (!kept.contains(static_cast<int32_t>(p))) (*tables)[layer][g][p] = -1;
    }
  }
  if (!use_cached) {
    std::vector<double> weights;
    for (const v1::GroupDecision& group : decision.groups()) {
      weights.insert(weights.end(), group.weights().begin(), group.weights().end());
    }
    if (static_cast<int>(weights.size()) == s.query_heads) {
      sequence.cached_weights[layer] = std::move(weights);
    }
  }
}

void Worker::Decide(Model& model, bool stream, bool by_shm) {
  if (!model.registered) return;
  std::vector<size_t> candidates;
  for (size_t i = 0; i < model.sequences.size(); ++i) {
    if (model.sequences[i].length >= 1) candidates.push_back(i);
  }
  if (candidates.empty()) {
    OpenSequence(model, false);
    return;
  }
  Sequence& sequence = model.sequences[candidates[Uniform(0, candidates.size() - 1)]];
  const Shape& s = model.shape;
  const v1::PolicyParams params = RandomPolicy();
  const v1::Budget budget = RandomBudget(model, sequence.length);
  static constexpr v1::DType kDTypes[] = {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16};
  const v1::DType dtype = kDTypes[Uniform(0, 2)];
  std::vector<int> layers;
  if (stream) {
    const int64_t count = Uniform(1, 4);
    for (int64_t i = 0; i < count; ++i)
      layers.push_back(static_cast<int>(Uniform(0, s.layers - 1)));
  } else {
    for (int l = 0; l < s.layers; ++l) layers.push_back(l);
    std::shuffle(layers.begin(), layers.end(), rng_);
    layers.resize(static_cast<size_t>(Uniform(1, s.layers)));
  }
  bool use_cached = Chance(30);
  for (const int layer : layers) use_cached &= sequence.cached_weights.contains(layer);
  const bool no_statistic = params.name() == "streaming" && Chance(50);
  by_shm &= !segment_.empty();
  // The answer the library gives to this budget (a random token_slots may be too small).
  const absl::Status budget_status =
      service::ResolveBudget(budget, true, ToCore(s), sequence.length).status();
  const StatusCode expected_code = static_cast<StatusCode>(budget_status.code());

  Tables tables;
  Tables* known = nullptr;
  if (model.exact) {
    if (!ReadTables(model, sequence.id, &tables)) return;
    known = &tables;
  }
  std::vector<std::string> data(layers.size());
  std::vector<v1::LayerStatistic> inputs(layers.size());
  const int fd = by_shm ? ::shm_open(segment_.c_str(), O_RDWR, 0) : -1;
  for (size_t i = 0; i < layers.size(); ++i) {
    inputs[i].set_layer(layers[i]);
    if (no_statistic) continue;
    data[i] = RandomStatistic(s, sequence.length, dtype);
    v1::Statistic* stat = inputs[i].mutable_statistic();
    stat->set_dtype(dtype);
    stat->set_query_heads(s.query_heads);
    stat->set_tokens(sequence.length);
    stat->set_kind(static_cast<v1::StatisticKind>(Uniform(0, 3)));
    const int64_t slot = static_cast<int64_t>(i % kSlots) * kSlotBytes;
    if (fd >= 0 && i < kSlots &&
        ::pwrite(fd, data[i].data(), data[i].size(), slot) ==
            static_cast<ssize_t>(data[i].size())) {
      v1::SharedMemoryRegion* region = stat->mutable_shared_memory();
      region->set_segment(segment_);
      region->set_offset_bytes(static_cast<uint64_t>(slot));
      region->set_length_bytes(data[i].size());
    } else {
      stat->set_data(data[i]);
    }
  }
  if (fd >= 0) ::close(fd);

  if (!stream) {
    v1::DecideRequest request;
    request.set_model_id(model.id);
    request.set_sequence_id(sequence.id);
    for (const v1::LayerStatistic& input : inputs) *request.add_layers() = input;
    *request.mutable_budget() = budget;
    *request.mutable_policy() = params;
    request.set_use_cached_weights(use_cached);
    v1::DecideResponse response;
    const grpc::Status status = Call("Decide", &v1::CacheManager::Stub::Decide, request, &response);
    if (!Expect(status, {expected_code}, "Decide " + sequence.id) || !status.ok()) return;
    if (response.layers_size() != static_cast<int>(layers.size())) {
      Wrong(absl::StrCat("Decide ", sequence.id, ": ", response.layers_size(), " layers back"));
      return;
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      CheckDecision(model, sequence, params, budget, use_cached, dtype, data[i], layers[i],
                    response.layers(static_cast<int>(i)), known);
    }
    return;
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(context_->options->call_timeout_ms));
  if (!context_->options->bearer_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + context_->options->bearer_token);
  }
  auto rw = stub_->DecideStream(&context);
  bool broken = false;
  for (size_t i = 0; i < layers.size() && !broken; ++i) {
    v1::DecideLayerRequest request;
    request.set_model_id(model.id);
    request.set_sequence_id(sequence.id);
    *request.mutable_layer() = inputs[i];
    *request.mutable_budget() = budget;
    *request.mutable_policy() = params;
    bool cached_here = use_cached;
    request.set_use_cached_weights(cached_here);
    const auto start = Clock::now();
    v1::LayerDecision decision;
    broken = !rw->Write(request) || !rw->Read(&decision);
    CountCall("DecideStream",
              std::chrono::duration<double, std::milli>(Clock::now() - start).count(), nullptr);
    if (!broken) {
      CheckDecision(model, sequence, params, budget, cached_here, dtype, data[i], layers[i],
                    decision, known);
    }
  }
  (void)rw->WritesDone();
  const grpc::Status status = rw->Finish();
  if (expected_code == StatusCode::OK) {
    (void)Expect(status, {StatusCode::OK}, "DecideStream " + sequence.id);
  } else {
    (void)Expect(status, {expected_code}, "DecideStream " + sequence.id);
  }
}

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
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(context_->options->call_timeout_ms));
  if (!context_->options->bearer_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + context_->options->bearer_token);
  }
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
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(context_->options->call_timeout_ms));
  if (!context_->options->bearer_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + context_->options->bearer_token);
  }
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
