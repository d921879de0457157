// Causal multi-head self-attention, flash-style (forward and backward), for float or bf16 storage
// with float arithmetic. Same function and layout as the CPU kernel (kernels/attention.cc):
//   qkv [B, T, 3C]: queries in columns [0, C), keys in [C, 2C), values in [2C, 3C), head h in
//   columns [h*hs, (h+1)*hs) of each (hs = C / NH <= 128); out [B, T, C];
//   out_t = Σ_{j<=t} softmax_j(q_t·k_j / sqrt(hs)) v_j.
// No T×T matrix is ever stored. Forward: one block per tile of kAttentionTile queries of one (b, h)
// loops over tiles of keys and values in shared memory with an online softmax (running max m and
// sum l, rescaling the output accumulator when the max grows), and writes out and the logsumexp
// lse [B, NH, T] = m + log l (float) for backward. Backward (flash-attention-2) recomputes the
// probabilities P = exp(s − lse) and accumulates into dqkv (dqkv += …, as the CPU kernel does):
//   1. attention_backward_dq_kernel, per query tile, looping over key tiles in order:
//      D_t = rowsum(dout ∘ out) (written to the workspace), dS = P ∘ (dout·vᵀ − D),
//      dq = dS k / √hs;
//   2. attention_backward_dkdv_kernel, per key tile, looping over query tiles in order:
//      dv = Pᵀ dout, dk = dSᵀ q / √hs.
// D comes from the `out` given (bf16 when Tx is): the bf16 gradient is that of the stored out,
// which differs from the exact one by |ΔD_t| <= 2^-9 Σ_c |dout_tc out_tc| (flash attention does
// the same). Each output is one rounding of a float sum.
// No atomics: every output element is summed by one thread in a fixed order, so results are
// deterministic, and independent of `group` (threads per row) too.
// Work split: a block is kAttentionTile rows (queries, or keys in dkdv) × `group` threads per row;
// a thread computes whole dot products for keys (queries) g, g + group, … of each tile, and keeps
// the row's output channels g, g + group, … (at most kAttentionMaxChannels) in registers. The
// workspace holds D: attention_workspace_bytes(B, T, C, NH) = B·NH·T floats, linear in T.
//
// Example:
//   TROUPE_RETURN_IF_ERROR(attention_forward(out, lse, qkv, B, T, C, NH, stream));
//   TROUPE_RETURN_IF_ERROR(attention_backward(dqkv, dout, qkv, out, lse, workspace, B, T, C, NH,
//                                             stream));  // workspace: attention_workspace_bytes
#ifndef TROUPE_KERNELS_CUDA_ATTENTION_CUH_
#define TROUPE_KERNELS_CUDA_ATTENTION_CUH_

#include <cmath>

#include "device.cuh"
#include "troupe/base/status_macros.h"

// The per-thread accumulators stay in registers only if their loops are unrolled (g++ would warn
// about the CUDA pragma).
#ifdef __CUDACC__
#define TROUPE_ATTENTION_UNROLL _Pragma("unroll")
#else
#define TROUPE_ATTENTION_UNROLL
#endif

