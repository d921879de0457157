#include "troupe/kernels/gelu.h"

#include <cmath>

#include "troupe/kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kBlock = 16384;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
}  // namespace

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n) {
  const T s = T(kSqrt2OverPi);
  ParallelForRange(n, kBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T x = inp[i];
      const T cube = T(0.044715) * x * x * x;
      out[i] = T(0.5) * x * (T(1) + std::tanh(s * (x + cube)));
    }
  });
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) {
  const T s = T(kSqrt2OverPi);
  ParallelForRange(n, kBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T x = inp[i];
      const T cube = T(0.044715) * x * x * x;
      const T arg = s * (x + cube);
      const T th = std::tanh(arg);
      const T sech2 = T(1) - th * th;
      const T local =
          T(0.5) * (T(1) + th) + x * T(0.5) * sech2 * s * (T(1) + T(3 * 0.044715) * x * x);
      dinp[i] += local * dout[i];
    }
  });
}

template void GeluForward<float>(float*, const float*, int64_t);
template void GeluForward<double>(double*, const double*, int64_t);
template void GeluBackward<float>(float*, const float*, const float*, int64_t);
template void GeluBackward<double>(double*, const double*, const double*, int64_t);

}  // namespace troupe::kernels
