// Private: the device kernels of the NCCL communicator (nccl_kernels.cu, compiled by nvcc only
// when TROUPE_HAVE_CUDA), behind plain declarations so nccl_backend_cuda.cc (g++) can launch them.
//
// Conventions: each function launches one kernel on `stream` (a cudaStream_t, as NcclBackend's
// StreamHandle) and returns the launch's cudaError_t value as an int (NcclBackend's CudaError);
// nothing is launched for n == 0. The header includes nothing of the project's (nvcc compiles
// only this and the kernels). Element-wise and in f32 with IEEE round-to-nearest, no fused
// operations: the result is bit-identical to the host's a + b.
//
// Example:
//   int e = LaunchAddF32(d_dst, d_a, d_b, n, stream);  // d_dst[i] = d_a[i] + d_b[i]
#ifndef TROUPE_COLLECTIVES_NCCL_KERNELS_H_
#define TROUPE_COLLECTIVES_NCCL_KERNELS_H_

#include <cstddef>

namespace troupe::collectives {

struct CudaStreamOpaque;  // NcclBackend's StreamHandle points to one

// dst[i] = a[i] + b[i] for i < n; dst may be a or b.
int LaunchAddF32(float* dst, const float* a, const float* b, size_t n, CudaStreamOpaque* stream);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_NCCL_KERNELS_H_