namespace troupe::kernels::cuda {

// Rows (queries or keys) per block, and keys (queries) per shared-memory tile. 16 keeps the
// largest layout (dkdv at hs = 128: four 16×129 float tiles plus P and dS) at 35 KB, under the
// 48 KB of shared memory a block gets without opting in.
inline constexpr int kAttentionTile = 16;
inline constexpr int kAttentionMaxChannels = 8;    // accumulators per thread (per output)
inline constexpr int kAttentionMaxGroup = 32;      // threads per row: within one warp
inline constexpr int kAttentionMaxHeadSize = 128;  // GPT-2: 64
inline constexpr int kAttentionMaxThreads = kAttentionTile * kAttentionMaxGroup;

// The default threads per row: the fewest (a power of two) that hold hs channels.
inline int AttentionDefaultGroup(int64_t hs) {
  int group = 1;
  while (group * kAttentionMaxChannels < hs) group *= 2;
  return group;
}

// Bytes of global scratch attention_backward needs: D [B, NH, T].
inline size_t attention_workspace_bytes(int64_t B, int64_t T, int64_t C, int64_t NH) {
  (void)C;
  return static_cast<size_t>(B * NH * T) * sizeof(float);
}

namespace attention_internal {

// Shared-memory rows of hs floats are padded to an odd pitch, so that threads reading the same
// column of different rows hit different banks.
__device__ __forceinline__ int Pitch(int hs) { return hs | 1; }
inline int HostPitch(int64_t hs) { return static_cast<int>(hs | 1); }
inline constexpr int kScorePitch = kAttentionTile + 1;

// rows × hs of a [*, stride] matrix from row row0 into shared memory, as float; rows at or past T
// are zero (finite: a zero probability times a value row must stay zero).
template <typename Tx>
__device__ __forceinline__ void LoadRows(float* dst, const Tx* src, int64_t stride, int row0,
                                         int rows, int T, int hs) {
  const int pitch = Pitch(hs);
  for (int idx = threadIdx.x; idx < rows * hs; idx += blockDim.x) {
    const int r = idx / hs, c = idx % hs, t = row0 + r;
    dst[r * pitch + c] = t < T ? ToFloat(src[static_cast<int64_t>(t) * stride + c]) : 0.0f;
  }
}

// One float per row (lse, D) of the tile starting at row0; 0 past T.
__device__ __forceinline__ void LoadScalars(float* dst, const float* src, int row0, int T) {
  for (int r = threadIdx.x; r < kAttentionTile; r += blockDim.x) {
    dst[r] = row0 + r < T ? src[row0 + r] : 0.0f;
  }
}

__device__ __forceinline__ int Min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int Max(int a, int b) { return a > b ? a : b; }

__device__ __forceinline__ float Dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

}  // namespace attention_internal

// Grid (query tiles, NH, B), block kAttentionTile × group threads. Thread (r, g) owns query
// i = q0 + r. The last query tiles (most keys) are scheduled first.
template <typename Tx>
__global__ void __launch_bounds__(kAttentionMaxThreads)
    attention_forward_kernel(Tx* out, float* lse, const Tx* qkv, int T, int C, int NH, int group) {
  using namespace attention_internal;
  constexpr int kTile = kAttentionTile;
  const int hs = C / NH, pitch = Pitch(hs);
  TROUPE_DYNAMIC_SHARED(float, smem);
  float* qs = smem;                      // [kTile][pitch] queries
  float* ks = qs + kTile * pitch;        // [kTile][pitch] keys
  float* vs = ks + kTile * pitch;        // [kTile][pitch] values
  float* ss = vs + kTile * pitch;        // [kTile][kScorePitch] scores
  float* ps = ss + kTile * kScorePitch;  // [kTile][kScorePitch] probabilities (scaled by e^-m)

  const int b = blockIdx.z, h = blockIdx.y;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int r = threadIdx.x / group, g = threadIdx.x % group;
  const int i = q0 + r;
  // Rows past T act as row T − 1 (finite throughout) and are not written.
  const int i_eff = Min(i, T - 1);
  const int64_t stride = 3LL * C;
  const Tx* q = qkv + static_cast<int64_t>(b) * T * stride + h * hs;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));

  LoadRows(qs, q, stride, q0, kTile, T, hs);
  float m = -INFINITY, l = 0.0f, acc[kAttentionMaxChannels];
  TROUPE_ATTENTION_UNROLL
  for (int u = 0; u < kAttentionMaxChannels; ++u) acc[u] = 0.0f;

  const int last_key = Min(q0 + kTile, T) - 1;
  for (int k0 = 0; k0 <= last_key; k0 += kTile) {
    __syncthreads();  // the previous tile's ks, vs, ps are read
    LoadRows(ks, q + C, stride, k0, kTile, T, hs);
    LoadRows(vs, q + 2 * C, stride, k0, kTile, T, hs);
    __syncthreads();
    for (int jj = g; jj < kTile; jj += group) {
      ss[r * kScorePitch + jj] =
          k0 + jj <= i_eff ? Dot(qs + r * pitch, ks + jj * pitch, hs) * scale : -INFINITY;
    }
    __syncthreads();
    // Every thread of the row scans the whole row: the same max in all, with no shuffles.
    float m_tile = -INFINITY;
    for (int jj = 0; jj < kTile; ++jj) m_tile = fmaxf(m_tile, ss[r * kScorePitch + jj]);
    const float m_new = fmaxf(m, m_tile);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
    for (int jj = g; jj < kTile; jj += group) {
      const float s = ss[r * kScorePitch + jj];
      ps[r * kScorePitch + jj] = s == -INFINITY ? 0.0f : expf(s - m_new);
    }
    m = m_new;
    __syncthreads();
    l *= alpha;
    TROUPE_ATTENTION_UNROLL
    for (int u = 0; u < kAttentionMaxChannels; ++u) acc[u] *= alpha;
    const int jj_end = Min(kTile, i_eff - k0 + 1);  // masked keys have p = 0
    for (int jj = 0; jj < jj_end; ++jj) {
      const float p = ps[r * kScorePitch + jj];
      l += p;
      TROUPE_ATTENTION_UNROLL
      for (int u = 0; u < kAttentionMaxChannels; ++u) {
        const int c = g + u * group;
        if (c < hs) acc[u] += p * vs[jj * pitch + c];
      }
    }
  }
  if (i >= T) return;
  Tx* o = out + (static_cast<int64_t>(b) * T + i) * C + h * hs;
  TROUPE_ATTENTION_UNROLL
  for (int u = 0; u < kAttentionMaxChannels; ++u) {
    const int c = g + u * group;
    if (c < hs) o[c] = FromFloat<Tx>(acc[u] / l);
  }
  if (g == 0) lse[(static_cast<int64_t>(b) * NH + h) * T + i] = m + logf(l);
}

