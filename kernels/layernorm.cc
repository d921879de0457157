#include "troupe/kernels/layernorm.h"

#include <cmath>

#include "troupe/kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kRowBlock = 32;
constexpr int64_t kColBlock = 32;
}  // namespace

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t n, int64_t c) {
  ParallelForRange(n, kRowBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* x = inp + i * c;
      T m = 0;
      for (int64_t j = 0; j < c; ++j) m += x[j];
      m = m / c;
      T v = 0;
      for (int64_t j = 0; j < c; ++j) {
        const T d = x[j] - m;
        v += d * d;
      }
      v = v / c;
      const T s = T(1) / std::sqrt(v + T(1e-5));
      T* o = out + i * c;
      for (int64_t j = 0; j < c; ++j) o[j] = (s * (x[j] - m)) * weight[j] + bias[j];
      mean[i] = m;
      rstd[i] = s;
    }
  });
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int64_t n, int64_t c) {
  ParallelForRange(n, kRowBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* x = inp + i * c;
      const T* g = dout + i * c;
      const T m = mean[i];
      const T s = rstd[i];
      T dnorm_mean = 0;
      T dnorm_norm_mean = 0;
      for (int64_t j = 0; j < c; ++j) {
        const T norm = (x[j] - m) * s;
        const T dnorm = weight[j] * g[j];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean = dnorm_mean / c;
      dnorm_norm_mean = dnorm_norm_mean / c;
      T* dx = dinp + i * c;
      for (int64_t j = 0; j < c; ++j) {
        const T norm = (x[j] - m) * s;
        const T dnorm = weight[j] * g[j];
        dx[j] += s * ((dnorm - dnorm_mean) - norm * dnorm_norm_mean);
      }
    }
  });
  ParallelForRange(c, kColBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = 0; i < n; ++i) {
      const T* x = inp + i * c;
      const T* g = dout + i * c;
      const T m = mean[i];
      const T s = rstd[i];
      for (int64_t j = lo; j < hi; ++j) {
        dbias[j] += g[j];
        dweight[j] += ((x[j] - m) * s) * g[j];
      }
    }
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
