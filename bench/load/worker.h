// One load-generator worker: its own connection, models, sequences, shared-memory segment and
// random generator; see load_generator.h for what it sends and checks.
#ifndef ENTROKV_BENCH_LOAD_WORKER_H_
#define ENTROKV_BENCH_LOAD_WORKER_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "bench/load/load_generator.h"
#include "core/pool/geometry.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/policy.h"
#include "core/util/dtype.h"
#include "entrokv/v1/cache_manager.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "wire/convert.h"

namespace entrokv::bench {

// Sets a call's deadline, and its bearer token when the run has one (every call the generator
// makes goes through here).
inline void PrepareCall(grpc::ClientContext* context, const LoadOptions& options,
                        std::chrono::milliseconds timeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
  if (!options.bearer_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options.bearer_token);
  }
}

// A model's shape as the generator registers it.
struct Shape {
  int layers = 0;
  int query_heads = 0;
  int kv_groups = 0;
  int head_dim = 4;
  int page_size = 16;
  int element_bytes = 2;
  FrameLayout layout = FrameLayout::kGroup;

  [[nodiscard]] ModelGeometry geometry() const {
    ModelGeometry geometry;
    geometry.layers = layers;
    geometry.query_heads = query_heads;
    geometry.kv_groups = kv_groups;
    geometry.head_dim = head_dim;
    geometry.page_size = page_size;
    geometry.element_bytes = element_bytes;
    return geometry;
  }
};

// The models the run registers for every worker before they start (load_generator.cc), whose
// shapes the workers check their answers against.
inline constexpr Shape kSharedGroupShape{4, 8, 4, 4, 16, 2, FrameLayout::kGroup};
inline constexpr Shape kSharedLayerShape{2, 12, 2, 4, 16, 2, FrameLayout::kLayer};
inline constexpr Shape kDeepShape{6, 32, 8, 1, 16, 2, FrameLayout::kGroup};

// A RegisterModel request for a host pool of `shape` (every valid registration the generator
// sends).
inline v1::RegisterModelRequest RegisterRequestFor(const std::string& id, const Shape& shape,
                                                   uint64_t capacity_bytes) {
  wire::PoolRequest pool;
  pool.geometry = shape.geometry();
  pool.capacity_bytes = capacity_bytes;
  pool.layout = shape.layout;
  pool.backend = Backend::kHost;
  return wire::ToRegisterRequest(id, pool);
}

// What every worker shares: the options, the stop signal, the counters that bound the run, the
// models the run registered for everyone, and the problem log.
struct RunContext {
  const LoadOptions* options = nullptr;
  pid_t daemon_pid = 0;
  std::string tag;  // "lg<generator pid>": prefix of every id and segment of this run
  std::string shared_group_model;
  std::string shared_layer_model;
  std::string deep_model;
  std::atomic<bool> stop{false};
  std::atomic<bool> daemon_dead{false};
  std::atomic<int64_t> requests{0};

  // Records a problem (wrong answer, crash, leak); thread-safe.
  void Problem(const std::string& text);
  [[nodiscard]] std::vector<std::string> problems() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> problems_;
};

// A worker's counters, merged into the report at the end.
struct WorkerTally {
  int64_t requests = 0;
  int64_t bad_requests = 0;
  int64_t checked = 0;
  int64_t wrong_answers = 0;
  int64_t unavailable = 0;
  int64_t leaked_frames = 0;
  std::map<std::string, std::vector<float>> latency_ms;  // per RPC kind
  std::map<std::string, int64_t> bad_cases;
};

class Worker {
 public:
  Worker(RunContext* context, int index);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Steps until the run stops, then closes everything it opened and checks its private pool
  // ends empty.
  void Run();
  [[nodiscard]] const WorkerTally& tally() const { return tally_; }

 private:
  struct Sequence {
    std::string id;
    int64_t length = 0;
    // Head weights the daemon cached for the sequence, per layer (from fresh decisions).
    std::map<int, std::vector<double>> cached_weights;
  };
  struct Model {
    std::string id;
    Shape shape;
    bool exact = false;  // only this worker uses it: decisions and invariants checked exactly
    bool registered = false;
    int64_t capacity_frames = 0;
    std::string arena_name;
    std::vector<Sequence> sequences;
  };
  // Block tables of one sequence: [layer][group][page] -> frame, -1 evicted.
  using Tables = std::vector<std::vector<std::vector<int32_t>>>;
  // The private pool's counters, for "a bad request changes nothing".
  struct Snapshot {
    int64_t used = -1, free = -1, sequences = -1, evicted = -1, freed = -1;
    bool operator==(const Snapshot&) const = default;
  };

  void Step();
  void Finish();

