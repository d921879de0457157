// The CUDA kernels of kernels/cuda/*.cuh compiled by nvcc: every launcher instantiated for the
// storage types training uses (float, bf16), so that each kernel is built for every target
// architecture, with spills and local memory as build errors (CMakeLists.txt).
#include "adamw.cuh"
#include "attention.cuh"
#include "crossentropy.cuh"
#include "embedding.cuh"
#include "gelu.cuh"
#include "layernorm.cuh"
#include "norm.cuh"

namespace troupe::kernels::cuda {

#define TROUPE_INSTANTIATE_ELEMENTWISE(Tx)                                      \
  template absl::Status gelu_forward<Tx>(Tx*, const Tx*, int64_t, Stream, int); \
  template absl::Status gelu_backward<Tx>(Tx*, const Tx*, const Tx*, int64_t, Stream, int);

TROUPE_INSTANTIATE_ELEMENTWISE(float)
TROUPE_INSTANTIATE_ELEMENTWISE(__nv_bfloat16)

// Residual, LayerNorm and the two fused: Tx activations and weights, float mean/rstd/scratch.
#define TROUPE_INSTANTIATE_LAYERNORM(Tx)                                                          \
  template absl::Status residual_forward<Tx>(Tx*, const Tx*, const Tx*, int64_t, Stream, int);    \
  template absl::Status residual_backward<Tx>(Tx*, Tx*, const Tx*, int64_t, Stream, int);         \
  template absl::Status layernorm_forward<Tx>(Tx*, float*, float*, const Tx*, const Tx*,          \
                                              const Tx*, int64_t, int64_t, Stream, int);          \
  template absl::Status fused_residual_layernorm_forward<Tx>(Tx*, Tx*, float*, float*, const Tx*, \
                                                             const Tx*, const Tx*, const Tx*,     \
                                                             int64_t, int64_t, Stream, int);      \
  template absl::Status layernorm_backward<Tx>(Tx*, Tx*, Tx*, float*, const Tx*, const Tx*,       \
                                               const Tx*, const float*, const float*, int64_t,    \
                                               int64_t, Stream, int, int);

TROUPE_INSTANTIATE_LAYERNORM(float)
TROUPE_INSTANTIATE_LAYERNORM(__nv_bfloat16)

// AdamW: fp32 master weights, m, v; fp32 or bf16 gradients.
template absl::Status adamw_update<float>(float*, __nv_bfloat16*, const float*, float*, float*,
                                          int64_t, const AdamWScalars&, Stream, int,
                                          const AdamWSources*);
template absl::Status adamw_update<__nv_bfloat16>(float*, __nv_bfloat16*, const __nv_bfloat16*,
                                                  float*, float*, int64_t, const AdamWScalars&,
                                                  Stream, int, const AdamWSources*);

// Gradient-norm chunk sums (double per chunk) of an fp32 or bf16 buffer.
template absl::Status chunk_square_sums<float>(double*, const float*, int64_t, Stream, int);
template absl::Status chunk_square_sums<__nv_bfloat16>(double*, const __nv_bfloat16*, int64_t,
                                                       Stream, int);

// Cross-entropy (Tx logits, float losses and lse) and the token + position embedding.
#define TROUPE_INSTANTIATE_CROSSENTROPY_EMBEDDING(Tx)                                             \
  template absl::Status crossentropy_forward<Tx>(float*, float*, const Tx*, const int32_t*,       \
                                                 int64_t, int64_t, Stream, int);                  \
  template absl::Status crossentropy_backward<Tx>(Tx*, const Tx*, const float*, const int32_t*,   \
                                                  float, int64_t, int64_t, Stream, int);          \
  template absl::Status embedding_forward<Tx>(Tx*, const int32_t*, const Tx*, const Tx*, int64_t, \
                                              int64_t, int64_t, Stream, int);                     \
  template absl::Status embedding_backward<Tx>(Tx*, Tx*, const Tx*, const int32_t*, int64_t,      \
                                               int64_t, int64_t, Stream, int);

TROUPE_INSTANTIATE_CROSSENTROPY_EMBEDDING(float)
TROUPE_INSTANTIATE_CROSSENTROPY_EMBEDDING(__nv_bfloat16)

// Causal self-attention, flash-style: Tx activations, float lse and workspace.
#define TROUPE_INSTANTIATE_ATTENTION(Tx)                                                           \
  template absl::Status attention_forward<Tx>(Tx*, float*, const Tx*, int64_t, int64_t, int64_t,   \
                                              int64_t, Stream, int);                               \
  template absl::Status attention_backward<Tx>(Tx*, const Tx*, const Tx*, const Tx*, const float*, \
                                               void*, int64_t, int64_t, int64_t, int64_t, Stream,  \
                                               int);

TROUPE_INSTANTIATE_ATTENTION(float)
TROUPE_INSTANTIATE_ATTENTION(__nv_bfloat16)

}  // namespace troupe::kernels::cuda
