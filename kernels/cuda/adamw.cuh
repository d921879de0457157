// AdamW update of one contiguous range of fp32 master weights, element-wise, with the formula,
// scalars (troupe::kernels::AdamWScalars) and operation order of the CPU kernel (kernels/adamw.cc):
//   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²
//   param = param * (1 - lr * weight_decay) - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
// param, m and v are fp32, updated in place, or out of place from `from` (AdamWSources: the old
// values read there stay as they were); grad is fp32 or bf16 (read as float). When param_bf16 is
// not null it receives __float2bfloat16 of each updated param, the copy the bf16 forward reads.
//
// Bits: the CPU kernel is compiled with -ffp-contract=off and this one with nvcc --fmad=false; the
// launcher derives the step scalars on the host exactly as the CPU kernel does, and sqrtf and '/'
// are correctly rounded on both sides (nvcc's defaults -prec-sqrt=true -prec-div=true, no
// -ftz). So param, m and v equal the CPU kernel's bit for bit, whatever the block size.
//
// Example:
//   AdamWScalars s{.lr = 3e-4f, .weight_decay = 0.1f, .grad_scale = clip,
//                  .bias_correction1 = 1 - 0.9^t, .bias_correction2 = 1 - 0.95^t};
//   TROUPE_RETURN_IF_ERROR(adamw_update(params + lo, params_bf16 + lo, grads + lo, m + lo, v + lo,
//                                       hi - lo, s, stream));
#ifndef TROUPE_KERNELS_CUDA_ADAMW_CUH_
#define TROUPE_KERNELS_CUDA_ADAMW_CUH_

#include <cmath>

#include "device.cuh"
#include "troupe/kernels/adamw.h"

namespace troupe::kernels::cuda {

inline constexpr int kAdamWBlock = 256;

// The per-step scalars in the form the element loop uses, derived once on the host.
struct AdamWStep {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float decay;      // 1 - lr * weight_decay
  float step_size;  // lr / bias_correction1
  float sqrt_bc2;   // sqrt(bias_correction2)
};

// The same expressions as AdamWUpdate (kernels/adamw.cc), in float, on the host.
inline AdamWStep MakeAdamWStep(const AdamWScalars& s) {
  AdamWStep k;
  k.grad_scale = s.grad_scale;
  k.beta1 = s.beta1;
  k.one_minus_beta1 = 1.0f - s.beta1;
  k.beta2 = s.beta2;
  k.one_minus_beta2 = 1.0f - s.beta2;
  k.eps = s.eps;
  k.decay = 1.0f - s.lr * s.weight_decay;
  k.step_size = s.lr / s.bias_correction1;
  k.sqrt_bc2 = std::sqrt(s.bias_correction2);
  return k;
}

template <typename Tg>
__global__ void adamw_update_kernel(float* param, __nv_bfloat16* param_bf16, const Tg* grad,
                                    float* m, float* v, const float* param_in, const float* m_in,
                                    const float* v_in, int64_t n, AdamWStep k) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = ToFloat(grad[i]) * k.grad_scale;
  const float mi = k.beta1 * m_in[i] + k.one_minus_beta1 * g;
  const float vi = k.beta2 * v_in[i] + k.one_minus_beta2 * (g * g);
  m[i] = mi;
  v[i] = vi;
  const float denom = sqrtf(vi) / k.sqrt_bc2 + k.eps;
  const float p = param_in[i] * k.decay - k.step_size * (mi / denom);
  param[i] = p;
  if (param_bf16 != nullptr) param_bf16[i] = __float2bfloat16(p);
}

template <typename Tg>
absl::Status adamw_update(float* param, __nv_bfloat16* param_bf16, const Tg* grad, float* m,
                          float* v, int64_t n, const AdamWScalars& s, Stream stream,
                          int block = kAdamWBlock, const AdamWSources* from = nullptr) {
  if (n == 0) return absl::OkStatus();
  const AdamWSources in = from != nullptr ? *from : AdamWSources{param, m, v};
  return TROUPE_LAUNCH(adamw_update_kernel<Tg>, dim3(CeilDiv(n, block)), dim3(block), 0, stream,
                       param, param_bf16, grad, m, v, in.param, in.m, in.v, n, MakeAdamWStep(s));
}

}  // namespace troupe::kernels::cuda

#endif  // TROUPE_KERNELS_CUDA_ADAMW_CUH_