  // The RPC wrapper: counts, times, bounds the run. `bad_case` names the bad request it sends
  // (nullptr: an ordinary one).
  template <typename Request, typename Response, typename Method>
  grpc::Status Call(const char* kind, Method method, const Request& request, Response* response,
                    const char* bad_case = nullptr, int timeout_ms = 0);
  void CountCall(const char* kind, double ms, const char* bad_case);
  // True when `status` has one of `codes`; otherwise a wrong answer (or an unavailable daemon).
  bool Expect(const grpc::Status& status, std::initializer_list<grpc::StatusCode> codes,
              const std::string& what);
  // The answer a bad request must get: `code`, and when `field` is set a message that starts
  // with it (the contract names the offending field first).
  struct Refusal {
    grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT;
    const char* field = nullptr;
  };
  // Expect(status, {refusal.code}) and the field; true when the code was right.
  bool ExpectRefusal(const grpc::Status& status, const Refusal& refusal, const std::string& what);
  void Check(bool ok, const std::string& what);
  void Wrong(const std::string& what);
  // A call answered UNAVAILABLE: counted; the run stops if the daemon is gone.
  void Unavailable(const std::string& what);

  // Ordinary lifecycle.
  void RegisterPrivate();
  void UnregisterPrivate();
  void OpenSequence(Model& model, bool fork);
  void AppendTokens(Model& model);
  void CloseSequence(Model& model, size_t index, bool verify_gone);
  void Decide(Model& model, bool stream, bool by_shm);
  void ConsistencyCheck();
  void SharedPoolCheck(Model& model);
  void Browse();
  void ScrapeMetrics();
  void OpenDeep();

  // One bad request, of a case picked at random (worker_bad_requests.cc: the table of cases).
  void BadRequest();
  // Runs `send` and checks the private pool's counters are unchanged by it.
  void Unchanged(const char* what, absl::FunctionRef<void()> send);
  [[nodiscard]] Snapshot TakeSnapshot();
  // A private sequence with at least one token, opened if none; nullptr when that fails.
  Sequence* PrivateSequence();
  // A valid one-layer DecideRequest for `sequence` of the private model (bytes, bf16, 4 pages
  // per group: ValidBudget).
  [[nodiscard]] v1::DecideRequest ValidDecide(const Sequence& sequence, int layer);
  // Sends `request`, spoiled, to Decide and checks it is refused with `refusal` and changes
  // nothing; `bad_case` names it in the tally, `what` in a wrong answer.
  void DecideRefused(const v1::DecideRequest& request, const Refusal& refusal, const char* bad_case,
                     const std::string& what);
  // The cases, one function each: what it sends, the code and field it expects.
  void BadId();
  void BadUnknownModel();
  void BadUnknownSequence();
  void BadDuplicate();
  void BadTokenCount();
  void BadFork();
  void BadBudget();
  void BadPolicy();
  void BadHugeEcho();
  void ExtremeProtections();
  void BadStatistic();
  void BadLayers();
  void BadNoCachedWeights();
  void BadTruncate();
  void BadChunk();
  void BadShm();
  void BadGarbageUnary();
  void BadGarbageStream();
  void BadDeadline();
  void BadRegister();
  void BadPoolLimits();

  // Decision helpers. The generator states the policy, scope and quotas it means itself, from
  // the same draws as the request's fields, so that a decision is checked without the daemon's
  // request resolution (the wire library) or its fused scorer.
  struct PolicyChoice {
    v1::PolicyParams params;  // what the request carries
    const Policy* policy = nullptr;
    PolicyOptions options;
    SelectionScope scope = SelectionScope::kGroup;
  };
  struct BudgetChoice {
    v1::Budget budget;  // what the request carries
    // The quota of every layer (the core's planner for fractions and token slots), or the
    // error the daemon must answer with.
    absl::StatusOr<std::vector<int64_t>> quotas;
  };
  [[nodiscard]] PolicyChoice RandomPolicy(int page_size);
  // The budget of ValidDecide: 4 pages per group of the private model.
  [[nodiscard]] BudgetChoice ValidBudget() const;
  [[nodiscard]] BudgetChoice RandomBudget(const Model& model, int64_t tokens);
  [[nodiscard]] std::string RandomStatistic(const Shape& shape, int64_t tokens, DType dtype);
  [[nodiscard]] bool ReadTables(Model& model, const std::string& sequence_id, Tables* tables);
  // Checks one layer's decision; for an exact model against the core's reference decision
  // (DecideLayer) on `data` (empty: no statistic) with `tables` as the state before, which it
  // then updates.
  void CheckDecision(Model& model, Sequence& sequence, const PolicyChoice& policy,
                     const BudgetChoice& budget, bool use_cached, DType dtype,
                     const std::string& data, int layer, const v1::LayerDecision& decision,
                     Tables* tables);

  [[nodiscard]] int64_t Uniform(int64_t lo, int64_t hi);  // inclusive
  [[nodiscard]] bool Chance(int percent) { return Uniform(0, 99) < percent; }
  [[nodiscard]] std::string NewSequenceId();

  RunContext* const context_;
  const int index_;
  const std::string tag_;  // "<run tag>-w<index>"
  std::mt19937_64 rng_;
  int64_t step_ = 0;
  int64_t next_id_ = 0;
  int generation_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CacheManager::Stub> stub_;
  Model private_;
  Model shared_group_;
  Model shared_layer_;
  std::string deep_sequence_;  // empty: none open
  Shape deep_shape_;
  int64_t deep_tokens_ = 0;
  std::string segment_;  // this worker's statistic segment
  std::string short_segment_, fifo_path_, dir_path_;
  WorkerTally tally_;
};

}  // namespace entrokv::bench

#endif  // ENTROKV_BENCH_LOAD_WORKER_H_
