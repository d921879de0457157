// Token + position embedding (forward and backward): out[b, t] = wte[token[b, t]] + wpe[t].
//
// Backward scatters into dwte/dwpe. It is split by fixed blocks of channels, and each block visits
// the tokens in (b, t) order, so repeated tokens add up in the same order at any thread count.
// Token ids must lie in [0, V); callers validate them. Either of dwte, dwpe may be null (that
// part is skipped: a pipeline's first stage leaves wte to the last).
//
// Example:
//   EmbeddingForward<float>(out, tokens, wte, wpe, B, T, C);
//   EmbeddingBackward<float>(dwte, dwpe, dout, tokens, B, T, C);
#ifndef TROUPE_KERNELS_EMBEDDING_H_
#define TROUPE_KERNELS_EMBEDDING_H_

#include <cstdint>

namespace troupe::kernels {

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t b,
                      int64_t t, int64_t c);

template <typename T>
void EmbeddingBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t b, int64_t t,
                       int64_t c);

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_EMBEDDING_H_