// Grid (query tiles, NH, B), block kAttentionTile × group. Thread (r, g) owns query i = q0 + r:
// computes D_i (one thread per row, in channel order), then dq_i over the key tiles in order.
template <typename Tx>
__global__ void __launch_bounds__(kAttentionMaxThreads)
    attention_backward_dq_kernel(Tx* dqkv, float* dsum, const Tx* dout, const Tx* qkv,
                                 const Tx* out, const float* lse, int T, int C, int NH, int group) {
  using namespace attention_internal;
  constexpr int kTile = kAttentionTile;
  const int hs = C / NH, pitch = Pitch(hs);
  TROUPE_DYNAMIC_SHARED(float, smem);
  float* qs = smem;                         // [kTile][pitch] queries
  float* dos = qs + kTile * pitch;          // [kTile][pitch] dout
  float* ks = dos + kTile * pitch;          // [kTile][pitch] keys
  float* vs = ks + kTile * pitch;           // [kTile][pitch] values
  float* dss = vs + kTile * pitch;          // [kTile][kScorePitch] dS
  float* lses = dss + kTile * kScorePitch;  // [kTile]
  float* ds_row = lses + kTile;             // [kTile] D

  const int b = blockIdx.z, h = blockIdx.y;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int r = threadIdx.x / group, g = threadIdx.x % group;
  const int i = q0 + r;
  const int i_eff = Min(i, T - 1);
  const int64_t stride = 3LL * C;
  const int64_t bh = static_cast<int64_t>(b) * NH + h;
  const Tx* q = qkv + static_cast<int64_t>(b) * T * stride + h * hs;
  const int64_t dout_off = static_cast<int64_t>(b) * T * C + h * hs;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));

  LoadRows(qs, q, stride, q0, kTile, T, hs);
  LoadRows(dos, dout + dout_off, C, q0, kTile, T, hs);
  LoadScalars(lses, lse + bh * T, q0, T);
  __syncthreads();
  if (g == 0) {
    float d = 0.0f;
    if (i < T) {
      const Tx* o = out + dout_off + static_cast<int64_t>(i) * C;
      for (int c = 0; c < hs; ++c) d += dos[r * pitch + c] * ToFloat(o[c]);
      dsum[bh * T + i] = d;
    }
    ds_row[r] = d;
  }
  float acc[kAttentionMaxChannels];
  TROUPE_ATTENTION_UNROLL
  for (int u = 0; u < kAttentionMaxChannels; ++u) acc[u] = 0.0f;

  const int last_key = Min(q0 + kTile, T) - 1;
  for (int k0 = 0; k0 <= last_key; k0 += kTile) {
    __syncthreads();  // ds_row is written; the previous tile's ks, dss are read
    LoadRows(ks, q + C, stride, k0, kTile, T, hs);
    LoadRows(vs, q + 2 * C, stride, k0, kTile, T, hs);
    __syncthreads();
    for (int jj = g; jj < kTile; jj += group) {
      float ds = 0.0f;
      if (k0 + jj <= i_eff) {
        const float p = expf(Dot(qs + r * pitch, ks + jj * pitch, hs) * scale - lses[r]);
        ds = p * (Dot(dos + r * pitch, vs + jj * pitch, hs) - ds_row[r]);
      }
      dss[r * kScorePitch + jj] = ds;
    }
    __syncthreads();
    const int jj_end = Min(kTile, i_eff - k0 + 1);
    for (int jj = 0; jj < jj_end; ++jj) {
      const float ds = dss[r * kScorePitch + jj];
      TROUPE_ATTENTION_UNROLL
      for (int u = 0; u < kAttentionMaxChannels; ++u) {
        const int c = g + u * group;
        if (c < hs) acc[u] += ds * ks[jj * pitch + c];
      }
    }
  }
  if (i >= T) return;
  Tx* dq = dqkv + (static_cast<int64_t>(b) * T + i) * stride + h * hs;
  TROUPE_ATTENTION_UNROLL
  for (int u = 0; u < kAttentionMaxChannels; ++u) {
    const int c = g + u * group;
    if (c < hs) dq[c] = FromFloat<Tx>(ToFloat(dq[c]) + acc[u] * scale);
  }
}

