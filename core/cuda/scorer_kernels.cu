// Why these kernels give the CPU path's bits (core/scoring/fused_scorer.cc says it for the CPU):
//  - Entropy sums: thread k of a row's block is lane k of entropy.h's striped order, adding its
//    values in order from +0, and the block folds the lanes in the same pairwise order. Every
//    operation is an explicit round-to-nearest intrinsic, so nvcc contracts nothing into an FMA.
//  - Entropies and head weights: portable_math.h's functions, the CPU's own, through those
//    intrinsics.
//  - Pooling: one thread per token (or per 16 bytes of tokens, each added on its own) adds
//    w_h * x_h (or x_h) head by head from +0 in double and rounds once to float, as PoolRows and
//    MeanRows do; the max starts at +0 and takes
//    x > acc ? x : acc, as the CPU's maxps does.
//  - Page maxima: no NaN and no -0 in the pooled row, so the max is the same in any order; a
//    head's page maximum may differ in the sign of a zero, which its selection key ignores.
//  - Page sums of the head-mean row: one thread per page adds its tokens in order from +0.
//  - Selection: radix_select.cc's keys, and the same rule (the quota largest keys, ties to the
//    lower page): an MSD radix select finds the quota-th key and how many of its equals are
//    kept, and a block scan in page order emits the kept pages ascending.
#include "core/cuda/scorer_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "core/scoring/portable_math.h"

namespace entrokv::cuda::kernels {
namespace {

constexpr int kPoolThreads = 256;
constexpr int kTileTokens = 2048;  // tokens of pooled row one block holds (whole pages)
constexpr int kLoadBatch = 8;      // loads (heads) a pooling thread has in flight
constexpr int kVectorBatch = 4;    // 16-byte loads (heads) an aligned pooling thread has in flight
constexpr int kPoolBlocksPerSm = 3;
constexpr int kEntropyDepth = 16;  // loads an entropy lane has in flight

// portable_math.h's arithmetic on the device: round-to-nearest intrinsics, never an FMA.
struct DeviceArithmetic {
  __device__ static double Add(double a, double b) { return __dadd_rn(a, b); }
  __device__ static double Sub(double a, double b) { return __dsub_rn(a, b); }
  __device__ static double Mul(double a, double b) { return __dmul_rn(a, b); }
  __device__ static double Div(double a, double b) { return __ddiv_rn(a, b); }
  __device__ static double Frexp(double x, int* exponent) { return frexp(x, exponent); }
  __device__ static double Ldexp(double x, int exponent) { return ldexp(x, exponent); }
  __device__ static double Rint(double x) { return rint(x); }
};

// Elements of 16 bytes.
template <int kElement>
inline constexpr int kVector = kElement == kF32 ? 4 : 8;

template <int kElement>
__device__ __forceinline__ float Load(const void* base, int64_t index) {
  if constexpr (kElement == kF32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kElement == kF16) {
    return __half2float(static_cast<const __half*>(base)[index]);
  } else {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
  }
}

// The 16 bytes at element `index` (a multiple of kVector, the address 16-byte aligned) as floats.
template <int kElement>
__device__ __forceinline__ void LoadVector(const void* base, int64_t index,
                                           float (&out)[kVector<kElement>]) {
  if constexpr (kElement == kF32) {
    const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + index);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else {
    using Pair = std::conditional_t<kElement == kF16, __half2, __nv_bfloat162>;
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const Pair*>(base) + index / 2);
    const Pair* pairs = reinterpret_cast<const Pair*>(&raw);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float2 f;
      if constexpr (kElement == kF16) {
        f = __half22float2(pairs[q]);
      } else {
        f = __bfloat1622float2(pairs[q]);
      }
      out[2 * q] = f.x;
      out[2 * q + 1] = f.y;
    }
  }
}

template <bool kSquares>
__device__ __forceinline__ void AddToLane(float value, double& total, double& power) {
  const double x = static_cast<double>(value);
  total = __dadd_rn(total, x);
  if constexpr (kSquares) {
    power = __dadd_rn(power, __dmul_rn(x, x));
  } else {
    power = power < x ? x : power;  // std::max(power, x)
  }
}

