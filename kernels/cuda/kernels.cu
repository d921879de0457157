// The CUDA kernels of kernels/cuda/*.cuh compiled by nvcc: every launcher instantiated for the
// storage types training uses (float, bf16), so that each kernel is built for every target
// architecture, with spills and local memory as build errors (CMakeLists.txt).
#include "gelu.cuh"

namespace troupe::kernels::cuda {

#define TROUPE_INSTANTIATE_ELEMENTWISE(Tx)                                      \
  template absl::Status gelu_forward<Tx>(Tx*, const Tx*, int64_t, Stream, int); \
  template absl::Status gelu_backward<Tx>(Tx*, const Tx*, const Tx*, int64_t, Stream, int);

TROUPE_INSTANTIATE_ELEMENTWISE(float)
TROUPE_INSTANTIATE_ELEMENTWISE(__nv_bfloat16)

}  // namespace troupe::kernels::cuda
