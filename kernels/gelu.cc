#include "troupe/kernels/gelu.h"

#include <cmath>

#include "fast_math.h"
#include "troupe/kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kBlock = 16384;
constexpr double kSqrt2OverPi = 0.79788456080286535588;

// GELU_tanh(x) = 0.5·x·(1 + tanh(u)) = x·σ(2u) with u = sqrt(2/π)·(x + 0.044715·x³): the sigmoid
// form needs one exp and has no cancellation. d/dx = σ + 2·x·σ·(1 − σ)·du/dx.
template <typename T>
TROUPE_WIDE_SIMD void GeluForwardBlock(T* out, const T* inp, int64_t lo, int64_t hi) {
  const T s = T(kSqrt2OverPi);
  for (int64_t i = lo; i < hi; ++i) {
    const T x = inp[i];
    const T u = s * (x + T(0.044715) * x * x * x);
    out[i] = x / (T(1) + internal::Exp<T>(T(-2) * u));
  }
}

// d/dx of GELU at x (the sigmoid form above).
template <typename T>
inline T GeluGrad(T x) {
  const T s = T(kSqrt2OverPi);
  const T u = s * (x + T(0.044715) * x * x * x);
  const T sig = T(1) / (T(1) + internal::Exp<T>(T(-2) * u));
  const T du = s * (T(1) + T(3 * 0.044715) * x * x);
  return sig + T(2) * x * sig * (T(1) - sig) * du;
}

// Two loops, not a choice per element: each vectorises on its own.
template <typename T>
TROUPE_WIDE_SIMD void GeluBackwardBlock(T* dinp, const T* inp, const T* dout, int64_t lo,
                                        int64_t hi, bool accumulate) {
  if (accumulate) {
    for (int64_t i = lo; i < hi; ++i) dinp[i] += GeluGrad(inp[i]) * dout[i];
  } else {
    for (int64_t i = lo; i < hi; ++i) dinp[i] = GeluGrad(inp[i]) * dout[i];
  }
}
}  // namespace

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n) {
  ParallelForRange(n, kBlock, [&](int64_t lo, int64_t hi) { GeluForwardBlock(out, inp, lo, hi); });
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n, bool accumulate) {
  ParallelForRange(n, kBlock, [&](int64_t lo, int64_t hi) {
    GeluBackwardBlock(dinp, inp, dout, lo, hi, accumulate);
  });
}

template void GeluForward<float>(float*, const float*, int64_t);
template void GeluForward<double>(double*, const double*, int64_t);
template void GeluBackward<float>(float*, const float*, const float*, int64_t, bool);
template void GeluBackward<double>(double*, const double*, const double*, int64_t, bool);

}  // namespace troupe::kernels
