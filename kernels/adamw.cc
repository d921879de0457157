#include "troupe/kernels/adamw.h"

#include <cmath>

#include "fast_math.h"
#include "troupe/kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kBlock = 32768;

// Scalars by value and restrict pointers: the loop then vectorises (the float fields of the
// scalars could otherwise alias the float arrays being stored to). In place, the sources are null
// and never read, so no restrict pointer aliases another that is accessed.
template <bool kOutOfPlace>
TROUPE_WIDE_SIMD void AdamWBlock(float* __restrict p, const float* __restrict gr,
                                 float* __restrict mm, float* __restrict vv,
                                 const float* __restrict p0, const float* __restrict m0,
                                 const float* __restrict v0, int64_t lo, int64_t hi,
                                 float grad_scale, float beta1, float beta2, float eps,
                                 float sqrt_bc2, float decay, float step_size) {
  for (int64_t i = lo; i < hi; ++i) {
    const float g = gr[i] * grad_scale;
    const float mi = beta1 * (kOutOfPlace ? m0[i] : mm[i]) + (1.0f - beta1) * g;
    const float vi = beta2 * (kOutOfPlace ? v0[i] : vv[i]) + (1.0f - beta2) * (g * g);
    mm[i] = mi;
    vv[i] = vi;
    const float denom = std::sqrt(vi) / sqrt_bc2 + eps;
    p[i] = (kOutOfPlace ? p0[i] : p[i]) * decay - step_size * (mi / denom);
  }
}
}  // namespace

void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamWScalars& s, const AdamWSources* from) {
  const float decay = 1.0f - s.lr * s.weight_decay;
  const float step_size = s.lr / s.bias_correction1;
  const float sqrt_bc2 = std::sqrt(s.bias_correction2);
  ParallelForRange(n, kBlock, [&](int64_t lo, int64_t hi) {
    if (from != nullptr) {
      AdamWBlock<true>(param, grad, m, v, from->param, from->m, from->v, lo, hi, s.grad_scale,
                       s.beta1, s.beta2, s.eps, sqrt_bc2, decay, step_size);
    } else {
      AdamWBlock<false>(param, grad, m, v, nullptr, nullptr, nullptr, lo, hi, s.grad_scale, s.beta1,
                        s.beta2, s.eps, sqrt_bc2, decay, step_size);
    }
  });
}

}  // namespace troupe::kernels
