// Token + position embedding, forward and backward, for float or bf16 storage with float
// arithmetic. Same function as the CPU kernel (kernels/embedding.cc):
//   forward:  out[b, t, :] = wte[token[b, t], :] + wpe[t, :]
//   backward: dwte[token[b, t], :] += dout[b, t, :],  dwpe[t, :] += dout[b, t, :]
// The backward is deterministic without float atomics: each thread owns one channel c and walks
// the B·T positions in (b, t) order, so every element of dwte and dwpe receives its additions in
// the CPU kernel's order, and fp32 results are bit-identical to EmbeddingBackward<float>.
// Cost: only C threads (768 for GPT-2: a few warps on a GPU of 100+ SMs), each doing B·T dependent
// read-modify-writes, so the kernel is latency-bound (~B·T global round trips). To hide part of
// that, a thread takes kEmbeddingUnroll positions at a time and, when their tokens (and
// positions) are distinct, which is the common case, issues all their loads before any store;
// repeated tokens take the one-at-a-time path. Faster still would be grouping positions by token
// (a stable sort), which costs a scratch buffer and a sort per step; atomics would be fastest but
// make the sum order, hence the bits, change run to run.
// Token ids must lie in [0, V): callers validate them (the CPU path does); the kernels do not.
//
// Example:
//   TROUPE_RETURN_IF_ERROR(embedding_forward(out, tokens, wte, wpe, B, T, C, stream));
//   TROUPE_RETURN_IF_ERROR(embedding_backward(dwte, dwpe, dout, tokens, B, T, C, stream));
#ifndef TROUPE_KERNELS_CUDA_EMBEDDING_CUH_
#define TROUPE_KERNELS_CUDA_EMBEDDING_CUH_

#include <cstdint>
#include <limits>

#include "device.cuh"

namespace troupe::kernels::cuda {

inline constexpr int kEmbeddingBlock = 256;
inline constexpr int kEmbeddingUnroll = 4;

// One block per (b, t) row, threads striding over the C channels.
template <typename Tx>
__global__ void embedding_forward_kernel(Tx* __restrict__ out, const int32_t* __restrict__ tokens,
                                         const Tx* __restrict__ wte, const Tx* __restrict__ wpe,
                                         int64_t t, int64_t c) {
  const int64_t row = blockIdx.x;
  const Tx* te = wte + static_cast<int64_t>(tokens[row]) * c;
  const Tx* pe = wpe + (row % t) * c;
  Tx* o = out + row * c;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    o[j] = FromFloat<Tx>(ToFloat(te[j]) + ToFloat(pe[j]));
  }
}

// One thread per channel, walking the bt = B·T positions in order (see the header comment).
template <typename Tx>
__global__ void embedding_backward_kernel(Tx* __restrict__ dwte, Tx* __restrict__ dwpe,
                                          const Tx* __restrict__ dout,
                                          const int32_t* __restrict__ tokens, int64_t bt, int64_t t,
                                          int64_t c) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  int64_t i = 0;
  int64_t pos = 0;  // i % t, kept incrementally
  // Positions of one group are distinct when t ≥ kEmbeddingUnroll; tokens are checked per group.
  if (t >= kEmbeddingUnroll) {
    for (; i + kEmbeddingUnroll <= bt; i += kEmbeddingUnroll) {
      int32_t token[kEmbeddingUnroll];
      int64_t te_at[kEmbeddingUnroll], pe_at[kEmbeddingUnroll];
      bool distinct = true;
      for (int k = 0; k < kEmbeddingUnroll; ++k) {
        token[k] = tokens[i + k];
        for (int q = 0; q < k; ++q) distinct = distinct && token[q] != token[k];
        te_at[k] = static_cast<int64_t>(token[k]) * c + j;
        pe_at[k] = pos * c + j;
        pos = pos + 1 == t ? 0 : pos + 1;
      }
      if (distinct) {  // the same for every thread: tokens are shared by the whole grid
        float g[kEmbeddingUnroll], te[kEmbeddingUnroll], pe[kEmbeddingUnroll];
        for (int k = 0; k < kEmbeddingUnroll; ++k) {
          g[k] = ToFloat(dout[(i + k) * c + j]);
          te[k] = ToFloat(dwte[te_at[k]]);
          pe[k] = ToFloat(dwpe[pe_at[k]]);
        }
        for (int k = 0; k < kEmbeddingUnroll; ++k) {
          dwte[te_at[k]] = FromFloat<Tx>(te[k] + g[k]);
          dwpe[pe_at[k]] = FromFloat<Tx>(pe[k] + g[k]);
        }
      } else {
        for (int k = 0; k < kEmbeddingUnroll; ++k) {
          const float g = ToFloat(dout[(i + k) * c + j]);
          dwte[te_at[k]] = FromFloat<Tx>(ToFloat(dwte[te_at[k]]) + g);
          dwpe[pe_at[k]] = FromFloat<Tx>(ToFloat(dwpe[pe_at[k]]) + g);
        }
      }
    }
  }
  for (; i < bt; ++i) {
    const float g = ToFloat(dout[i * c + j]);
    Tx* te = dwte + static_cast<int64_t>(tokens[i]) * c + j;
    Tx* pe = dwpe + pos * c + j;
    *te = FromFloat<Tx>(ToFloat(*te) + g);
    *pe = FromFloat<Tx>(ToFloat(*pe) + g);
    pos = pos + 1 == t ? 0 : pos + 1;
  }
}

// out[b, t, :] for b rows of t tokens, c channels; tokens [b, t] on the device.
template <typename Tx>
absl::Status embedding_forward(Tx* out, const int32_t* tokens, const Tx* wte, const Tx* wpe,
                               int64_t b, int64_t t, int64_t c, Stream stream,
                               int block = kEmbeddingBlock) {
  if (block <= 0 || block > 1024 || b < 0 || t < 0 || c < 0 ||
      b * t > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("embedding_forward: bad block ", block,
                                                   " or shape b=", b, " t=", t, " c=", c));
  }
  if (b * t == 0 || c == 0) return absl::OkStatus();
  return TROUPE_LAUNCH(embedding_forward_kernel<Tx>, dim3(static_cast<unsigned>(b * t)),
                       dim3(block), 0, stream, out, tokens, wte, wpe, t, c);
}

// dwte and dwpe accumulate (+=); neither may overlap the other or dout.
template <typename Tx>
absl::Status embedding_backward(Tx* dwte, Tx* dwpe, const Tx* dout, const int32_t* tokens,
                                int64_t b, int64_t t, int64_t c, Stream stream,
                                int block = kEmbeddingBlock) {
  if (block <= 0 || block > 1024 || b < 0 || t < 0 || c < 0) {
    return absl::InvalidArgumentError(absl::StrCat("embedding_backward: bad block ", block,
                                                   " or shape b=", b, " t=", t, " c=", c));
  }
  if (b * t == 0 || c == 0) return absl::OkStatus();
  return TROUPE_LAUNCH(embedding_backward_kernel<Tx>, dim3(CeilDiv(c, block)), dim3(block), 0,
                       stream, dwte, dwpe, dout, tokens, b * t, t, c);
}

}  // namespace troupe::kernels::cuda

#endif  // TROUPE_KERNELS_CUDA_EMBEDDING_CUH_
