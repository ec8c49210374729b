#include "core/cuda/scorer.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/scorer_kernels.h"
#include "core/scoring/entropy.h"
#include "core/scoring/fused_scorer.h"
#include "core/scoring/group_finish.h"
#include "core/scoring/group_quotas.h"
#include "core/scoring/pages.h"
#include "core/scoring/weights.h"
#include "core/util/status_macros.h"

namespace entrokv::cuda {
namespace {

absl::Status CudaCall(cudaError_t error, absl::string_view call) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat("cuda scorer: ", call, ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// Memory that grows to the largest size asked and is then reused: device memory (cudaMalloc),
// or pinned host memory (cudaMallocHost), which the device copies into and out of at full speed.
enum class Memory { kDevice, kPinnedHost };
template <typename T, Memory kMemory>
class GrowingBuffer {
 public:
  GrowingBuffer() = default;
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;
  ~GrowingBuffer() { Free(); }
  absl::Status Reserve(size_t count) {
    if (count <= capacity_) return absl::OkStatus();
    Free();
    void* data = nullptr;
    const size_t bytes = std::max<size_t>(count, 1) * sizeof(T);
    RETURN_IF_ERROR(kMemory == Memory::kDevice
                        ? CudaCall(cudaMalloc(&data, bytes), "cudaMalloc")
                        : CudaCall(cudaMallocHost(&data, bytes), "cudaMallocHost"));
    data_ = static_cast<T*>(data);
    capacity_ = count;
    return absl::OkStatus();
  }
  T* data() const { return data_; }

 private:
  void Free() {
    if (kMemory == Memory::kDevice) {
      cudaFree(data_);
    } else {
      cudaFreeHost(data_);
    }
    data_ = nullptr;
    capacity_ = 0;
  }
  T* data_ = nullptr;
  size_t capacity_ = 0;
};
template <typename T>
using DeviceBuffer = GrowingBuffer<T, Memory::kDevice>;
template <typename T>
using PinnedBuffer = GrowingBuffer<T, Memory::kPinnedHost>;

int ElementOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return kernels::kF32;
    case DType::kFloat16:
      return kernels::kF16;
    case DType::kBFloat16:
      return kernels::kBF16;
  }
  return kernels::kF32;
}

int PoolOf(PoolingKind kind) {
  return kind == PoolingKind::kMax    ? kernels::kMax
         : kind == PoolingKind::kMean ? kernels::kMean
                                      : kernels::kWeighted;
}

// Layers decided in one launch of each kernel share everything the kernels take.
bool SameBatch(const LayerRequest& a, const LayerRequest& b) {
  return a.query_heads == b.query_heads && a.kv_groups == b.kv_groups && a.tokens == b.tokens &&
         a.statistic->dtype() == b.statistic->dtype() && a.measure == b.measure &&
         a.scope == b.scope && a.page_scores == b.page_scores &&
         a.cached_weights.empty() == b.cached_weights.empty();
}

// A host copy of a statistic in device memory, in *bytes.
absl::StatusOr<StatisticView> HostCopy(const StatisticView& view, std::vector<char>* bytes) {
  bytes->resize(static_cast<size_t>(view.query_heads()) * static_cast<size_t>(view.tokens()) *
                static_cast<size_t>(DTypeBytes(view.dtype())));
  RETURN_IF_ERROR(CudaCall(
      cudaMemcpy(bytes->data(), view.data(), bytes->size(), cudaMemcpyDeviceToHost), "cudaMemcpy"));
  return StatisticView::Create(bytes->data(), view.dtype(), view.query_heads(), view.tokens());
}

// Restores the calling thread's device when it goes.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    switched_ = previous_ != device && cudaSetDevice(device) == cudaSuccess;
  }
  ~DeviceScope() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace

bool ScoresOnDevice(const Policy& policy, const PolicyOptions& options,
                    const LayerRequest& request) {
  if (!IsFusedPolicy(policy) || !request.statistic.has_value()) return false;
  // Moving group quotas is a pass over the layer's page scores the host path makes.
  if (options.page_size > kernels::kMaxPageSize || options.neighbourhood_kernel > 1 ||
      MovesGroupQuotas(options)) {
    return false;
  }
  const bool entropy =
      policy.pooling().kind == PoolingKind::kEntropyWeighted && request.cached_weights.empty();
  return !entropy || options.alpha == 2.0 || std::isinf(options.alpha);
}

