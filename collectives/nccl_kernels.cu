// The NCCL communicator's device kernels (nccl_kernels.h): the element-wise add that combines
// partials of an ordered reduce-scatter in canonical tree order.
#include <cuda_runtime.h>

#include <algorithm>

#include "nccl_kernels.h"

namespace troupe::collectives {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;  // a grid-stride loop covers the rest

// No __restrict__: dst may be a or b (each element is read before it is written, by one thread).
__global__ void AddF32Kernel(float* dst, const float* a, const float* b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = __fadd_rn(a[i], b[i]);  // never contracted into a fused multiply-add
  }
}

}  // namespace

int LaunchAddF32(float* dst, const float* a, const float* b, size_t n, CudaStreamOpaque* stream) {
  if (n == 0) return cudaSuccess;
  const size_t blocks = std::min(kMaxBlocks, (n + kThreads - 1) / kThreads);
  AddF32Kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                 reinterpret_cast<cudaStream_t>(stream)>>>(dst, a, b, n);
  return cudaGetLastError();
}

}  // namespace troupe::collectives
