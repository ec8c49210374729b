// The head weights' arithmetic (entropy from its sums, ln, exp, the softmin over a group) written
// once, for the CPU and for CUDA devices, so that both get the same bits: only IEEE operations
// that round to nearest (+, -, *, /, and the exact frexp, ldexp and rint), taken through an
// arithmetic type `A` (HostArithmetic here; the CUDA scorer's kernels pass one of explicit
// round-to-nearest intrinsics, so nvcc contracts nothing into an FMA). Library ln and exp are not
// correctly rounded and differ between glibc and CUDA; these are within a few ulp of them.
// Plain C++17 (nvcc includes it).
#ifndef ENTROKV_CORE_SCORING_PORTABLE_MATH_H_
#define ENTROKV_CORE_SCORING_PORTABLE_MATH_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ENTROKV_HOST_DEVICE __host__ __device__
#else
#define ENTROKV_HOST_DEVICE
#endif

namespace entrokv::portable {

// The project builds ISO C++ without -march, so the host compiler neither contracts nor has FMA.
struct HostArithmetic {
  static double Add(double a, double b) { return a + b; }
  static double Sub(double a, double b) { return a - b; }
  static double Mul(double a, double b) { return a * b; }
  static double Div(double a, double b) { return a / b; }
  static double Frexp(double x, int* exponent) { return std::frexp(x, exponent); }
  static double Ldexp(double x, int exponent) { return std::ldexp(x, exponent); }
  static double Rint(double x) { return std::nearbyint(x); }  // ties to even
};

// ln 2 as a high part with 21 trailing zero bits (k * kLn2High is exact for |k| < 2^21) and the
// rest.
inline constexpr double kLn2High = 0x1.62e42feep-1;
inline constexpr double kLn2Low = 0x1.a39ef35793c76p-33;

// ln x for finite x > 0: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with
// s = (m - 1) / (m + 1), |s| <= 0.172, by its series to s^21 (the next term is below 2^-60).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename A>
ENTROKV_HOST_DEVICE double Log(double x) {
  int exponent = 0;
  double m = A::Frexp(x, &exponent);  // [0.5, 1)
  if (m < 0x1.6a09e667f3bcdp-1) {     // sqrt(1/2)
    m = A::Mul(m, 2.0);
    exponent -= 1;
  }
  const double f = A::Sub(m, 1.0);  // exact (Sterbenz)
  const double s = A::Div(f, A::Add(2.0, f));
  const double s2 = A::Mul(s, s);
  // 1/21, 1/19, ..., 1/3, 1 (each the nearest double).
  constexpr double kInverseOdd[] = {0x1.8618618618618p-5,
                                    0x1.af286bca1af28p-5,
                                    0x1.e1e1e1e1e1e1ep-5,
                                    0x1.1111111111111p-4,
                                    0x1.3b13b13b13b14p-4,
                                    0x1.745d1745d1746p-4,
                                    0x1.c71c71c71c71cp-4,
                                    0x1.2492492492492p-3,
                                    0x1.999999999999ap-3,
                                    0x1.5555555555555p-2,
                                    0x1.0p+0};
  double series = kInverseOdd[0];
  for (int i = 1; i < 11; ++i) series = A::Add(A::Mul(series, s2), kInverseOdd[i]);
  const double log_m = A::Mul(A::Mul(2.0, s), series);
  const auto e = static_cast<double>(exponent);
  return A::Add(A::Mul(e, kLn2High), A::Add(A::Mul(e, kLn2Low), log_m));
}

// e^y: y = k ln 2 + t with |t| <= ln(2) / 2, e^t by its Taylor series to t^13 (the next term is
// below 2^-57), scaled by 2^k. 0 below -746 (where e^y rounds to 0), inf above 710, NaN for NaN
// (a statistic with a bad value reaches here before it is refused; k must never be NaN, whose
// conversion to int is undefined).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename A>
ENTROKV_HOST_DEVICE double Exp(double y) {
  if (y != y) return y;
  if (y < -746.0) return 0.0;
  if (y > 710.0) return HUGE_VAL;
  const double k = A::Rint(A::Mul(y, 0x1.71547652b82fep+0));  // y / ln 2
  const double t = A::Sub(A::Sub(y, A::Mul(k, kLn2High)), A::Mul(k, kLn2Low));
  // 1/13!, 1/12!, ..., 1/1!, 1/0! (each the nearest double).
  constexpr double kInverseFactorial[] = {0x1.6124613a86d09p-33,
                                          0x1.1eed8eff8d898p-29,
                                          0x1.ae64567f544e4p-26,
                                          0x1.27e4fb7789f5cp-22,
                                          0x1.71de3a556c734p-19,
                                          0x1.a01a01a01a01ap-16,
                                          0x1.a01a01a01a01ap-13,
                                          0x1.6c16c16c16c17p-10,
                                          0x1.1111111111111p-7,
                                          0x1.5555555555555p-5,
                                          0x1.5555555555555p-3,
                                          0x1.0p-1,
                                          0x1.0p+0,
                                          0x1.0p+0};
  double series = kInverseFactorial[0];
  for (int i = 1; i < 14; ++i) series = A::Add(A::Mul(series, t), kInverseFactorial[i]);
  return A::Ldexp(series, static_cast<int>(k));
}

// Guards ln(0) where sum p^alpha underflows.
inline constexpr double kEntropyLogGuard = 1e-12;

// The entropy of a row with no mass over its `support` non-sink tokens: the maximal one,
// ln(max(support, 1)).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename A>
ENTROKV_HOST_DEVICE double DegenerateEntropy(int64_t support) {
  return Log<A>(static_cast<double>(support > 1 ? support : 1));
}

// The one-pass orders' entropy from a row's sums over its `support` non-sink tokens: total = sum
// x, power = sum x^2 (alpha 2), max x (alpha inf) or sum x ln x (alpha 1). A row whose mass is
// not positive gets DegenerateEntropy.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename A>
ENTROKV_HOST_DEVICE double EntropyOfSums(double total, double power, double alpha,
                                         int64_t support) {
  if (!(total > 0.0)) return DegenerateEntropy<A>(support);
  if (alpha == 2.0) {  // sum p^2 = power / total^2, in (0, 1]
    return -Log<A>(A::Add(A::Div(power, A::Mul(total, total)), kEntropyLogGuard));
  }
  if (alpha == 1.0) {  // with p = x / total: -sum p ln p = ln(total) - sum(x ln x) / total
    return A::Sub(Log<A>(total), A::Div(power, total));
  }
  return -Log<A>(A::Add(A::Div(power, total), kEntropyLogGuard));  // alpha = inf
}

// w_h = softmax_h(-(H_h - min H) / tau) over n > 0 finite entropies, summed in head order.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename A>
ENTROKV_HOST_DEVICE void SoftminWeights(const double* entropies, int n, double tau,
                                        double* weights) {
  double minimum = entropies[0];
  for (int h = 1; h < n; ++h) minimum = entropies[h] < minimum ? entropies[h] : minimum;
  double sum = 0.0;
  for (int h = 0; h < n; ++h) {
    weights[h] = Exp<A>(-A::Div(A::Sub(entropies[h], minimum), tau));  // the minimum gets 1
    sum = A::Add(sum, weights[h]);
  }
  for (int h = 0; h < n; ++h) weights[h] = A::Div(weights[h], sum);
}

}  // namespace entrokv::portable

#endif  // ENTROKV_CORE_SCORING_PORTABLE_MATH_H_