struct Scorer::State {
  explicit State(int device) : device(device) {}
  ~State() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // Decides `layers` (indices into requests, one batch) on the device. `host` holds the
  // requests with host views, for the value error's message; null when the views are on the
  // device (the layer is then copied back to report it).
  absl::Status RunBatch(const Policy& policy, const PolicyOptions& options,
                        std::span<const LayerRequest> requests, const LayerRequest* host,
                        std::span<const size_t> layers,
                        std::vector<std::optional<absl::StatusOr<LayerDecision>>>& results);
  // RunBatch's end for the device selection: the kept pages from the device, the weights and
  // entropies from RunBatch (host_weights, and host_entropies when `derived`).
  absl::Status SelectOnDevice(const Policy& policy, const PolicyOptions& options,
                              std::span<const LayerRequest> requests, const LayerRequest* host,
                              std::span<const size_t> layers, int64_t pages, bool derived,
                              std::vector<std::optional<absl::StatusOr<LayerDecision>>>& results);
  // Layer i of a batch's decision before its pages: the shape, and each group's head weights
  // (host_weights, none for max pooling) and entropies (host_entropies, when `derived`).
  LayerDecision StartDecision(const Pooling& pooling, const LayerRequest& request, size_t i,
                              int64_t pages, int heads, int groups, bool derived) const;
  // A layer whose values the device found bad: the CPU path's error, from a host view.
  absl::Status ValueError(const LayerRequest& request, const LayerRequest* host, size_t l);
  absl::StatusOr<std::vector<LayerDecision>> Decide(const Policy& policy,
                                                    const PolicyOptions& options,
                                                    std::span<const LayerRequest> requests,
                                                    const LayerRequest* host);

  int device;
  cudaStream_t stream = nullptr;
  GroupFinisher finisher;
  DeviceBuffer<const void*> layer_pointers;
  PinnedBuffer<const void*> host_layer_pointers;
  DeviceBuffer<char> staging;
  DeviceBuffer<double> sums;
  DeviceBuffer<int> group_counters;  // the entropy kernel's count of each group's finished rows
  DeviceBuffer<double> entropies;
  PinnedBuffer<double> host_entropies;
  DeviceBuffer<double> weights;
  PinnedBuffer<double> host_weights;
  DeviceBuffer<float> page_max;
  DeviceBuffer<float> head_max;
  DeviceBuffer<double> page_sums;
  DeviceBuffer<int> bad;
  // The device selection (group scope, nothing measured, no page scores asked).
  DeviceBuffer<int64_t> select_plan;  // quotas, output offsets, protected offsets
  PinnedBuffer<int64_t> host_select_plan;
  PinnedBuffer<int32_t> host_protected_pages;
  DeviceBuffer<int32_t> protected_pages;
  DeviceBuffer<uint8_t> live;
  DeviceBuffer<uint32_t> keys;
  DeviceBuffer<int32_t> kept;
  PinnedBuffer<int32_t> host_kept;
  DeviceBuffer<uint32_t> union_bits;  // per layer, the pages any group keeps
  PinnedBuffer<uint32_t> host_union_bits;
  std::vector<double> host_page_sums;
  std::vector<float> host_page_max, host_head_max;
  PinnedBuffer<int> host_bad;
};

