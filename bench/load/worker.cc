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

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/load/daemon_probe.h"
#include "bench/load/worker_internal.h"
#include "core/pool/geometry.h"
#include "core/scoring/budget.h"
#include "core/scoring/decision.h"
#include "core/util/dtype.h"
#include "core/util/page_count.h"
#include "proto/grpc_status.h"

namespace entrokv::bench {

using Clock = std::chrono::steady_clock;
using grpc::StatusCode;
using worker_internal::Cut;
using worker_internal::FrameList;
using worker_internal::kMaxSequencesPerModel;
using worker_internal::kMaxTokens;
using worker_internal::kPrivateCapacityBytes;
using worker_internal::kPrivateShape;
using worker_internal::kSlotBytes;
using worker_internal::kSlots;
using worker_internal::PageList;

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
  shared_group_.shape = kSharedGroupShape;
  shared_group_.registered = true;
  shared_layer_.id = context->shared_layer_model;
  shared_layer_.shape = kSharedLayerShape;
  shared_layer_.registered = true;
  deep_shape_ = kDeepShape;
  deep_tokens_ = 8192;

  // The worker's segments: statistics (slots, then the deep sequence's layers), one too short
  // for any statistic, a FIFO and a directory: the hostile segments the daemon must refuse.
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
    // One byte: shorter than any statistic (a bf16 one holds at least one 2-byte value). At
    // 100 bytes, a statistic of a few tokens fitted and the daemon rightly answered OK.
    (void)::ftruncate(fd, 1);
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
  // A first connection attempt that fails (a loaded machine) leaves the channel failing every
  // call fast until gRPC's reconnect backoff ends: a short run would count a whole worker as
  // unavailable. So connect before the load; a failure after this counts.
  channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
  OpenDeep();
  while (!context_->stop.load() && !context_->daemon_dead.load()) {
    ++step_;
    Step();
  }
  Finish();
}

// ---------------------------------------------------------------------------------------------
// Calls and checks

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
  for (const StatusCode code : codes) names.push_back(StatusCodeName(code));
  Wrong(absl::StrCat(what, ": got ", StatusCodeName(status.error_code()), " (",
                     Cut(status.error_message()), "), expected ", absl::StrJoin(names, " or ")));
  return false;
}