// The group's entropies and weights, by the last of its row blocks to finish (DerivedWeights).
__device__ void DeriveWeights(const double2* sums, int lg, int r, int64_t support,
                              const DerivedWeights& derived) {
  __shared__ bool last;
  __syncthreads();  // sums[row] is written (thread 0)
  if (threadIdx.x == 0) {
    __threadfence();  // the row's sums before the count that publishes them
    last = atomicAdd(derived.counters + lg, 1) == r - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other rows' sums after their counts
  const int64_t first_row = static_cast<int64_t>(lg) * r;
  for (int i = threadIdx.x; i < r; i += blockDim.x) {
    const double2 row = __ldcg(sums + first_row + i);
    derived.entropies[first_row + i] =
        portable::EntropyOfSums<DeviceArithmetic>(row.x, row.y, derived.alpha, support);
  }
  __syncthreads();  // the entropies are visible to thread 0
  if (threadIdx.x == 0) {
    portable::SoftminWeights<DeviceArithmetic>(derived.entropies + first_row, r, derived.tau,
                                               derived.weights + first_row);
  }
}

template <int kElement, bool kSquares>
__global__ void __launch_bounds__(kLanes)
    EntropySumsKernel(const void* const* layers, int heads, int groups, int64_t tokens,
                      int64_t sinks, double2* sums, DerivedWeights derived) {
  const int row = blockIdx.x;
  const int layer = row / heads;
  const int head = row % heads;
  const void* data = layers[layer];
  const int64_t first = static_cast<int64_t>(head) * tokens + sinks;
  const int64_t count = tokens - sinks;
  double total = 0.0;
  double power = 0.0;
  // kEntropyDepth of the lane's values are loaded before any is added (they overlap in memory);
  // the lane adds them in order.
  int64_t j = threadIdx.x;
  for (; j + (kEntropyDepth - 1) * kLanes < count; j += kEntropyDepth * kLanes) {
    float xs[kEntropyDepth];
#pragma unroll
    for (int i = 0; i < kEntropyDepth; ++i) xs[i] = Load<kElement>(data, first + j + i * kLanes);
#pragma unroll
    for (int i = 0; i < kEntropyDepth; ++i) AddToLane<kSquares>(xs[i], total, power);
  }
  for (; j < count; j += kLanes) AddToLane<kSquares>(Load<kElement>(data, first + j), total, power);
  __shared__ double lane_total[kLanes];
  __shared__ double lane_power[kLanes];
  const int k = threadIdx.x;
  lane_total[k] = total;
  lane_power[k] = power;
  __syncthreads();
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    if (k < width) {
      lane_total[k] = __dadd_rn(lane_total[k], lane_total[k + width]);
      if constexpr (kSquares) {
        lane_power[k] = __dadd_rn(lane_power[k], lane_power[k + width]);
      } else {
        const double a = lane_power[k];
        const double b = lane_power[k + width];
        lane_power[k] = a < b ? b : a;  // std::max(a, b)
      }
    }
    __syncthreads();
  }
  if (k == 0) sums[row] = make_double2(lane_total[0], lane_power[0]);
  if (derived.counters != nullptr) {
    const int r = heads / groups;
    DeriveWeights(sums, layer * groups + head / r, r, count, derived);
  }
}

__device__ __forceinline__ bool ValueOk(float x) { return x >= 0.0f && x < INFINITY; }

