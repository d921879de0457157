#include "troupe/kernels/adamw.h"

#include <cmath>

#include "troupe/kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kBlock = 32768;
}

void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamWScalars& s) {
  const float decay = 1.0f - s.lr * s.weight_decay;
  const float step_size = s.lr / s.bias_correction1;
  const float sqrt_bc2 = std::sqrt(s.bias_correction2);
  // Scalars in locals and restrict pointers: the loop then vectorises (the float fields of s could
  // otherwise alias the float arrays being stored to).
  const float grad_scale = s.grad_scale, beta1 = s.beta1, beta2 = s.beta2, eps = s.eps;
  ParallelForRange(n, kBlock, [=](int64_t lo, int64_t hi) {
    float* __restrict p = param;
    const float* __restrict gr = grad;
    float* __restrict mm = m;
    float* __restrict vv = v;
    for (int64_t i = lo; i < hi; ++i) {
      const float g = gr[i] * grad_scale;
      const float mi = beta1 * mm[i] + (1.0f - beta1) * g;
      const float vi = beta2 * vv[i] + (1.0f - beta2) * (g * g);
      mm[i] = mi;
      vv[i] = vi;
      const float denom = std::sqrt(vi) / sqrt_bc2 + eps;
      p[i] = p[i] * decay - step_size * (mi / denom);
    }
  });
}

}  // namespace troupe::kernels
