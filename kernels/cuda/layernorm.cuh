// LayerNorm over the last dimension (C) of an n×C activation, the residual connection, and the
// two fused (GPT-2's pre-LN blocks), for float or bf16 storage (Tx) with float arithmetic. Same
// functions as the CPU kernels (kernels/layernorm.cc, kernels/residual.cc):
//   residual:  out = a + b;                         backward: da += dout, db += dout
//   layernorm: m = Σx/C, v = Σ(x − m)²/C (two passes, as on the CPU), s = 1/sqrt(v + 1e-5),
//              out = (s·(x − m))·w + b, saving mean m and rstd s (float, one per row);
//   backward:  dinp += s·((w·g − mean(w·g)) − norm·mean(w·g·norm)), norm = (x − m)·s,
//              dweight += Σ_rows norm·g, dbias += Σ_rows g (all accumulate, +=).
//   fused:     residual = inp1 + inp2 (stored, rounded to Tx), then layernorm of that stored
//              residual: bit-identical to residual_forward followed by layernorm_forward.
// Forward: one warp per row, several rows per block. Backward: one block per row, a fixed grid
// of min(n, max_blocks) blocks; each thread owns the columns j ≡ threadIdx.x (mod blockDim) and
// sums their dweight/dbias terms over its block's rows in row order, the block writes its partial
// sums to `scratch` (layernorm_backward_scratch_floats(n, c) floats), and a second kernel adds the
// partials to dweight/dbias in block order. No float atomics: every result is the same run to run.
// Block sizes of the row kernels are multiples of 32 (at most 1024).
//
// Example:
//   TROUPE_RETURN_IF_ERROR(fused_residual_layernorm_forward(residual, ln, mean, rstd, residual_in,
//                                                           attn_proj, w, b, B * T, C, stream));
//   // scratch: layernorm_backward_scratch_floats(B * T, C) floats of device memory
//   TROUPE_RETURN_IF_ERROR(layernorm_backward(dinp, dw, db, scratch, dout, inp, w, mean, rstd,
//                                             B * T, C, stream));
#ifndef TROUPE_KERNELS_CUDA_LAYERNORM_CUH_
#define TROUPE_KERNELS_CUDA_LAYERNORM_CUH_

#include <algorithm>
#include <climits>

#include "device.cuh"
#include "troupe/base/status_macros.h"

