// AdamW update of one contiguous range of parameters, in the form torch.optim.AdamW uses.
//
// Every scalar is an input: the learning rate of this step, the gradient scale (the clip factor
// from the global gradient norm), and the bias corrections 1 - beta^step. A range owner that is
// handed the same scalars computes exactly what a single process computes for those elements.
//
//   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²
//   param = param * (1 - lr * weight_decay) - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
//
// Example:
//   AdamWScalars s{.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
//                  .weight_decay = 0.1f, .grad_scale = clip, .bias_correction1 = 1 - 0.9^t,
//                  .bias_correction2 = 1 - 0.95^t};
//   AdamWUpdate(params + lo, grads + lo, m + lo, v + lo, hi - lo, s);
#ifndef TROUPE_KERNELS_ADAMW_H_
#define TROUPE_KERNELS_ADAMW_H_

#include <cstdint>

namespace troupe::kernels {

struct AdamWScalars {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0;
  float grad_scale = 1;
  float bias_correction1 = 1;
  float bias_correction2 = 1;
};

void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamWScalars& s);

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_ADAMW_H_