// One token's pooling, a head at a time in head order (PoolRows, MeanRows, the max).
template <int kPool, bool kMeasure>
struct TokenPool {
  double acc = 0.0;
  double sum = 0.0;
  float max_acc = 0.0f;
  __device__ __forceinline__ void Add(float x, double w, bool& ok) {
    ok = ok && ValueOk(x);
    if constexpr (kPool == kMax) max_acc = x > max_acc ? x : max_acc;
    if constexpr (kPool == kWeighted) acc = __dadd_rn(acc, __dmul_rn(w, static_cast<double>(x)));
    if constexpr (kPool == kMean || kMeasure) sum = __dadd_rn(sum, static_cast<double>(x));
  }
  // The pooled value, and the head-mean row's (measure).
  __device__ __forceinline__ void Store(double scale, float* pooled, float* second) const {
    const float mean = __double2float_rn(__dmul_rn(sum, scale));
    *pooled = kPool == kMax ? max_acc : kPool == kWeighted ? __double2float_rn(acc) : mean;
    if constexpr (kMeasure) *second = mean;
  }
};

// Block (x, y): pages [x * tile_pages, ...) of group y = l * groups + g. kAligned: the rows and
// the tile start at 16-byte boundaries, so whole 16 bytes of a row are loaded at once.
template <int kElement, int kPool, bool kMeasure, bool kAligned>
__global__ void __launch_bounds__(kPoolThreads, kPoolBlocksPerSm)
    PoolKernel(const void* const* layers, int heads, int groups, int64_t tokens,
               const double* weights, double scale, int page_size, int tile_pages, int64_t pages,
               float* page_max, float* head_max, double* page_sums, int* bad) {
  extern __shared__ float shared[];
  const int tile_capacity = tile_pages * page_size;
  float* pooled = shared;                  // the tile's pooled row
  float* second = shared + tile_capacity;  // measure: the head-mean row, then each head's row
  const int r = heads / groups;
  const int lg = blockIdx.y;
  const int layer = lg / groups;
  const int group = lg % groups;
  const int64_t first_page = static_cast<int64_t>(blockIdx.x) * tile_pages;
  const int64_t first_token = first_page * page_size;
  const int64_t tile_tokens_64 = tokens - first_token;
  const int tile_tokens =
      static_cast<int>(tile_tokens_64 < tile_capacity ? tile_tokens_64 : tile_capacity);
  const int tile_real_pages = (tile_tokens + page_size - 1) / page_size;
  const void* data = layers[layer];
  const int64_t row0 = static_cast<int64_t>(group) * r * tokens + first_token;
  const double* w = weights + static_cast<int64_t>(layer) * heads + group * r;
  bool ok = true;
  // The heads' loads go out kLoadBatch at a time (independent, so they overlap in memory), then
  // the arithmetic takes them in head order. Aligned: kV tokens a thread, 16 bytes a load,
  // kVectorBatch heads at a time.
  constexpr int kV = kVector<kElement>;
  const int vector_tokens = kAligned ? tile_tokens / kV * kV : 0;
  for (int k = threadIdx.x * kV; k < vector_tokens; k += kPoolThreads * kV) {
    TokenPool<kPool, kMeasure> token[kV];
    for (int i0 = 0; i0 < r; i0 += kVectorBatch) {
      float xs[kVectorBatch][kV];
#pragma unroll
      for (int j = 0; j < kVectorBatch; ++j) {
        if (i0 + j < r) {
          LoadVector<kElement>(data, row0 + static_cast<int64_t>(i0 + j) * tokens + k, xs[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kVectorBatch; ++j) {
        if (i0 + j >= r) break;
        const double wj = kPool == kWeighted ? w[i0 + j] : 0.0;
#pragma unroll
        for (int v = 0; v < kV; ++v) token[v].Add(xs[j][v], wj, ok);
      }
    }
#pragma unroll
    for (int v = 0; v < kV; ++v) token[v].Store(scale, pooled + k + v, second + k + v);
  }
  for (int k = vector_tokens + threadIdx.x; k < tile_tokens; k += kPoolThreads) {
    TokenPool<kPool, kMeasure> token;
    for (int i0 = 0; i0 < r; i0 += kLoadBatch) {
      float xs[kLoadBatch];
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        xs[j] = i0 + j < r ? Load<kElement>(data, row0 + static_cast<int64_t>(i0 + j) * tokens + k)
                           : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        if (i0 + j >= r) break;
        token.Add(xs[j], kPool == kWeighted ? w[i0 + j] : 0.0, ok);
      }
    }
    token.Store(scale, pooled + k, second + k);
  }
  if (!__syncthreads_and(ok) && threadIdx.x == 0) atomicExch(bad + layer, 1);
  const int64_t out = static_cast<int64_t>(lg) * pages + first_page;
  for (int p = threadIdx.x; p < tile_real_pages; p += kPoolThreads) {
    const int begin = p * page_size;
    const int end = begin + page_size < tile_tokens ? begin + page_size : tile_tokens;
    float m = pooled[begin];
    for (int t = begin + 1; t < end; ++t) m = pooled[t] > m ? pooled[t] : m;
    page_max[out + p] = m;
    if constexpr (kMeasure) {
      double s = 0.0;
      for (int t = begin; t < end; ++t) s = __dadd_rn(s, static_cast<double>(second[t]));
      page_sums[out + p] = s;
    }
  }
  if constexpr (kMeasure) {
    for (int i = 0; i < r; ++i) {
      __syncthreads();  // `second` is free: every page sum (or the last head's maxima) is done
      for (int k = threadIdx.x; k < tile_tokens; k += kPoolThreads) {
        second[k] = Load<kElement>(data, row0 + static_cast<int64_t>(i) * tokens + k);
      }
      __syncthreads();
      const int64_t head_out =
          (static_cast<int64_t>(layer) * heads + group * r + i) * pages + first_page;
      for (int p = threadIdx.x; p < tile_real_pages; p += kPoolThreads) {
        const int begin = p * page_size;
        const int end = begin + page_size < tile_tokens ? begin + page_size : tile_tokens;
        float m = second[begin];
        for (int t = begin + 1; t < end; ++t) m = second[t] > m ? second[t] : m;
        head_max[head_out + p] = m;
      }
    }
  }
}

constexpr int kSelectThreads = 1024;

__device__ __forceinline__ uint32_t ScoreKey(float value) {
  return value == 0.0f ? 0u : __float_as_uint(value);  // radix_select.cc's ScoreBits
}

// Exclusive rank of `flag` among the block's threads, and the block's total, by warp ballots.
// Every thread of the block must call it.
__device__ __forceinline__ int BlockRank(bool flag, int* warp_counts, int* total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1u));
  __syncthreads();  // warp_counts is free (the previous call's readers are done)
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = 0;
  int sum = 0;
  for (int w = 0; w < kSelectThreads / 32; ++w) {
    if (w < warp) before += warp_counts[w];
    sum += warp_counts[w];
  }
  *total = sum;
  return before + in_warp;
}

