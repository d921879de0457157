#include "troupe/kernels/layernorm.h"

#include <cmath>

#include "fast_math.h"
#include "troupe/kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kRowBlock = 32;
constexpr int64_t kColBlock = 32;

template <typename T>
TROUPE_WIDE_SIMD void LayerNormRows(T* out, T* mean, T* rstd, const T* inp, const T* weight,
                                    const T* bias, int64_t lo, int64_t hi, int64_t c) {
  for (int64_t i = lo; i < hi; ++i) {
    const T* x = inp + i * c;
    const T m = internal::LaneSum(x, c) / c;
    const T v = internal::LaneReduce<T>(c, [&](int64_t j) { return (x[j] - m) * (x[j] - m); }) / c;
    const T s = T(1) / std::sqrt(v + T(1e-5));
    T* o = out + i * c;
    for (int64_t j = 0; j < c; ++j) o[j] = (s * (x[j] - m)) * weight[j] + bias[j];
    mean[i] = m;
    rstd[i] = s;
  }
}

template <typename T>
TROUPE_WIDE_SIMD void LayerNormBackwardRows(T* dinp, const T* dout, const T* inp, const T* weight,
                                            const T* mean, const T* rstd, int64_t lo, int64_t hi,
                                            int64_t c) {
  for (int64_t i = lo; i < hi; ++i) {
    const T* x = inp + i * c;
    const T* g = dout + i * c;
    const T m = mean[i];
    const T s = rstd[i];
    const T dnorm_mean =
        internal::LaneReduce<T>(c, [&](int64_t j) { return weight[j] * g[j]; }) / c;
    const T dnorm_norm_mean =
        internal::LaneReduce<T>(c,
                                [&](int64_t j) { return (weight[j] * g[j]) * ((x[j] - m) * s); }) /
        c;
    T* dx = dinp + i * c;
    for (int64_t j = 0; j < c; ++j) {
      const T norm = (x[j] - m) * s;
      const T dnorm = weight[j] * g[j];
      dx[j] += s * ((dnorm - dnorm_mean) - norm * dnorm_norm_mean);
    }
  }
}

// Columns [lo, hi) of the parameters' gradients: each sums the rows in order, whatever the thread
// count, in registers (the block's running sums start from and end in dweight and dbias: the same
// additions as adding each row to them).
template <typename T>
TROUPE_WIDE_SIMD void LayerNormParamGradColumns(T* dweight, T* dbias, const T* dout, const T* inp,
                                                const T* mean, const T* rstd, int64_t lo,
                                                int64_t hi, int64_t n, int64_t c) {
  T w[kColBlock], b[kColBlock];
  const int64_t len = hi - lo;
  for (int64_t j = 0; j < len; ++j) w[j] = dweight[lo + j], b[j] = dbias[lo + j];
  for (int64_t i = 0; i < n; ++i) {
    const T* x = inp + i * c + lo;
    const T* g = dout + i * c + lo;
    const T m = mean[i];
    const T s = rstd[i];
    for (int64_t j = 0; j < len; ++j) {
      b[j] += g[j];
      w[j] += ((x[j] - m) * s) * g[j];
    }
  }
  for (int64_t j = 0; j < len; ++j) dweight[lo + j] = w[j], dbias[lo + j] = b[j];
}
}  // namespace

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t n, int64_t c) {
  ParallelForRange(n, kRowBlock, [&](int64_t lo, int64_t hi) {
    LayerNormRows(out, mean, rstd, inp, weight, bias, lo, hi, c);
  });
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int64_t n, int64_t c) {
  ParallelForRange(n, kRowBlock, [&](int64_t lo, int64_t hi) {
    LayerNormBackwardRows(dinp, dout, inp, weight, mean, rstd, lo, hi, c);
  });
  ParallelForRange(c, kColBlock, [&](int64_t lo, int64_t hi) {
    LayerNormParamGradColumns(dweight, dbias, dout, inp, mean, rstd, lo, hi, n, c);
  });
}

template void LayerNormForward<float>(float*, float*, float*, const float*, const float*,
                                      const float*, int64_t, int64_t);
template void LayerNormForward<double>(double*, double*, double*, const double*, const double*,
                                       const double*, int64_t, int64_t);
template void LayerNormBackward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, int64_t, int64_t);
template void LayerNormBackward<double>(double*, double*, double*, const double*, const double*,
                                        const double*, const double*, const double*, int64_t,
                                        int64_t);

}  // namespace troupe::kernels