namespace troupe::kernels::cuda {

inline constexpr int kResidualBlock = 256;
inline constexpr int kLayerNormForwardBlock = 256;  // 8 rows per block
inline constexpr int kLayerNormBackwardBlock = 256;
// Blocks of the backward kernel: enough to fill an H100 several times over (132 SMs), few enough
// that the partial sums stay small (512·2C floats) and quick to add up.
inline constexpr int kLayerNormBackwardMaxBlocks = 512;
// The backward kernel keeps its 2C running sums in shared memory while they fit the default 48 KiB
// (C ≤ 6112), and in its own slice of `scratch` (global memory, L2-resident) beyond.
inline constexpr int kLayerNormBackwardMaxSharedC = (48 * 1024 / 4 - 64) / 2;
inline constexpr float kLayerNormEps = 1e-5f;

namespace layernorm_internal {

// Sums a and b over a block (size a multiple of 32) with one pair of barriers; every thread gets
// the results. `scratch`: 64 floats of shared memory; starts with a barrier so that consecutive
// calls may share it.
__device__ __forceinline__ void BlockSum2(float& a, float& b, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  a = WarpSum(a);
  b = WarpSum(b);
  __syncthreads();
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  a = WarpSum(lane < warps ? scratch[lane] : 0.0f);
  b = WarpSum(lane < warps ? scratch[32 + lane] : 0.0f);
}

// One warp normalises row `row` of x (C = c) into out. With kFused, x is `residual`, first
// written as inp1 + inp2 by the same lanes that read it back (so no barrier is needed).
template <bool kFused, typename Tx>
__device__ __forceinline__ void LayerNormRow(Tx* out, float* mean, float* rstd, Tx* residual,
                                             const Tx* inp1, const Tx* inp2, const Tx* weight,
                                             const Tx* bias, int64_t row, int c) {
  const int lane = threadIdx.x % 32;
  const int64_t offset = row * c;
  const Tx* x = kFused ? residual + offset : inp1 + offset;
  float sum = 0.0f;
  if (kFused) {
    for (int j = lane; j < c; j += 32) {
      const Tx r = FromFloat<Tx>(ToFloat(inp1[offset + j]) + ToFloat(inp2[offset + j]));
      residual[offset + j] = r;
      sum += ToFloat(r);
    }
  } else {
    for (int j = lane; j < c; j += 32) sum += ToFloat(x[j]);
  }
  const float m = WarpSum(sum) / c;
  // The variance from deviations (second pass), not E[x²] − m²: no cancellation when |m| ≫ std.
  float sq = 0.0f;
  for (int j = lane; j < c; j += 32) {
    const float d = ToFloat(x[j]) - m;
    sq += d * d;
  }
  const float s = 1.0f / sqrtf(WarpSum(sq) / c + kLayerNormEps);
  Tx* o = out + offset;
  for (int j = lane; j < c; j += 32) {
    o[j] = FromFloat<Tx>((s * (ToFloat(x[j]) - m)) * ToFloat(weight[j]) + ToFloat(bias[j]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

}  // namespace layernorm_internal

template <typename Tx>
__global__ void residual_forward_kernel(Tx* out, const Tx* a, const Tx* b, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = FromFloat<Tx>(ToFloat(a[i]) + ToFloat(b[i]));
}

// da and db may be the same buffer (it then receives 2·dout, as on the CPU), not dout.
template <typename Tx>
__global__ void residual_backward_kernel(Tx* da, Tx* db, const Tx* dout, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = ToFloat(dout[i]);
  da[i] = FromFloat<Tx>(ToFloat(da[i]) + g);
  db[i] = FromFloat<Tx>(ToFloat(db[i]) + g);  // reads da's new value when they alias
}

template <typename Tx>
__global__ void layernorm_forward_kernel(Tx* out, float* mean, float* rstd, const Tx* inp,
                                         const Tx* weight, const Tx* bias, int64_t n, int c) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= n) return;  // whole warps
  layernorm_internal::LayerNormRow<false, Tx>(out, mean, rstd, nullptr, inp, nullptr, weight, bias,
                                              row, c);
}

template <typename Tx>
__global__ void fused_residual_layernorm_forward_kernel(Tx* residual, Tx* out, float* mean,
                                                        float* rstd, const Tx* inp1, const Tx* inp2,
                                                        const Tx* weight, const Tx* bias, int64_t n,
                                                        int c) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= n) return;  // whole warps
  layernorm_internal::LayerNormRow<true, Tx>(out, mean, rstd, residual, inp1, inp2, weight, bias,
                                             row, c);
}

// dinp for rows blockIdx.x, blockIdx.x + gridDim.x, …, and this block's partial sums of dbias
// (scratch[blockIdx.x·2c + j]) and dweight (scratch[blockIdx.x·2c + c + j]) over those rows.
// Dynamic shared memory: 64 floats, plus 2c floats of running sums when `shared_sums`.
template <typename Tx>
__global__ void layernorm_backward_kernel(Tx* dinp, float* scratch, const Tx* dout, const Tx* inp,
                                          const Tx* weight, const float* mean, const float* rstd,
                                          int64_t n, int c, bool shared_sums) {
  TROUPE_DYNAMIC_SHARED(float, shared);
  float* reduce = shared;
  float* partial = scratch + static_cast<int64_t>(blockIdx.x) * 2 * c;
  // Thread threadIdx.x alone touches sums[j] and sums[c + j] for its columns j: no barriers.
  float* sums = shared_sums ? shared + 64 : partial;
  for (int j = threadIdx.x; j < c; j += blockDim.x) sums[j] = sums[c + j] = 0.0f;
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const int64_t offset = row * c;
    const float m = mean[row], s = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      const float g = ToFloat(dout[offset + j]);
      const float norm = (ToFloat(inp[offset + j]) - m) * s;
      const float dnorm = ToFloat(weight[j]) * g;
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * norm;
      sums[j] += g;
      sums[c + j] += norm * g;
    }
    layernorm_internal::BlockSum2(dnorm_sum, dnorm_norm_sum, reduce);
    const float dnorm_mean = dnorm_sum / c, dnorm_norm_mean = dnorm_norm_sum / c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      const float g = ToFloat(dout[offset + j]);
      const float norm = (ToFloat(inp[offset + j]) - m) * s;
      const float dnorm = ToFloat(weight[j]) * g;
      const float dx = s * ((dnorm - dnorm_mean) - norm * dnorm_norm_mean);
      dinp[offset + j] = FromFloat<Tx>(ToFloat(dinp[offset + j]) + dx);
    }
  }
  if (shared_sums) {
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      partial[j] = sums[j];
      partial[c + j] = sums[c + j];
    }
  }
}

// dbias[j] += Σ_p scratch[p·2c + j], dweight[j] += Σ_p scratch[p·2c + c + j] over the `partials`
// blocks p in order. Block (32, 8): threadIdx.x picks one of 32 adjacent columns (coalesced),
// threadIdx.y one of 8 strided subsets of the partials; the 8 subtotals are then added in y order.
template <typename Tx>
__global__ void layernorm_backward_sum_kernel(Tx* dweight, Tx* dbias, const float* scratch,
                                              int partials, int c) {
  __shared__ float subtotal[8][32];
  const int j = blockIdx.x * 32 + threadIdx.x;  // in [0, 2c): dbias then dweight
  float sum = 0.0f;
  if (j < 2 * c) {
    for (int p = threadIdx.y; p < partials; p += 8)
      sum += scratch[static_cast<int64_t>(p) * 2 * c + j];
  }
  subtotal[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || j >= 2 * c) return;
  sum = subtotal[0][threadIdx.x];
  for (int y = 1; y < 8; ++y) sum += subtotal[y][threadIdx.x];
  Tx* d = j < c ? dbias + j : dweight + (j - c);
  *d = FromFloat<Tx>(ToFloat(*d) + sum);
}