__global__ void __launch_bounds__(kSelectThreads)
    SelectKernel(const float* page_max, int64_t pages, const uint8_t* live,
                 const int64_t* protected_offsets, const int32_t* protected_pages,
                 const int64_t* quotas, const int64_t* out_offsets, uint32_t* keys, int32_t* out,
                 int groups, uint32_t* layer_bits) {
  const int lg = blockIdx.x;
  const int64_t quota = quotas[lg];
  if (quota <= 0) return;
  const float* scores = page_max + static_cast<int64_t>(lg) * pages;
  uint32_t* key = keys + static_cast<int64_t>(lg) * pages;
  const uint8_t* held = live != nullptr ? live + static_cast<int64_t>(lg) * pages : nullptr;
  for (int64_t p = threadIdx.x; p < pages; p += kSelectThreads) {
    uint32_t k = ScoreKey(scores[p]);
    if (held != nullptr) k = held[p] != 0 ? k + 1 : 0;
    key[p] = k;
  }
  __syncthreads();
  for (int64_t i = protected_offsets[lg] + threadIdx.x; i < protected_offsets[lg + 1];
       i += kSelectThreads) {
    key[protected_pages[i]] |= 1u << 31;
  }
  __syncthreads();
  // The quota-th largest key, a byte at a time from the top; `remaining` ends as how many keys
  // equal to it are kept.
  using Scan = cub::BlockScan<long long, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ unsigned int histogram[256];
  __shared__ uint32_t shared_prefix;
  __shared__ long long shared_remaining;
  uint32_t prefix = 0;
  uint32_t mask = 0;
  long long remaining = quota;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kSelectThreads) histogram[b] = 0;
    __syncthreads();
    for (int64_t p = threadIdx.x; p < pages; p += kSelectThreads) {
      const uint32_t k = key[p];
      if ((k & mask) == prefix) atomicAdd(&histogram[(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    // The byte: the highest bin b whose keys and those above reach `remaining` (bin 0 if none);
    // thread i holds bin 255 - i, so a prefix sum over threads counts each bin and those above.
    const int b = 255 - static_cast<int>(threadIdx.x);
    const long long here = b >= 0 ? histogram[b] : 0;
    long long through = 0;  // keys in bins >= b
    Scan(scan_storage).InclusiveSum(here, through);
    const long long above = through - here;
    if (b >= 0 && above < remaining && (through >= remaining || b == 0)) {
      shared_prefix = prefix | (static_cast<uint32_t>(b) << shift);
      shared_remaining = remaining - above;
    }
    __syncthreads();
    prefix = shared_prefix;
    remaining = shared_remaining;
    mask |= 255u << shift;
  }
  const uint32_t boundary = prefix;
  __shared__ int warp_counts[kSelectThreads / 32];
  int32_t* kept = out + out_offsets[lg];
  long long equals_before = 0;  // keys equal to the boundary in earlier chunks
  long long kept_before = 0;
  for (int64_t chunk = 0; chunk < pages; chunk += kSelectThreads) {
    const int64_t p = chunk + threadIdx.x;
    const uint32_t k = p < pages ? key[p] : 0u;
    const bool equal = p < pages && k == boundary;
    int equals_here = 0;
    const int equal_rank = BlockRank(equal, warp_counts, &equals_here);
    const bool keep =
        p < pages && (k > boundary || (equal && equals_before + equal_rank < remaining));
    int kept_here = 0;
    const int position = BlockRank(keep, warp_counts, &kept_here);
    if (keep) kept[kept_before + position] = static_cast<int32_t>(p);
    // The layer's union: a warp's 32 pages are one word of its bitmap.
    const unsigned word = __ballot_sync(0xffffffffu, keep);
    if ((threadIdx.x & 31) == 0 && word != 0) {
      const int64_t words = (pages + 31) / 32;
      atomicOr(layer_bits + static_cast<int64_t>(lg / groups) * words + (p >> 5), word);
    }
    equals_before += equals_here;
    kept_before += kept_here;
  }
}

template <int kElement>
int LaunchEntropyFor(const Batch& batch, int64_t sinks, bool squares, double* sums,
                     const DerivedWeights* derived, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(batch.layer_count * batch.heads));
  auto* out = reinterpret_cast<double2*>(sums);
  const DerivedWeights weights = derived != nullptr ? *derived : DerivedWeights{};
  if (squares) {
    EntropySumsKernel<kElement, true><<<grid, kLanes, 0, stream>>>(
        batch.layers, batch.heads, batch.groups, batch.tokens, sinks, out, weights);
  } else {
    EntropySumsKernel<kElement, false><<<grid, kLanes, 0, stream>>>(
        batch.layers, batch.heads, batch.groups, batch.tokens, sinks, out, weights);
  }
  return static_cast<int>(cudaGetLastError());
}

// The arguments of a pool launch, past the kernel's template choices.
struct PoolLaunch {
  const Batch& batch;
  const double* weights;
  double scale;
  int page_size;
  int64_t pages;
  float* page_max;
  float* head_max;
  double* page_sums;
  int* bad;
  cudaStream_t stream;
};

template <int kElement, int kPool, bool kMeasure, bool kAligned>
int LaunchPoolFor(const PoolLaunch& a) {
  const int tile_pages = a.page_size >= kTileTokens ? 1 : kTileTokens / a.page_size;
  const int64_t tiles = (a.pages + tile_pages - 1) / tile_pages;
  const dim3 grid(static_cast<unsigned>(tiles),
                  static_cast<unsigned>(a.batch.layer_count * a.batch.groups));
  const size_t shared =
      static_cast<size_t>(tile_pages) * a.page_size * sizeof(float) * (kMeasure ? 2 : 1);
  PoolKernel<kElement, kPool, kMeasure, kAligned><<<grid, kPoolThreads, shared, a.stream>>>(
      a.batch.layers, a.batch.heads, a.batch.groups, a.batch.tokens, a.weights, a.scale,
      a.page_size, tile_pages, a.pages, a.page_max, a.head_max, a.page_sums, a.bad);
  return static_cast<int>(cudaGetLastError());
}

template <int kElement, int kPool>
int LaunchPoolKind(const PoolLaunch& a, bool measure, bool aligned) {
  if (measure) {
    return aligned ? LaunchPoolFor<kElement, kPool, true, true>(a)
                   : LaunchPoolFor<kElement, kPool, true, false>(a);
  }
  return aligned ? LaunchPoolFor<kElement, kPool, false, true>(a)
                 : LaunchPoolFor<kElement, kPool, false, false>(a);
}

template <int kElement>
int LaunchPoolElement(const PoolLaunch& a, int pool, bool measure, bool aligned) {
  // 16-byte loads need every row and every tile to start on a 16-byte boundary.
  const int tile_tokens =
      a.page_size >= kTileTokens ? a.page_size : kTileTokens / a.page_size * a.page_size;
  aligned =
      aligned && a.batch.tokens % kVector<kElement> == 0 && tile_tokens % kVector<kElement> == 0;
  switch (pool) {
    case kWeighted:
      return LaunchPoolKind<kElement, kWeighted>(a, measure, aligned);
    case kMean:
      return LaunchPoolKind<kElement, kMean>(a, measure, aligned);
    default:
      return LaunchPoolKind<kElement, kMax>(a, measure, aligned);
  }
}

}  // namespace