// Grid (key tiles, NH, B), block kAttentionTile × group. Thread (r, g) owns key j = k0 + r and
// sums dk_j, dv_j over the query tiles from the diagonal on, in order. Reads D from the dq kernel.
template <typename Tx>
__global__ void __launch_bounds__(kAttentionMaxThreads)
    attention_backward_dkdv_kernel(Tx* dqkv, const float* dsum, const Tx* dout, const Tx* qkv,
                                   const float* lse, int T, int C, int NH, int group) {
  using namespace attention_internal;
  constexpr int kTile = kAttentionTile;
  const int hs = C / NH, pitch = Pitch(hs);
  TROUPE_DYNAMIC_SHARED(float, smem);
  float* ks = smem;                         // [kTile][pitch] keys
  float* vs = ks + kTile * pitch;           // [kTile][pitch] values
  float* qs = vs + kTile * pitch;           // [kTile][pitch] queries
  float* dos = qs + kTile * pitch;          // [kTile][pitch] dout
  float* ps = dos + kTile * pitch;          // [kTile][kScorePitch] P (key-major)
  float* dss = ps + kTile * kScorePitch;    // [kTile][kScorePitch] dS (key-major)
  float* lses = dss + kTile * kScorePitch;  // [kTile]
  float* ds_row = lses + kTile;             // [kTile] D

  const int b = blockIdx.z, h = blockIdx.y;
  const int k0 = blockIdx.x * kTile;  // the first key tiles (most queries) are scheduled first
  const int r = threadIdx.x / group, g = threadIdx.x % group;
  const int j = k0 + r;
  const int64_t stride = 3LL * C;
  const int64_t bh = static_cast<int64_t>(b) * NH + h;
  const Tx* q = qkv + static_cast<int64_t>(b) * T * stride + h * hs;
  const Tx* dout_bh = dout + static_cast<int64_t>(b) * T * C + h * hs;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));

  LoadRows(ks, q + C, stride, k0, kTile, T, hs);
  LoadRows(vs, q + 2 * C, stride, k0, kTile, T, hs);
  float dk[kAttentionMaxChannels], dv[kAttentionMaxChannels];
  TROUPE_ATTENTION_UNROLL
  for (int u = 0; u < kAttentionMaxChannels; ++u) dk[u] = dv[u] = 0.0f;

  for (int q0 = k0; q0 < T; q0 += kTile) {  // tiles are aligned: query tile k0 holds the diagonal
    __syncthreads();                        // the previous tile's qs, dos, ps, dss are read
    LoadRows(qs, q, stride, q0, kTile, T, hs);
    LoadRows(dos, dout_bh, C, q0, kTile, T, hs);
    LoadScalars(lses, lse + bh * T, q0, T);
    LoadScalars(ds_row, dsum + bh * T, q0, T);
    __syncthreads();
    for (int ii = g; ii < kTile; ii += group) {
      const int i = q0 + ii;
      float p = 0.0f, ds = 0.0f;
      if (i >= j && i < T) {
        p = expf(Dot(qs + ii * pitch, ks + r * pitch, hs) * scale - lses[ii]);
        ds = p * (Dot(dos + ii * pitch, vs + r * pitch, hs) - ds_row[ii]);
      }
      ps[r * kScorePitch + ii] = p;
      dss[r * kScorePitch + ii] = ds;
    }
    __syncthreads();
    // Queries before j (diagonal tile) and past T have p = dS = 0.
    const int ii_begin = Max(0, j - q0), ii_end = Min(kTile, T - q0);
    for (int ii = ii_begin; ii < ii_end; ++ii) {
      const float p = ps[r * kScorePitch + ii], ds = dss[r * kScorePitch + ii];
      TROUPE_ATTENTION_UNROLL
      for (int u = 0; u < kAttentionMaxChannels; ++u) {
        const int c = g + u * group;
        if (c < hs) {
          dv[u] += p * dos[ii * pitch + c];
          dk[u] += ds * qs[ii * pitch + c];
        }
      }
    }
  }
  if (j >= T) return;
  Tx* dk_out = dqkv + (static_cast<int64_t>(b) * T + j) * stride + C + h * hs;
  Tx* dv_out = dk_out + C;
  TROUPE_ATTENTION_UNROLL
  for (int u = 0; u < kAttentionMaxChannels; ++u) {
    const int c = g + u * group;
    if (c < hs) {
      dk_out[c] = FromFloat<Tx>(ToFloat(dk_out[c]) + dk[u] * scale);
      dv_out[c] = FromFloat<Tx>(ToFloat(dv_out[c]) + dv[u]);
    }
  }
}