absl::Status Scorer::State::RunBatch(
    const Policy& policy, const PolicyOptions& options, std::span<const LayerRequest> requests,
    const LayerRequest* host, std::span<const size_t> layers,
    std::vector<std::optional<absl::StatusOr<LayerDecision>>>& results) {
  const LayerRequest& first = requests[layers.front()];
  const int heads = first.query_heads;
  const int groups = first.kv_groups;
  const int r = heads / groups;
  const int64_t tokens = first.tokens;
  const int64_t pages = PageCount(tokens, options.page_size);
  const bool measure = first.measure;
  const auto count = layers.size();
  const auto rows = count * static_cast<size_t>(heads);
  const auto group_pages = count * static_cast<size_t>(groups) * static_cast<size_t>(pages);
  const auto head_pages = rows * static_cast<size_t>(pages);
  const Pooling pooling = policy.pooling();

  RETURN_IF_ERROR(layer_pointers.Reserve(count));
  RETURN_IF_ERROR(host_layer_pointers.Reserve(count));
  bool aligned = true;  // every layer's rows may be read 16 bytes at a time
  for (size_t i = 0; i < count; ++i) {
    const void* data = requests[layers[i]].statistic->data();
    host_layer_pointers.data()[i] = data;
    aligned = aligned && reinterpret_cast<uintptr_t>(data) % 16 == 0;
  }
  RETURN_IF_ERROR(
      CudaCall(cudaMemcpyAsync(layer_pointers.data(), host_layer_pointers.data(),
                               count * sizeof(const void*), cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync"));
  const kernels::Batch batch{.layers = layer_pointers.data(),
                             .layer_count = static_cast<int>(count),
                             .heads = heads,
                             .groups = groups,
                             .tokens = tokens,
                             .element = ElementOf(first.statistic->dtype())};
  RETURN_IF_ERROR(weights.Reserve(rows));
  RETURN_IF_ERROR(host_weights.Reserve(rows));
  RETURN_IF_ERROR(page_max.Reserve(group_pages));
  RETURN_IF_ERROR(bad.Reserve(count));
  if (measure) {
    RETURN_IF_ERROR(head_max.Reserve(head_pages));
    RETURN_IF_ERROR(page_sums.Reserve(group_pages));
  }
  RETURN_IF_ERROR(
      CudaCall(cudaMemsetAsync(bad.data(), 0, count * sizeof(int), stream), "cudaMemsetAsync"));
  // Pools the batch with the weights on the device.
  auto pool = [&] {
    return CudaCall(
        static_cast<cudaError_t>(kernels::LaunchPool(
            batch, PoolOf(pooling.kind), weights.data(), MeanScale(static_cast<size_t>(r)),
            options.page_size, pages, measure, aligned, page_max.data(), head_max.data(),
            page_sums.data(), bad.data(), stream)),
        "pool kernel");
  };

  // Head weights. Entropy-weighted without cached weights: the device derives them from its
  // entropy sums (portable_math.h, the CPU's bits) before the pooling, with no wait for the host,
  // and the decisions get them from the device with the entropies. Otherwise the host's: the
  // cached weights, or the mean's scale (the kernel takes the scale itself).
  const bool derived =
      pooling.kind == PoolingKind::kEntropyWeighted && first.cached_weights.empty();
  if (derived) {
    const int64_t sinks =
        std::min<int64_t>(pooling.isolate_sinks ? options.sink_tokens : 0, tokens);
    RETURN_IF_ERROR(sums.Reserve(2 * rows));
    RETURN_IF_ERROR(group_counters.Reserve(count * static_cast<size_t>(groups)));
    RETURN_IF_ERROR(entropies.Reserve(rows));
    RETURN_IF_ERROR(host_entropies.Reserve(rows));
    RETURN_IF_ERROR(
        CudaCall(cudaMemsetAsync(group_counters.data(), 0,
                                 count * static_cast<size_t>(groups) * sizeof(int), stream),
                 "cudaMemsetAsync"));
    const kernels::DerivedWeights out{.alpha = options.alpha,
                                      .tau = options.tau,
                                      .counters = group_counters.data(),
                                      .entropies = entropies.data(),
                                      .weights = weights.data()};
    RETURN_IF_ERROR(CudaCall(static_cast<cudaError_t>(kernels::LaunchEntropySums(
                                 batch, sinks, options.alpha == 2.0, sums.data(), &out, stream)),
                             "entropy kernel"));
    RETURN_IF_ERROR(pool());
    auto to_host = [&](double* dst, const double* src) {
      return CudaCall(
          cudaMemcpyAsync(dst, src, rows * sizeof(double), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    };
    RETURN_IF_ERROR(to_host(host_weights.data(), weights.data()));
    RETURN_IF_ERROR(to_host(host_entropies.data(), entropies.data()));
  } else {
    double* w = host_weights.data();
    std::fill(w, w + rows,
              pooling.kind == PoolingKind::kMean ? MeanScale(static_cast<size_t>(r)) : 0.0);
    if (pooling.kind == PoolingKind::kEntropyWeighted) {
      for (size_t i = 0; i < count; ++i) {
        const std::span<const double> cached = requests[layers[i]].cached_weights;
        std::copy(cached.begin(), cached.end(), w + i * static_cast<size_t>(heads));
      }
    }
    RETURN_IF_ERROR(CudaCall(
        cudaMemcpyAsync(weights.data(), w, rows * sizeof(double), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync"));
    RETURN_IF_ERROR(pool());
  }
  if (!measure && first.scope == SelectionScope::kGroup && !first.page_scores) {
    return SelectOnDevice(policy, options, requests, host, layers, pages, derived, results);
  }
  host_page_max.resize(group_pages);
  RETURN_IF_ERROR(host_bad.Reserve(count));
  auto to_host = [&](void* dst, const void* src, size_t bytes) {
    return CudaCall(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
                    "cudaMemcpyAsync");
  };
  RETURN_IF_ERROR(to_host(host_page_max.data(), page_max.data(), group_pages * sizeof(float)));
  RETURN_IF_ERROR(to_host(host_bad.data(), bad.data(), count * sizeof(int)));
  if (measure) {
    host_head_max.resize(head_pages);
    host_page_sums.resize(group_pages);
    RETURN_IF_ERROR(to_host(host_head_max.data(), head_max.data(), head_pages * sizeof(float)));
    RETURN_IF_ERROR(to_host(host_page_sums.data(), page_sums.data(), group_pages * sizeof(double)));
  }
  RETURN_IF_ERROR(CudaCall(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));

  const auto n = static_cast<size_t>(pages);
  for (size_t i = 0; i < count; ++i) {
    const size_t l = layers[i];
    const LayerRequest& request = requests[l];
    if (host_bad.data()[i] != 0) {
      results[l] = ValueError(request, host, l);
      continue;
    }
    LayerDecision decision = StartDecision(pooling, request, i, pages, heads, groups, derived);
    const size_t layer_group_pages = static_cast<size_t>(groups) * n;
    const std::span<const float> layer_scores(host_page_max.data() + i * layer_group_pages,
                                              layer_group_pages);
    std::span<const double> layer_sums;
    if (measure) {
      layer_sums =
          std::span<const double>(host_page_sums.data() + i * layer_group_pages, layer_group_pages);
    }
    for (int g = 0; g < groups; ++g) {
      GroupDecision& group = decision.groups[static_cast<size_t>(g)];
      const size_t first_head = i * static_cast<size_t>(heads) + static_cast<size_t>(g * r);
      GroupScores scores;
      scores.page_max = layer_scores.subspan(static_cast<size_t>(g) * n, n);
      if (measure) {
        scores.head_max = std::span<const float>(host_head_max.data() + first_head * n,
                                                 static_cast<size_t>(r) * n);
        scores.page_sums = layer_sums.subspan(static_cast<size_t>(g) * n, n);
      }
      finisher.Finish(options, request, g, r, scores, &group);
    }
    GroupFinisher::FinishLayer(options, request, layer_scores, layer_sums, &decision);
    results[l] = std::move(decision);
  }
  return absl::OkStatus();
}

LayerDecision Scorer::State::StartDecision(const Pooling& pooling, const LayerRequest& request,
                                           size_t i, int64_t pages, int heads, int groups,
                                           bool derived) const {
  const int r = heads / groups;
  LayerDecision decision;
  decision.page_count = pages;
  decision.quota_pages = request.quota_pages;
  decision.groups.resize(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    GroupDecision& group = decision.groups[static_cast<size_t>(g)];
    const size_t first_head = i * static_cast<size_t>(heads) + static_cast<size_t>(g * r);
    if (pooling.kind != PoolingKind::kMax) {
      const double* w = host_weights.data() + first_head;
      group.weights.assign(w, w + r);
    }
    if (derived) {
      const double* e = host_entropies.data() + first_head;
      group.entropies.assign(e, e + r);
    }
  }
  return decision;
}

absl::Status Scorer::State::ValueError(const LayerRequest& request, const LayerRequest* host,
                                       size_t l) {
  absl::Status status;
  if (host != nullptr) {
    status = host[l].statistic->ValidateValues();
  } else {
    const StatisticView& view = *request.statistic;
    std::vector<char> bytes(static_cast<size_t>(view.query_heads()) *
                            static_cast<size_t>(view.tokens()) *
                            static_cast<size_t>(DTypeBytes(view.dtype())));
    RETURN_IF_ERROR(CudaCall(
        cudaMemcpy(bytes.data(), view.data(), bytes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy"));
    ASSIGN_OR_RETURN(
        const StatisticView copy,
        StatisticView::Create(bytes.data(), view.dtype(), view.query_heads(), view.tokens()));
    status = copy.ValidateValues();
  }
  if (status.ok()) {
    return absl::InternalError("statistic: the device's validation disagrees with ValidateValues");
  }
  return status;
}

absl::Status Scorer::State::SelectOnDevice(
    const Policy& policy, const PolicyOptions& options, std::span<const LayerRequest> requests,
    const LayerRequest* host, std::span<const size_t> layers, int64_t pages, bool derived,
    std::vector<std::optional<absl::StatusOr<LayerDecision>>>& results) {
  const LayerRequest& first = requests[layers.front()];
  const int groups = first.kv_groups;
  const int heads = first.query_heads;
  const size_t count = layers.size();
  const size_t group_count = count * static_cast<size_t>(groups);
  const auto n = static_cast<size_t>(pages);
  // The plan: each group's quota (min(K, its live pages)), where its kept pages go, and its
  // protected pages (the shared rules); the live masks when any layer has some.
  std::vector<int64_t> plan(3 * group_count + 1, 0);
  int64_t* quotas = plan.data();
  int64_t* out_offsets = plan.data() + group_count;
  int64_t* protected_offsets = plan.data() + 2 * group_count;  // group_count + 1 entries
  std::vector<int32_t> protected_list;
  const bool any_live = std::any_of(layers.begin(), layers.end(),
                                    [&](size_t l) { return !requests[l].live_pages.empty(); });
  std::vector<uint8_t> live_flat(any_live ? group_count * n : 0, 1);
  int64_t total_kept = 0;
  for (size_t i = 0; i < count; ++i) {
    const LayerRequest& request = requests[layers[i]];
    for (int g = 0; g < groups; ++g) {
      const size_t lg = i * static_cast<size_t>(groups) + static_cast<size_t>(g);
      const std::span<const uint8_t> live = GroupLivePages(request, pages, g);
      const int64_t live_count =
          live.empty() ? pages
                       : std::count_if(live.begin(), live.end(), [](uint8_t v) { return v != 0; });
      const int64_t quota = std::min(request.quota_pages, live_count);
      quotas[lg] = quota;
      out_offsets[lg] = total_kept;
      total_kept += quota;
      protected_offsets[lg] = static_cast<int64_t>(protected_list.size());
      if (quota > 0) {
        for (const int32_t page : ProtectedPagesOf(options, request.tokens, quota, live)) {
          protected_list.push_back(page);
        }
      }
      if (!live.empty()) std::copy(live.begin(), live.end(), live_flat.begin() + lg * n);
    }
  }
  protected_offsets[group_count] = static_cast<int64_t>(protected_list.size());
  RETURN_IF_ERROR(select_plan.Reserve(plan.size()));
  RETURN_IF_ERROR(protected_pages.Reserve(protected_list.size()));
  RETURN_IF_ERROR(keys.Reserve(group_count * n));
  RETURN_IF_ERROR(kept.Reserve(static_cast<size_t>(total_kept)));
  RETURN_IF_ERROR(host_kept.Reserve(static_cast<size_t>(total_kept)));
  auto to_device = [&](void* dst, const void* src, size_t bytes) {
    return CudaCall(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync");
  };
  // Through pinned memory, so the copies neither stage nor wait.
  RETURN_IF_ERROR(host_select_plan.Reserve(plan.size()));
  RETURN_IF_ERROR(host_protected_pages.Reserve(protected_list.size()));
  std::copy(plan.begin(), plan.end(), host_select_plan.data());
  std::copy(protected_list.begin(), protected_list.end(), host_protected_pages.data());
  RETURN_IF_ERROR(
      to_device(select_plan.data(), host_select_plan.data(), plan.size() * sizeof(int64_t)));
  RETURN_IF_ERROR(to_device(protected_pages.data(), host_protected_pages.data(),
                            protected_list.size() * sizeof(int32_t)));
  if (any_live) {
    RETURN_IF_ERROR(live.Reserve(live_flat.size()));
    RETURN_IF_ERROR(to_device(live.data(), live_flat.data(), live_flat.size()));
  }
  const size_t union_words = count * static_cast<size_t>((pages + 31) / 32);
  RETURN_IF_ERROR(union_bits.Reserve(union_words));
  RETURN_IF_ERROR(host_union_bits.Reserve(union_words));
  RETURN_IF_ERROR(
      CudaCall(cudaMemsetAsync(union_bits.data(), 0, union_words * sizeof(uint32_t), stream),
               "cudaMemsetAsync"));
  RETURN_IF_ERROR(
      CudaCall(static_cast<cudaError_t>(kernels::LaunchSelect(
                   static_cast<int>(group_count), page_max.data(), pages,
                   any_live ? live.data() : nullptr, select_plan.data() + 2 * group_count,
                   protected_pages.data(), select_plan.data(), select_plan.data() + group_count,
                   keys.data(), kept.data(), groups, union_bits.data(), stream)),
               "select kernel"));
  RETURN_IF_ERROR(
      CudaCall(cudaMemcpyAsync(host_union_bits.data(), union_bits.data(),
                               union_words * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync"));
  RETURN_IF_ERROR(host_bad.Reserve(count));
  RETURN_IF_ERROR(CudaCall(cudaMemcpyAsync(host_kept.data(), kept.data(),
                                           static_cast<size_t>(total_kept) * sizeof(int32_t),
                                           cudaMemcpyDeviceToHost, stream),
                           "cudaMemcpyAsync"));
  RETURN_IF_ERROR(CudaCall(cudaMemcpyAsync(host_bad.data(), bad.data(), count * sizeof(int),
                                           cudaMemcpyDeviceToHost, stream),
                           "cudaMemcpyAsync"));
  RETURN_IF_ERROR(CudaCall(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  const Pooling pooling = policy.pooling();
  for (size_t i = 0; i < count; ++i) {
    const size_t l = layers[i];
    const LayerRequest& request = requests[l];
    if (host_bad.data()[i] != 0) {
      results[l] = ValueError(request, host, l);
      continue;
    }
    LayerDecision decision = StartDecision(pooling, request, i, pages, heads, groups, derived);
    for (int g = 0; g < groups; ++g) {
      GroupDecision& group = decision.groups[static_cast<size_t>(g)];
      const size_t lg = i * static_cast<size_t>(groups) + static_cast<size_t>(g);
      const int32_t* begin = host_kept.data() + out_offsets[lg];
      group.kept_pages.assign(begin, begin + quotas[lg]);
    }
    // FinishGroupScope's union, from the layer's bitmap the device set.
    const size_t words = static_cast<size_t>((pages + 31) / 32);
    int64_t union_pages = 0;
    for (size_t w = 0; w < words; ++w)
      union_pages += std::popcount(host_union_bits.data()[i * words + w]);
    decision.scope = SelectionScope::kGroup;
    decision.union_pages = union_pages;
    decision.group_scope_union_pages = union_pages;
    results[l] = std::move(decision);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerDecision>> Scorer::State::Decide(
    const Policy& policy, const PolicyOptions& options, std::span<const LayerRequest> requests,
    const LayerRequest* host) {
  const DeviceScope scope(device);
  std::optional<FusedScorer> cpu;  // for the layers the device does not score
  std::vector<std::optional<absl::StatusOr<LayerDecision>>> results(requests.size());
  std::vector<size_t> on_device;
  for (size_t l = 0; l < requests.size(); ++l) {
    const LayerRequest& request = requests[l];
    if (absl::Status status = ValidateLayerRequest(policy, options, request, false); !status.ok()) {
      results[l] = status;
    } else if (absl::Status cancelled = CheckCancelled(request, 0); !cancelled.ok()) {
      results[l] = cancelled;
    } else if (!ScoresOnDevice(policy, options, request)) {
      // Decided on the CPU: from the host view, or from a host copy of a device statistic.
      if (!cpu.has_value()) cpu.emplace(options);
      if (host != nullptr || !request.statistic.has_value()) {
        results[l] = cpu->DecideLayer(policy, host != nullptr ? host[l] : request);
      } else {
        std::vector<char> bytes;
        LayerRequest copy = request;
        ASSIGN_OR_RETURN(copy.statistic, HostCopy(*request.statistic, &bytes));
        results[l] = cpu->DecideLayer(policy, copy);
      }
    } else {
      on_device.push_back(l);
    }
  }
  // Runs of layers that share a shape, at most 65535 groups a launch (the grid's y).
  for (size_t begin = 0; begin < on_device.size();) {
    const LayerRequest& first = requests[on_device[begin]];
    const size_t most = std::max<size_t>(1, 65535 / static_cast<size_t>(first.kv_groups));
    size_t end = begin + 1;
    while (end < on_device.size() && end - begin < most &&
           SameBatch(first, requests[on_device[end]])) {
      ++end;
    }
    RETURN_IF_ERROR(RunBatch(policy, options, requests, host,
                             std::span<const size_t>(on_device).subspan(begin, end - begin),
                             results));
    begin = end;
  }
  return InLayerOrder(results);
}

Scorer::Scorer(std::unique_ptr<State> state) : state_(std::move(state)) {}
Scorer::~Scorer() = default;

int Scorer::device() const { return state_->device; }

absl::StatusOr<std::unique_ptr<Scorer>> Scorer::Create(int device) {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess || count == 0) {
    return absl::UnavailableError(
        absl::StrCat("scorer: cuda has no usable device: ",
                     error != cudaSuccess ? cudaGetErrorString(error) : "no device"));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("device: CUDA device ", device,
                                                   " does not exist (this host has ", count,
                                                   count == 1 ? " device)" : " devices)"));
  }
  auto state = std::make_unique<State>(device);
  const DeviceScope scope(device);
  RETURN_IF_ERROR(CudaCall(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking),
                           "cudaStreamCreate"));
  return std::unique_ptr<Scorer>(new Scorer(std::move(state)));
}

absl::StatusOr<std::vector<LayerDecision>> Scorer::DecideModelOnDevice(
    const Policy& policy, const PolicyOptions& options, std::span<const LayerRequest> requests) {
  return state_->Decide(policy, options, requests, nullptr);
}

absl::StatusOr<std::vector<LayerDecision>> Scorer::DecideModel(
    const Policy& policy, const PolicyOptions& options, std::span<const LayerRequest> requests) {
  State& state = *state_;
  const DeviceScope scope(state.device);
  // The device copies of the statistics the device scores, back to back in one staging buffer.
  // Only layers whose shape is valid: the others get their error from Decide.
  std::vector<size_t> offsets(requests.size(), 0);
  std::vector<bool> staged(requests.size(), false);
  auto bytes_of = [](const StatisticView& view) {
    return static_cast<size_t>(view.query_heads()) * static_cast<size_t>(view.tokens()) *
           static_cast<size_t>(DTypeBytes(view.dtype()));
  };
  size_t total = 0;
  for (size_t l = 0; l < requests.size(); ++l) {
    const LayerRequest& request = requests[l];
    staged[l] = ScoresOnDevice(policy, options, request) &&
                ValidateLayerRequest(policy, options, request, false).ok();
    if (!staged[l]) continue;
    offsets[l] = total;
    total += (bytes_of(*request.statistic) + 255) / 256 * 256;  // aligned for every dtype
  }
  RETURN_IF_ERROR(state.staging.Reserve(total));
  std::vector<LayerRequest> on_device(requests.begin(), requests.end());
  for (size_t l = 0; l < requests.size(); ++l) {
    if (!staged[l]) continue;
    const StatisticView& view = *requests[l].statistic;
    const size_t bytes = bytes_of(view);
    char* at = state.staging.data() + offsets[l];
    RETURN_IF_ERROR(
        CudaCall(cudaMemcpyAsync(at, view.data(), bytes, cudaMemcpyHostToDevice, state.stream),
                 "cudaMemcpyAsync"));
    ASSIGN_OR_RETURN(const StatisticView device_view,
                     StatisticView::Create(at, view.dtype(), view.query_heads(), view.tokens()));
    on_device[l].statistic = device_view;
  }
  return state.Decide(policy, options, on_device, requests.data());
}

}  // namespace entrokv::cuda
