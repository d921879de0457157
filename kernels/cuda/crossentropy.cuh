// Softmax cross-entropy over the vocabulary, forward and backward, for float or bf16 logits with
// float arithmetic. Same function as the CPU kernel (kernels/crossentropy.cc), without
// materialising the probabilities:
//   forward:  lse[n] = log Σ_v exp(logits[n, v]),  losses[n] = lse[n] − logits[n, target[n]]
//   backward: dlogits[n, v] += (exp(logits[n, v] − lse[n]) − [v == target[n]]) · dloss
// The forward is one block per row and one pass over V: each thread keeps a running (max, sum of
// exp(x − max)) over its strided columns, rescaling the sum when the max grows, and the pairs are
// merged by a warp then a block reduction. It saves lse (one float per row) for the backward,
// which recomputes each probability from the logits instead of reading a [N, V] probs array.
// Conventions as on the CPU: the backward accumulates (+=) and dloss is the weight of every row
// in the total loss (1 / N for a mean). Targets must lie in [0, V): callers validate the tokens
// earlier (the CPU path does), the kernels do not check them. Losses and lse are float whatever
// the storage type of the logits. The reduction order depends only on the block size, so results
// are the same run to run.
//
// Example:
//   TROUPE_RETURN_IF_ERROR(crossentropy_forward(losses, lse, logits, targets, B * T, V, stream));
//   TROUPE_RETURN_IF_ERROR(
//       crossentropy_backward(dlogits, logits, lse, targets, 1.0f / (B * T), B * T, V, stream));
#ifndef TROUPE_KERNELS_CUDA_CROSSENTROPY_CUH_
#define TROUPE_KERNELS_CUDA_CROSSENTROPY_CUH_

#include <cfloat>
#include <cstdint>
#include <limits>

#include "device.cuh"

namespace troupe::kernels::cuda {

inline constexpr int kCrossEntropyBlock = 512;

// Merges the running pair (m2, s2) into (m, s), where s is a sum of exp(x − m). -FLT_MAX (not
// -inf) is the empty max, so that exp(m − max) of two empty pairs is exp(0), never exp(NaN);
// a column of -inf then adds exp(-inf) = 0 as it does on the CPU. The two terms are added in an
// order that does not depend on which side is which, so both lanes of a butterfly agree.
__device__ __forceinline__ void CrossEntropyMerge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

// One block per row; blockDim.x a multiple of 32. lse may be null (evaluation: losses only).
template <typename Tx>
__global__ void crossentropy_forward_kernel(float* __restrict__ losses, float* __restrict__ lse,
                                            const Tx* __restrict__ logits,
                                            const int32_t* __restrict__ targets, int64_t v) {
  __shared__ float warp_max[32], warp_sum[32];
  const int64_t row = blockIdx.x;
  const Tx* x = logits + row * v;
  float m = -FLT_MAX, s = 0.0f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    const float xj = ToFloat(x[j]);
    if (xj > m) {
      s = s * expf(m - xj) + 1.0f;
      m = xj;
    } else {
      s += expf(xj - m);  // also where xj is NaN: the NaN reaches the loss, as on the CPU
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(kFullMask, m, offset);
    const float s2 = __shfl_xor_sync(kFullMask, s, offset);
    CrossEntropyMerge(m, s, m2, s2);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = s;
  }
  __syncthreads();
  if (warp != 0) return;
  m = lane < warps ? warp_max[lane] : -FLT_MAX;
  s = lane < warps ? warp_sum[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(kFullMask, m, offset);
    const float s2 = __shfl_xor_sync(kFullMask, s, offset);
    CrossEntropyMerge(m, s, m2, s2);
  }
  if (lane == 0) {
    const float row_lse = m + logf(s);
    losses[row] = row_lse - ToFloat(x[targets[row]]);
    if (lse != nullptr) lse[row] = row_lse;
  }
}

// One block per row, threads striding over V; any block size.
template <typename Tx>
__global__ void crossentropy_backward_kernel(Tx* __restrict__ dlogits,
                                             const Tx* __restrict__ logits,
                                             const float* __restrict__ lse,
                                             const int32_t* __restrict__ targets, float dloss,
                                             int64_t v) {
  const int64_t row = blockIdx.x;
  const Tx* x = logits + row * v;
  Tx* d = dlogits + row * v;
  const float row_lse = lse[row];
  const int64_t target = targets[row];
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    const float p = expf(ToFloat(x[j]) - row_lse);
    const float g = (p - (j == target ? 1.0f : 0.0f)) * dloss;
    d[j] = FromFloat<Tx>(ToFloat(d[j]) + g);
  }
}

// losses[n] and, where lse is not null, lse[n] for n rows of v logits. block: a multiple of 32,
// at most 1024.
template <typename Tx>
absl::Status crossentropy_forward(float* losses, float* lse, const Tx* logits,
                                  const int32_t* targets, int64_t n, int64_t v, Stream stream,
                                  int block = kCrossEntropyBlock) {
  if (block <= 0 || block > 1024 || block % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("crossentropy_forward: block ", block,
                                                   " is not a multiple of 32 in [32, 1024]"));
  }
  if (n < 0 || n > std::numeric_limits<int32_t>::max() || v <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("crossentropy_forward: bad shape n=", n, " v=", v));
  }
  if (n == 0) return absl::OkStatus();
  return TROUPE_LAUNCH(crossentropy_forward_kernel<Tx>, dim3(static_cast<unsigned>(n)), dim3(block),
                       0, stream, losses, lse, logits, targets, v);
}

// dlogits += (softmax(logits) − onehot(targets)) · dloss, from the lse the forward saved.
template <typename Tx>
absl::Status crossentropy_backward(Tx* dlogits, const Tx* logits, const float* lse,
                                   const int32_t* targets, float dloss, int64_t n, int64_t v,
                                   Stream stream, int block = kCrossEntropyBlock) {
  if (block <= 0 || block > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("crossentropy_backward: block ", block, " is not in [1, 1024]"));
  }
  if (n < 0 || n > std::numeric_limits<int32_t>::max() || v <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("crossentropy_backward: bad shape n=", n, " v=", v));
  }
  if (n == 0) return absl::OkStatus();
  return TROUPE_LAUNCH(crossentropy_backward_kernel<Tx>, dim3(static_cast<unsigned>(n)),
                       dim3(block), 0, stream, dlogits, logits, lse, targets, dloss, v);
}

}  // namespace troupe::kernels::cuda

#endif  // TROUPE_KERNELS_CUDA_CROSSENTROPY_CUH_