int LaunchSelect(int group_count, const float* page_max, int64_t pages, const uint8_t* live,
                 const int64_t* protected_offsets, const int32_t* protected_pages,
                 const int64_t* quotas, const int64_t* out_offsets, uint32_t* keys, int32_t* out,
                 int groups, uint32_t* layer_bits, void* stream) {
  SelectKernel<<<static_cast<unsigned>(group_count), kSelectThreads, 0,
                 static_cast<cudaStream_t>(stream)>>>(page_max, pages, live, protected_offsets,
                                                      protected_pages, quotas, out_offsets, keys,
                                                      out, groups, layer_bits);
  return static_cast<int>(cudaGetLastError());
}

int LaunchEntropySums(const Batch& batch, int64_t sinks, bool squares, double* sums,
                      const DerivedWeights* derived, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  switch (batch.element) {
    case kF32:
      return LaunchEntropyFor<kF32>(batch, sinks, squares, sums, derived, s);
    case kF16:
      return LaunchEntropyFor<kF16>(batch, sinks, squares, sums, derived, s);
    default:
      return LaunchEntropyFor<kBF16>(batch, sinks, squares, sums, derived, s);
  }
}

int LaunchPool(const Batch& batch, int pool, const double* weights, double scale, int page_size,
               int64_t pages, bool measure, bool aligned, float* page_max, float* head_max,
               double* page_sums, int* bad, void* stream) {
  const PoolLaunch a{batch,    weights,  scale,     page_size, pages,
                     page_max, head_max, page_sums, bad,       static_cast<cudaStream_t>(stream)};
  switch (batch.element) {
    case kF32:
      return LaunchPoolElement<kF32>(a, pool, measure, aligned);
    case kF16:
      return LaunchPoolElement<kF16>(a, pool, measure, aligned);
    default:
      return LaunchPoolElement<kBF16>(a, pool, measure, aligned);
  }
}

}  // namespace entrokv::cuda::kernels
