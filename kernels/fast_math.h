// exp for the kernels' float paths: pure arithmetic (no libm call, no table, no branch), so the
// loops that use it vectorise and give the same bits on every x86-64 (SSE2 baseline). double paths,
// used by the gradient checks, call std::exp. Private to kernels/.
#ifndef TROUPE_KERNELS_FAST_MATH_H_
#define TROUPE_KERNELS_FAST_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// On a function whose loop is element-wise: a 256-bit (AVX2) copy of it beside the baseline one,
// chosen once at load by the CPU. Without FMA (not named) the compiler contracts nothing, so each
// element sees the same operations in the same order in both copies and the bits are the same on
// every x86-64; only the vector width differs. Reductions stay explicit (LaneReduce). Not under a
// sanitizer: the clones' resolver runs before the sanitizer's runtime starts, and ASan's
// instrumentation of it would read shadow memory that is not mapped yet.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TROUPE_WIDE_SIMD __attribute__((target_clones("avx2", "default")))
#else
#define TROUPE_WIDE_SIMD
#endif

namespace troupe::kernels::internal {

// e^x with a relative error of about 2 ulp for x in [-80, 40]; saturates outside (e^-80 ≈ 1.8e-35,
// e^40 ≈ 2.4e17). The kernels only need that range: softmax arguments are <= 0, and GELU's
// sigmoid is 1/(1 + e^40) ≈ 4e-18 at the upper end. Why so narrow: GCC evaluates the saturated
// branch for every lane; with e^±88 those lanes produce subnormals (e.g. x / e^88), and each
// subnormal costs a microcode assist (measured: GELU 4x slower). Within [-80, 40] every
// intermediate stays normal.
inline float ExpFloat(float x) {
  x = x < -80.0f ? -80.0f : x;
  x = x > 40.0f ? 40.0f : x;
  // Round x·log2(e) to the nearest integer with the 1.5·2^23 trick (exact for |v| < 2^22).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  // Cody–Waite: r = x − n·ln2 in two parts, |r| <= ln2/2.
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  // Cephes expf polynomial.
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

template <typename T>
inline T Exp(T x);
template <>
inline float Exp<float>(float x) {
  return ExpFloat(x);
}
template <>
inline double Exp<double>(double x) {
  return std::exp(x);
}

// Σ f(i) for i in [0, n), accumulated in 8 lanes (lane = i mod 8) that are combined in a fixed
// tree. The order depends only on n, so results are identical at any thread count, and the lanes
// vectorise, unlike one running sum (which the compiler may not reorder).
template <typename T, typename F>
inline T LaneReduce(int64_t n, F&& f) {
  T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += f(i + j);
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += f(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <typename T>
inline T LaneSum(const T* x, int64_t n) {
  return LaneReduce<T>(n, [x](int64_t i) { return x[i]; });
}

// max(x[0..n)), n >= 1, in 8 lanes: one running max is a chain of dependent maxss (4 cycles an
// element: the softmaxes' max took longer than their exps); lanes vectorise. A maximum is exact,
// so any order gives the same value (a NaN counts only in x[0], as in one running std::max).
template <typename T>
inline T LaneMax(const T* x, int64_t n) {
  T acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = x[0];
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] = std::max(acc[j], x[i + j]);
  }
  for (; i < n; ++i) acc[0] = std::max(acc[0], x[i]);
  return std::max(std::max(std::max(acc[0], acc[1]), std::max(acc[2], acc[3])),
                  std::max(std::max(acc[4], acc[5]), std::max(acc[6], acc[7])));
}

}  // namespace troupe::kernels::internal

#endif  // TROUPE_KERNELS_FAST_MATH_H_
