// What every kernel header in kernels/cuda/ includes first: the CUDA headers under nvcc, the
// SIMT-on-CPU layer (simt.h) under g++, and the few pieces that differ between the two: dynamic
// shared memory, the launch itself, and turning a launch's outcome into a Status.
//
// Kernels are written as plain CUDA (__global__, __shared__, __syncthreads, __shfl_xor_sync,
// threadIdx, …). Launchers use TROUPE_LAUNCH instead of <<<…>>>:
//   return TROUPE_LAUNCH(gelu_forward_kernel, dim3(blocks), dim3(256), 0, stream, out, inp, n);
// Inline PTX, cp.async, TMA and mma belong behind `#ifdef __CUDACC__` with a plain fallback.
#ifndef TROUPE_KERNELS_CUDA_DEVICE_CUH_
#define TROUPE_KERNELS_CUDA_DEVICE_CUH_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#else
#include "simt.h"
#endif

namespace troupe::kernels::cuda {

#ifdef __CUDACC__
using Stream = cudaStream_t;

inline absl::Status CudaStatus(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", what, ": ", cudaGetErrorName(e),
                                          ": ", cudaGetErrorString(e)));
}
#else
using Stream = void*;  // the SIMT layer runs each launch to completion on the calling thread
#endif

inline constexpr unsigned kFullMask = 0xffffffffu;

// Storage types: float, or bf16 (__nv_bfloat16) with float arithmetic. Conversions round to
// nearest even.
__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

inline unsigned CeilDiv(int64_t n, int64_t d) { return static_cast<unsigned>((n + d - 1) / d); }

// Sum over the 32 lanes of a full warp, the same butterfly order on every lane.
__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

}  // namespace troupe::kernels::cuda

#ifdef __CUDACC__
#define TROUPE_DYNAMIC_SHARED(type, name)       \
  extern __shared__ unsigned char name##_raw[]; \
  type* name = reinterpret_cast<type*>(name##_raw)
#define TROUPE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                      \
  (kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__),                     \
   ::troupe::kernels::cuda::CudaStatus(cudaGetLastError(), "launch of " #kernel, __FILE__, \
                                       __LINE__))
#else
#define TROUPE_DYNAMIC_SHARED(type, name) \
  type* name = reinterpret_cast<type*>(::troupe::kernels::simt::detail::current_dynamic_shared)
#define TROUPE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                        \
  ((void)(stream), ::troupe::kernels::simt::Launch(#kernel, (grid), (block), (shared_bytes), \
                                                   [&] { kernel(__VA_ARGS__); }))
#endif

#endif  // TROUPE_KERNELS_CUDA_DEVICE_CUH_
