// Softmax cross-entropy over the vocabulary (forward and backward), fused as in llm.c.
//
// Forward writes per-row probabilities probs[N, V] and losses[N] = -log probs[n, target[n]].
// Backward adds (probs - onehot(target)) * dloss to dlogits (with accumulate = false: writes it,
// no zeroing pass before it), where dloss is the weight of every row
// in the total loss (1 / (B*T) for a mean). Rows are independent, so the result does not depend on
// the thread count. Targets must lie in [0, V); callers validate them.
//
// Example:
//   CrossEntropyForward<float>(losses, probs, logits, targets, B * T, V);
//   CrossEntropyBackward<float>(dlogits, probs, targets, 1.0f / (B * T), B * T, V);
#ifndef TROUPE_KERNELS_CROSSENTROPY_H_
#define TROUPE_KERNELS_CROSSENTROPY_H_

#include <cstdint>

namespace troupe::kernels {

template <typename T>
void CrossEntropyForward(T* losses, T* probs, const T* logits, const int32_t* targets, int64_t n,
                         int64_t v);

template <typename T>
void CrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, T dloss, int64_t n,
                          int64_t v, bool accumulate = true);

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_CROSSENTROPY_H_
