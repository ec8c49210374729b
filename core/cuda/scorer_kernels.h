// The CUDA scorer's kernels (scorer.h) behind plain launch functions: no CUDA or project type
// crosses this header, so the host side (scorer.cc) stays C++20 and the kernels nvcc's C++17.
// Every launch is asynchronous on `stream` (a cudaStream_t) and returns the launch's error code
// (0 = cudaSuccess).
#ifndef ENTROKV_CORE_CUDA_SCORER_KERNELS_H_
#define ENTROKV_CORE_CUDA_SCORER_KERNELS_H_

#include <cstdint>

namespace entrokv::cuda::kernels {

// Threads per block of the entropy kernel: one per lane of entropy.h's kEntropyLanes.
inline constexpr int kLanes = 256;

enum ElementType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };
enum PoolKind : int { kWeighted = 0, kMean = 1, kMax = 2 };

// The rows of a batch of layers that share a shape: layer l's statistic [heads, tokens] of
// `element` at layers[l] (device memory; `layers` itself is a device array).
struct Batch {
  const void* const* layers = nullptr;
  int layer_count = 0;
  int heads = 0;
  int groups = 0;
  int64_t tokens = 0;
  int element = kF32;
};

// Where the entropy kernel puts each group's head weights when it derives them: the last of a
// group's r row blocks to finish (counted in counters[l * groups + g], zeroed by the caller)
// computes the group's entropies and softmin weights from its rows' sums with portable_math.h's
// functions (the CPU's bits) into entropies[row] and weights[row].
struct DerivedWeights {
  double alpha = 2.0;  // 2 or inf, as `squares`
  double tau = 1.0;
  int* counters = nullptr;
  double* entropies = nullptr;
  double* weights = nullptr;
};

// sums[row] = {total, power} of row = l * heads + h over tokens [sinks, tokens), in entropy.h's
// striped order; power sums squares when `squares`, else takes the max (alpha inf). With
// `derived` (may be null), the head weights too.
int LaunchEntropySums(const Batch& batch, int64_t sinks, bool squares, double* sums,
                      const DerivedWeights* derived, void* stream);

// One pass over every group's rows: the pooled row (`pool` with weights[l * heads + h]; scale =
// 1 / r for the mean) and its page maxima into page_max[(l * groups + g) * pages + b]; with
// `measure`, each head's page maxima into head_max[(l * heads + h) * pages + b] and the page sums
// of the head-mean row into page_sums[(l * groups + g) * pages + b]. bad[l] becomes 1 when a
// value of layer l is negative (not -0) or not finite. `aligned`: every layer's data is 16-byte
// aligned, so rows whose length is a multiple of 16 bytes are read 16 bytes a load. REQUIRES:
// page_size <= kMaxPageSize.
inline constexpr int kMaxPageSize = 4096;
int LaunchPool(const Batch& batch, int pool, const double* weights, double scale, int page_size,
               int64_t pages, bool measure, bool aligned, float* page_max, float* head_max,
               double* page_sums, int* bad, void* stream);

// The selection of group scope, every group of the batch in one launch (block lg = l * groups +
// g), with radix_select.h's keys and rule: key = the score's bits (+0 for -0), plus one for a
// live page and 0 for an evicted one where live[lg * pages + b] is given (live null: every page
// live), bit 31 for the protected pages protected_pages[protected_offsets[lg] ..
// protected_offsets[lg + 1]); the quotas[lg] largest keys are kept, ties to the lower page, and
// written ascending to out[out_offsets[lg] ...]. keys holds groups * pages scratch keys. Each
// kept page's bit is set in its layer's bitmap, layer_bits[l * ceil(pages / 32) ...] (zeroed by
// the caller; l = lg / groups): the union of the layer's groups.
int LaunchSelect(int group_count, const float* page_max, int64_t pages, const uint8_t* live,
                 const int64_t* protected_offsets, const int32_t* protected_pages,
                 const int64_t* quotas, const int64_t* out_offsets, uint32_t* keys, int32_t* out,
                 int groups, uint32_t* layer_bits, void* stream);

}  // namespace entrokv::cuda::kernels

#endif  // ENTROKV_CORE_CUDA_SCORER_KERNELS_H_