namespace layernorm_internal {
inline absl::Status CheckRowKernel(int64_t c, int block, const char* what) {
  if (c < 1 || c > INT_MAX / 2) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": C = ", c, " out of range"));
  }
  if (block < 32 || block > 1024 || block % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": block of ", block, " threads, not a multiple of 32 in [32, 1024]"));
  }
  return absl::OkStatus();
}
}  // namespace layernorm_internal

template <typename Tx>
absl::Status residual_forward(Tx* out, const Tx* a, const Tx* b, int64_t n, Stream stream,
                              int block = kResidualBlock) {
  if (n == 0) return absl::OkStatus();
  return TROUPE_LAUNCH(residual_forward_kernel<Tx>, dim3(CeilDiv(n, block)), dim3(block), 0, stream,
                       out, a, b, n);
}

template <typename Tx>
absl::Status residual_backward(Tx* da, Tx* db, const Tx* dout, int64_t n, Stream stream,
                               int block = kResidualBlock) {
  if (n == 0) return absl::OkStatus();
  return TROUPE_LAUNCH(residual_backward_kernel<Tx>, dim3(CeilDiv(n, block)), dim3(block), 0,
                       stream, da, db, dout, n);
}

template <typename Tx>
absl::Status layernorm_forward(Tx* out, float* mean, float* rstd, const Tx* inp, const Tx* weight,
                               const Tx* bias, int64_t n, int64_t c, Stream stream,
                               int block = kLayerNormForwardBlock) {
  if (n == 0) return absl::OkStatus();
  TROUPE_RETURN_IF_ERROR(layernorm_internal::CheckRowKernel(c, block, "layernorm_forward"));
  return TROUPE_LAUNCH(layernorm_forward_kernel<Tx>, dim3(CeilDiv(n, block / 32)), dim3(block), 0,
                       stream, out, mean, rstd, inp, weight, bias, n, static_cast<int>(c));
}

// residual and out: n×c. residual may be inp1 or inp2 (in place): each element is read, then
// written, by one thread.
template <typename Tx>
absl::Status fused_residual_layernorm_forward(Tx* residual, Tx* out, float* mean, float* rstd,
                                              const Tx* inp1, const Tx* inp2, const Tx* weight,
                                              const Tx* bias, int64_t n, int64_t c, Stream stream,
                                              int block = kLayerNormForwardBlock) {
  if (n == 0) return absl::OkStatus();
  TROUPE_RETURN_IF_ERROR(
      layernorm_internal::CheckRowKernel(c, block, "fused_residual_layernorm_forward"));
  return TROUPE_LAUNCH(fused_residual_layernorm_forward_kernel<Tx>, dim3(CeilDiv(n, block / 32)),
                       dim3(block), 0, stream, residual, out, mean, rstd, inp1, inp2, weight, bias,
                       n, static_cast<int>(c));
}

// Floats of scratch layernorm_backward needs for n rows of C (the same max_blocks as the launch).
inline int64_t layernorm_backward_scratch_floats(int64_t n, int64_t c,
                                                 int max_blocks = kLayerNormBackwardMaxBlocks) {
  return std::min<int64_t>(n, max_blocks) * 2 * c;
}

// dinp, dweight, dbias accumulate (+=). scratch: layernorm_backward_scratch_floats(n, c,
// max_blocks) floats, overwritten (its contents on entry do not matter). max_blocks is for tests
// that need several rows per block at small n; the result depends on it only through rounding.
template <typename Tx>
absl::Status layernorm_backward(Tx* dinp, Tx* dweight, Tx* dbias, float* scratch, const Tx* dout,
                                const Tx* inp, const Tx* weight, const float* mean,
                                const float* rstd, int64_t n, int64_t c, Stream stream,
                                int block = kLayerNormBackwardBlock,
                                int max_blocks = kLayerNormBackwardMaxBlocks) {
  if (n == 0) return absl::OkStatus();
  TROUPE_RETURN_IF_ERROR(layernorm_internal::CheckRowKernel(c, block, "layernorm_backward"));
  if (max_blocks < 1) return absl::InvalidArgumentError("layernorm_backward: max_blocks < 1");
  const int blocks = static_cast<int>(std::min<int64_t>(n, max_blocks));
  const bool shared_sums = c <= kLayerNormBackwardMaxSharedC;
  const size_t shared_bytes = (64 + (shared_sums ? 2 * c : 0)) * sizeof(float);
  TROUPE_RETURN_IF_ERROR(TROUPE_LAUNCH(layernorm_backward_kernel<Tx>, dim3(blocks), dim3(block),
                                       shared_bytes, stream, dinp, scratch, dout, inp, weight, mean,
                                       rstd, n, static_cast<int>(c), shared_sums));
  return TROUPE_LAUNCH(layernorm_backward_sum_kernel<Tx>, dim3(CeilDiv(2 * c, 32)), dim3(32, 8), 0,
                       stream, dweight, dbias, scratch, blocks, static_cast<int>(c));
}

}  // namespace troupe::kernels::cuda

#endif  // TROUPE_KERNELS_CUDA_LAYERNORM_CUH_