namespace attention_internal {

// Checks the shape and resolves group (0: the default for hs).
inline absl::Status CheckShape(int64_t B, int64_t T, int64_t C, int64_t NH, int& group) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention: bad shape B=", B, " T=", T, " C=", C, " NH=", NH));
  }
  const int64_t hs = C / NH;
  if (hs > kAttentionMaxHeadSize || B > 65535 || NH > 65535 || T > (int64_t{1} << 30) ||
      3 * C > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("attention: unsupported shape B=", B, " T=", T,
                                                   " C=", C, " NH=", NH,
                                                   " (head size <= ", kAttentionMaxHeadSize, ")"));
  }
  if (group == 0) group = AttentionDefaultGroup(hs);
  if (group < 1 || group > kAttentionMaxGroup || (group & (group - 1)) != 0 ||
      group * kAttentionMaxChannels < hs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention: group ", group, " is not a power of two in [1, 32] holding hs=", hs, " in ",
        kAttentionMaxChannels, " channels per thread"));
  }
  return absl::OkStatus();
}

inline size_t ForwardSharedBytes(int64_t hs) {
  return (3 * kAttentionTile * HostPitch(hs) + 2 * kAttentionTile * kScorePitch) * sizeof(float);
}
inline size_t BackwardSharedBytes(int64_t hs) {  // dq and dkdv (dkdv needs one more score tile)
  return (4 * kAttentionTile * HostPitch(hs) + 2 * kAttentionTile * kScorePitch +
          2 * kAttentionTile) *
         sizeof(float);
}

}  // namespace attention_internal

// out [B, T, C] and lse [B, NH, T] from qkv [B, T, 3C]. group: threads per row (0: the default).
template <typename Tx>
absl::Status attention_forward(Tx* out, float* lse, const Tx* qkv, int64_t B, int64_t T, int64_t C,
                               int64_t NH, Stream stream, int group = 0) {
  using namespace attention_internal;
  TROUPE_RETURN_IF_ERROR(CheckShape(B, T, C, NH, group));
  if (B == 0 || T == 0) return absl::OkStatus();
  return TROUPE_LAUNCH(
      attention_forward_kernel<Tx>,
      dim3(CeilDiv(T, kAttentionTile), static_cast<unsigned>(NH), static_cast<unsigned>(B)),
      dim3(kAttentionTile * group), ForwardSharedBytes(C / NH), stream, out, lse, qkv,
      static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH), group);
}

// dqkv [B, T, 3C] += the gradient, from dout [B, T, C] and the forward's qkv, out and lse.
// workspace: attention_workspace_bytes(B, T, C, NH) bytes of device memory (float-aligned).
template <typename Tx>
absl::Status attention_backward(Tx* dqkv, const Tx* dout, const Tx* qkv, const Tx* out,
                                const float* lse, void* workspace, int64_t B, int64_t T, int64_t C,
                                int64_t NH, Stream stream, int group = 0) {
  using namespace attention_internal;
  TROUPE_RETURN_IF_ERROR(CheckShape(B, T, C, NH, group));
  if (B == 0 || T == 0) return absl::OkStatus();
  float* dsum = static_cast<float*>(workspace);
  const dim3 grid(CeilDiv(T, kAttentionTile), static_cast<unsigned>(NH), static_cast<unsigned>(B));
  const size_t shared = BackwardSharedBytes(C / NH);
  const int t = static_cast<int>(T), c = static_cast<int>(C), nh = static_cast<int>(NH);
  TROUPE_RETURN_IF_ERROR(TROUPE_LAUNCH(attention_backward_dq_kernel<Tx>, grid,
                                       dim3(kAttentionTile * group), shared, stream, dqkv, dsum,
                                       dout, qkv, out, lse, t, c, nh, group));
  return TROUPE_LAUNCH(attention_backward_dkdv_kernel<Tx>, grid, dim3(kAttentionTile * group),
                       shared, stream, dqkv, dsum, dout, qkv, lse, t, c, nh, group);
}

}  // namespace troupe::kernels::cuda

#undef TROUPE_ATTENTION_UNROLL

#endif  // TROUPE_KERNELS_CUDA_ATTENTION_CUH_
