// Residual connection: out = a + b, and its backward (da += dout, db += dout).
//
// Example:
//   ResidualForward<float>(out, residual, attn_proj, B * T * C);
//   ResidualBackward<float>(dresidual, dattn_proj, dout, B * T * C);
#ifndef TROUPE_KERNELS_RESIDUAL_H_
#define TROUPE_KERNELS_RESIDUAL_H_

#include <cstdint>

namespace troupe::kernels {

template <typename T>
void ResidualForward(T* out, const T* a, const T* b, int64_t n);

// da and db may be the same buffer as each other but not as dout.
template <typename T>
void ResidualBackward(T* da, T* db, const T* dout, int64_t n);

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_RESIDUAL_H_