bool Worker::ExpectRefusal(const grpc::Status& status, const Refusal& refusal,
                           const std::string& what) {
  if (!Expect(status, {refusal.code}, what)) return false;
  if (refusal.field != nullptr) {
    Check(absl::StartsWith(status.error_message(), refusal.field),
          absl::StrCat(what, ": refused without naming ", refusal.field,
                       " first: ", Cut(status.error_message())));
  }
  return true;
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
  const v1::RegisterModelRequest request =
      RegisterRequestFor(private_.id, kPrivateShape, kPrivateCapacityBytes);
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
    const int64_t prefix = Uniform(0, PageCount(parent.length, page));
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
  const int64_t fresh_pages = PageCount(length, page) - PageCount(base, page);
  const int64_t frames = response.new_frames_size();
  // A fork whose shared tail page is partial copies it on the first write: one more frame per
  // table (Sequence::Append's copy-on-write).
  Check(response.sequence().sequence_id() == request.sequence_id() &&
            response.sequence().length_tokens() == length && frames >= fresh_pages * units &&
            frames <= (fresh_pages + (base % page != 0 ? 1 : 0)) * units &&
            FrameList(response.new_frames(), model.shape,
                      model.capacity_frames > 0 ? model.capacity_frames
                                                : std::numeric_limits<int32_t>::max(),
                      base / page, PageCount(length, page)),
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
  const int64_t fresh = (PageCount(length, page) - PageCount(sequence.length, page)) * units;
  const int64_t frames = response.new_frames_size();
  // The tail page may come back (evicted) or be copied (shared): at most one more per table.
  Check(response.length_tokens() == length && frames >= fresh && frames <= fresh + units &&
            FrameList(response.new_frames(), model.shape,
                      model.capacity_frames > 0 ? model.capacity_frames
                                                : std::numeric_limits<int32_t>::max(),
                      sequence.length / page, PageCount(length, page)),
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
  const int64_t pages = PageCount(model.sequences[index].length, model.shape.page_size);
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
  const std::string values = RandomStatistic(deep_shape_, deep_tokens_, DType::kBFloat16);
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
      if (table.frames_size() != PageCount(it->length, s.page_size)) problem = "block table length";
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
            response.pool().frame_layout() == wire::ToProto(model.shape.layout),
        "GetModel " + model.id + ": " + Cut(response.pool().ShortDebugString()));
}

void Worker::ScrapeMetrics() {
  const int port = context_->options->metrics_port;
  if (port <= 0) return;
  const auto start = Clock::now();
  const std::string body = HttpGet(port, "/metrics");
  CountCall("/metrics", std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
            nullptr);
  // Every family is there, and no label carries a sequence id (docs/reliability.md, "Metrics").
  Check(
      body.find("entrokv_rpc_requests_total") != std::string::npos &&
          body.find("entrokv_pool_frames") != std::string::npos &&
          body.find(context_->tag + "-w" + std::to_string(index_) + "-s") == std::string::npos,
      absl::StrCat("/metrics: ", body.empty() ? "no answer" : "a family missing or a sequence id"));
}

// ---------------------------------------------------------------------------------------------
// Decisions

Worker::PolicyChoice Worker::RandomPolicy(int page_size) {
  static const std::vector<absl::string_view> kNames = PolicyNames();
  static constexpr double kTaus[] = {0.25, 0.5, 1.0, 2.0};
  static constexpr double kAlphas[] = {0.5, 1.0, 2.0, std::numeric_limits<double>::infinity()};
  static constexpr int kSinks[] = {0, 4, 17};
  static constexpr int kRecent[] = {0, 0, 1, 3};
  // Every parameter the contract lets a request set is set, so the answer does not depend on
  // the daemon's defaults; the rest (snapkv_kernel) is the core's default on both sides.
  PolicyChoice choice;
  const absl::string_view name = kNames[Uniform(0, kNames.size() - 1)];
  choice.policy = *FindPolicy(name);
  choice.options.page_size = page_size;
  choice.options.tau = kTaus[Uniform(0, 3)];
  choice.options.alpha = kAlphas[Uniform(0, 3)];
  choice.options.sink_tokens = kSinks[Uniform(0, 2)];
  choice.options.protections.tail_page = Chance(70);
  choice.options.protections.sink_pages = Chance(30);
  choice.options.protections.recent_pages = kRecent[Uniform(0, 3)];
  const bool layer_scope = Chance(50);
  choice.scope = layer_scope ? SelectionScope::kLayer : SelectionScope::kGroup;

  v1::PolicyParams& params = choice.params;
  params.set_name(std::string(name));
  params.set_tau(choice.options.tau);
  params.set_alpha(choice.options.alpha);
  params.set_sink_tokens(choice.options.sink_tokens);
  params.set_protect_tail_page(choice.options.protections.tail_page);
  params.set_protect_sink_pages(choice.options.protections.sink_pages);
  params.set_protect_recent_pages(choice.options.protections.recent_pages);
  params.set_scope(layer_scope ? v1::SELECTION_SCOPE_LAYER : v1::SELECTION_SCOPE_GROUP);
  return choice;
}

Worker::BudgetChoice Worker::RandomBudget(const Model& model, int64_t tokens) {
  const Shape& s = model.shape;
  BudgetChoice choice;
  const int64_t pages = PageCount(tokens, s.page_size);
  const int64_t kind = Uniform(0, 3);
  if (kind <= 1) {
    const int64_t per_group = Uniform(1, pages + 2);
    choice.budget.set_pages_per_group(per_group);
    choice.quotas = std::vector<int64_t>(static_cast<size_t>(s.layers), per_group);
    return choice;
  }
  BudgetRequest request;
  if (kind == 2) {
    static constexpr double kFractions[] = {0.1, 0.25, 0.5, 0.75, 1.0};
    const double fraction = kFractions[Uniform(0, 4)];
    choice.budget.set_fraction(fraction);
    request = FractionBudget(s.layers, s.kv_groups, s.page_size, tokens, fraction);
  } else {
    const int64_t slots = Uniform(1, tokens * s.kv_groups * s.layers);
    choice.budget.set_token_slots(slots);
    request = TokenSlotBudget(s.layers, s.kv_groups, s.page_size, tokens, slots);
  }
  if (Chance(50)) {
    choice.budget.set_allocator("pyramid");
    request.allocator = LayerAllocator::kPyramid;
  }
  // A random token_slots may be below one page per layer: then the planner's error is the
  // answer.
  absl::StatusOr<BudgetPlan> plan = PlanBudget(request);
  if (plan.ok()) {
    choice.quotas = std::move(plan->pages_per_layer);
  } else {
    choice.quotas = plan.status();
  }
  return choice;
}

std::string Worker::RandomStatistic(const Shape& shape, int64_t tokens, DType dtype) {
  // Heavy-tailed, non-negative, some exact zeros; from a generator seeded by the worker's own,
  // so a seed gives the same values.
  std::mt19937 values(static_cast<uint32_t>(rng_()));
  std::exponential_distribution<float> draw(1.0f);
  const int64_t count = shape.query_heads * tokens;
  const int width = DTypeBytes(dtype);
  std::string out(static_cast<size_t>(count * width), '\0');
  for (int64_t i = 0; i < count; ++i) {
    const float v = (values() % 16 == 0) ? 0.0f : draw(values) * draw(values);
    if (dtype == DType::kFloat32) {
      std::memcpy(&out[i * 4], &v, 4);
    } else {
      const uint16_t bits = dtype == DType::kBFloat16 ? FloatToBFloat16(v) : FloatToFloat16(v);
      std::memcpy(&out[i * 2], &bits, 2);
    }
  }
  return out;
}

void Worker::CheckDecision(Model& model, Sequence& sequence, const PolicyChoice& policy,
                           const BudgetChoice& budget, bool use_cached, DType dtype,
                           const std::string& data, int layer, const v1::LayerDecision& decision,
                           Tables* tables) {
  const Shape& s = model.shape;
  const int64_t tokens = sequence.length;
  const int64_t pages = PageCount(tokens, s.page_size);
  const v1::PolicyParams& params = policy.params;
  const std::string what =
      absl::StrCat("decision of ", sequence.id, " layer ", layer, " (", params.name(), ", ",
                   Cut(budget.budget.ShortDebugString()), ")");
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
  if (!shape_ok) return;
  // What the daemon caches for decode-time calls: a fresh decision's weights, every head's.
  std::vector<double> cached;
  if (use_cached) cached = sequence.cached_weights[layer];
  if (!use_cached) {
    std::vector<double> weights;
    for (const v1::GroupDecision& group : decision.groups()) {
      weights.insert(weights.end(), group.weights().begin(), group.weights().end());
    }
    if (static_cast<int>(weights.size()) == s.query_heads) {
      sequence.cached_weights[layer] = std::move(weights);
    }
  }
  if (tables == nullptr) return;

  // The answer, independent of the daemon's code path: the core's reference scorer
  // (DecideLayer, not the fused scorer the daemon runs) on the same statistic and live pages,
  // for the policy, scope and quota the generator stated itself (not read back from the
  // request through the wire library the daemon resolves it with).
  if (!budget.quotas.ok()) {
    Wrong(what + ": the daemon decided on a budget the planner refuses: " +
          std::string(budget.quotas.status().message()));
    return;
  }
  std::optional<StatisticView> view;
  if (!data.empty()) {
    absl::StatusOr<StatisticView> created =
        StatisticView::Create(data.data(), dtype, s.query_heads, tokens);
    if (!created.ok()) {
      Wrong(what + ": the generator's statistic is not a statistic");
      return;
    }
    view = *created;
  }
  LayerRequest request = LayerRequestFor(view, s.query_heads, s.kv_groups, tokens,
                                         (*budget.quotas)[static_cast<size_t>(layer)]);
  request.scope = policy.scope;
  request.measure = false;  // the measures are not compared; they do not change the pages
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
  if (use_cached) request.cached_weights = cached;
  absl::StatusOr<LayerDecision> expected = DecideLayer(*policy.policy, policy.options, request);
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
  // The state after: evicted pages are gone.
  for (int g = 0; g < s.kv_groups; ++g) {
    std::set<int32_t> kept(decision.groups(g).kept_pages().begin(),
                           decision.groups(g).kept_pages().end());
    for (int64_t p = 0; p < pages; ++p) {
      if (!kept.contains(static_cast<int32_t>(p))) (*tables)[layer][g][p] = -1;
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
  const PolicyChoice policy = RandomPolicy(s.page_size);
  const BudgetChoice budget = RandomBudget(model, sequence.length);
  // The element type as the generator encodes it and as it names it on the wire, both stated
  // here rather than converted, so the check does not share the wire library with the daemon.
  static constexpr std::pair<DType, v1::DType> kDTypes[] = {{DType::kFloat32, v1::DTYPE_FLOAT32},
                                                            {DType::kFloat16, v1::DTYPE_FLOAT16},
                                                            {DType::kBFloat16, v1::DTYPE_BFLOAT16}};
  const auto [dtype, wire_dtype] = kDTypes[Uniform(0, 2)];
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
  const bool no_statistic = !policy.policy->needs_statistic() && Chance(50);
  by_shm &= !segment_.empty();
  const StatusCode expected_code = static_cast<StatusCode>(budget.quotas.status().code());

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
    stat->set_dtype(wire_dtype);
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
    *request.mutable_budget() = budget.budget;
    *request.mutable_policy() = policy.params;
    request.set_use_cached_weights(use_cached);
    v1::DecideResponse response;
    const grpc::Status status = Call("Decide", &v1::CacheManager::Stub::Decide, request, &response);
    if (!Expect(status, {expected_code}, "Decide " + sequence.id) || !status.ok()) return;
    if (response.layers_size() != static_cast<int>(layers.size())) {
      Wrong(absl::StrCat("Decide ", sequence.id, ": ", response.layers_size(), " layers back"));
      return;
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      CheckDecision(model, sequence, policy, budget, use_cached, dtype, data[i], layers[i],
                    response.layers(static_cast<int>(i)), known);
    }
    return;
  }
  grpc::ClientContext context;
  PrepareCall(&context, *context_->options,
              std::chrono::milliseconds(context_->options->call_timeout_ms));
  auto rw = stub_->DecideStream(&context);
  bool broken = false;
  for (size_t i = 0; i < layers.size() && !broken; ++i) {
    v1::DecideLayerRequest request;
    request.set_model_id(model.id);
    request.set_sequence_id(sequence.id);
    *request.mutable_layer() = inputs[i];
    *request.mutable_budget() = budget.budget;
    *request.mutable_policy() = policy.params;
    bool cached_here = use_cached;
    request.set_use_cached_weights(cached_here);
    const auto start = Clock::now();
    v1::LayerDecision decision;
    broken = !rw->Write(request) || !rw->Read(&decision);
    CountCall("DecideStream",
              std::chrono::duration<double, std::milli>(Clock::now() - start).count(), nullptr);
    if (!broken) {
      CheckDecision(model, sequence, policy, budget, cached_here, dtype, data[i], layers[i],
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

}  // namespace entrokv::bench
