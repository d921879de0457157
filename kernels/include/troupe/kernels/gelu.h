// GELU with GPT-2's tanh approximation (PyTorch's nn.GELU(approximate="tanh")), forward and
// backward. Element-wise, so trivially independent of the thread count. Backward accumulates into
// dinp, or with accumulate = false overwrites it (no zeroing pass before it).
//
// Example:
//   GeluForward<float>(out, inp, B * T * 4 * C);
//   GeluBackward<float>(dinp, inp, dout, B * T * 4 * C);
#ifndef TROUPE_KERNELS_GELU_H_
#define TROUPE_KERNELS_GELU_H_

#include <cstdint>

namespace troupe::kernels {

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n);

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n, bool accumulate = true);

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_GELU_H_
