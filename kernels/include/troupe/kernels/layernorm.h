// LayerNorm over the last dimension (forward and backward), as in GPT-2 (eps = 1e-5).
//
// Forward saves the per-row mean and 1/std for backward. Backward computes dinp row by row and
// dweight/dbias column-block by column-block, each summing over all rows in row order, so the
// result does not depend on the thread count. Backward accumulates (+=).
//
// Example:
//   LayerNormForward<float>(out, mean, rstd, inp, w, b, B * T, C);
//   LayerNormBackward<float>(dinp, dw, db, dout, inp, w, mean, rstd, B * T, C);
#ifndef TROUPE_KERNELS_LAYERNORM_H_
#define TROUPE_KERNELS_LAYERNORM_H_

#include <cstdint>

namespace troupe::kernels {

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t n, int64_t c);

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int64_t n, int64_t c);

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_LAYERNORM_H_
