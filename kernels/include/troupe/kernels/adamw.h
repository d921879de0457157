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
//   // Out of place: the committed state stays as it was, the new one goes to staged arrays.
//   AdamWSources from{.param = old_p + lo, .m = old_m + lo, .v = old_v + lo};
//   AdamWUpdate(new_p + lo, grads + lo, new_m + lo, new_v + lo, hi - lo, s, &from);
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

// Where an out-of-place update reads the old parameters and moments (all three given, none
// overlapping the destinations); the old values stay as they were. Without it the update reads
// where it writes (in place). Either way the new values are the same bits.
struct AdamWSources {
  const float* param = nullptr;
  const float* m = nullptr;
  const float* v = nullptr;

  // The sources from element `offset` on.
  AdamWSources At(int64_t offset) const { return {param + offset, m + offset, v + offset}; }
};

void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamWScalars& s, const AdamWSources* from = nullptr);

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_ADAMW_H_
