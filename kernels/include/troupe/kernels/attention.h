// Causal multi-head self-attention with its softmax (forward and backward).
//
// qkv is [B, T, 3C]: queries in columns [0, C), keys in [C, 2C), values in [2C, 3C), head h in
// columns [h*hs, (h+1)*hs) of each (hs = C / NH), as PyTorch's `qkv.split(C, dim=2)` and
// `view(B, T, NH, hs)`. Forward keeps the attention probabilities att [B, NH, T, T] (zero above the
// diagonal) for backward. Each (batch, head) pair is one block of GEMMs and one softmax, so the
// result does not depend on the thread count. Backward overwrites dqkv (the caller clears
// nothing).
//
// Example:
//   AttentionForward<float>(out, att, qkv, B, T, C, NH);
//   AttentionBackward<float>(dqkv, dout, qkv, att, B, T, C, NH);
#ifndef TROUPE_KERNELS_ATTENTION_H_
#define TROUPE_KERNELS_ATTENTION_H_

#include <cstdint>

namespace troupe::kernels {

// Row-wise softmax of x[t, 0..t] (causal row t of a [T, T] block) into p; p[t, t+1..] = 0.
template <typename T>
void CausalSoftmaxRows(T* p, const T* x, int64_t t_len);

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int64_t b, int64_t t, int64_t c, int64_t nh);

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t b, int64_t t,
                       int64_t c, int64_t nh);

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_ATTENTION_H_
