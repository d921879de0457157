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
  ParallelForRange(n, kBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float g = grad[i] * s.grad_scale;
      m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * g;
      v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * (g * g);
      const float denom = std::sqrt(v[i]) / sqrt_bc2 + s.eps;
      param[i] = param[i] * decay - step_size * (m[i] / denom);
    }
  });
}

}  // namespace troupe::kernels
