// The SIMD kernels of the fused scorer (fused_scorer.h): the pooled chunk of a group's rows with
// its validation, and page maxima (the entropy sums are entropy.h's own striped lanes). Each gives
// the reference's bits (see fused_scorer.cc for why); the AVX2 forms are compiled for that target
// only and chosen at run time.
#ifndef ENTROKV_CORE_SCORING_FUSED_KERNELS_H_
#define ENTROKV_CORE_SCORING_FUSED_KERNELS_H_

#include <cstdint>

namespace entrokv::fused {

// Whether this machine runs the AVX2 kernels.
[[nodiscard]] bool HaveAvx2();

// How a chunk of the group's rows becomes the pooled row, with the reference's operations per
// token (weights.h, MaxPolicy):
//  kWeighted: pooled[t] = float(((0 + w_0 x_0[t]) + w_1 x_1[t]) + ...) in double (PoolRows);
//  kMean:     pooled[t] = float(((0 + x_0[t]) + x_1[t] + ...) * scale) in double (MeanRows);
//  kMax:      pooled[t] = max(...max(0, x_0[t])..., x_r-1[t]) in float (MaxPolicy).
enum class PoolOp : uint8_t { kWeighted, kMean, kMax };

// The pooled chunk of count_rows rows, `count` tokens each, into `pooled` (and, when `mean` is
// not null, the head-mean chunk into `mean`). `scale` is MeanScale(count_rows); `weights` is
// read for kWeighted only and must be finite. Returns whether every value is finite and >= 0.
[[nodiscard]] bool PoolRowsChunk(PoolOp op, const float* const* rows, const double* weights,
                                 int count_rows, int64_t count, float* pooled, double scale,
                                 float* mean);

// maxima[b] = the max of values over page b of [0, count); the partial last page counts with
// its real tokens. REQUIRES: no NaN (so the max is order-independent; -0 and +0 may swap).
void PageMaximaOf(const float* values, int64_t count, int page_size, float* maxima);

}  // namespace entrokv::fused

#endif  // ENTROKV_CORE_SCORING_FUSED_KERNELS_H_
