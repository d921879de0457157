// GELU (tanh approximation, GPT-2's), forward and backward, element-wise, for float or bf16
// storage with float arithmetic. Same formula as the CPU kernel (kernels/gelu.cc):
//   gelu(x) = x · σ(2u), u = sqrt(2/π)(x + 0.044715 x³);  d/dx = σ + 2xσ(1 − σ) du/dx.
// Backward accumulates into dinp (dinp += gelu'(x) · dout), as the CPU kernel does.
//
// Example:
//   TROUPE_RETURN_IF_ERROR(gelu_forward(out, inp, B * T * 4 * C, stream));
#ifndef TROUPE_KERNELS_CUDA_GELU_CUH_
#define TROUPE_KERNELS_CUDA_GELU_CUH_

#include "device.cuh"

namespace troupe::kernels::cuda {

inline constexpr float kGeluScale = 0.79788456080286535588f;  // sqrt(2/π)
inline constexpr int kGeluBlock = 256;

template <typename Tx>
__global__ void gelu_forward_kernel(Tx* out, const Tx* inp, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = ToFloat(inp[i]);
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  out[i] = FromFloat<Tx>(x / (1.0f + expf(-2.0f * u)));
}

template <typename Tx>
__global__ void gelu_backward_kernel(Tx* dinp, const Tx* inp, const Tx* dout, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = ToFloat(inp[i]);
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  const float sig = 1.0f / (1.0f + expf(-2.0f * u));
  const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
  const float local = sig + 2.0f * x * sig * (1.0f - sig) * du;
  dinp[i] = FromFloat<Tx>(ToFloat(dinp[i]) + local * ToFloat(dout[i]));
}

template <typename Tx>
absl::Status gelu_forward(Tx* out, const Tx* inp, int64_t n, Stream stream,
                          int block = kGeluBlock) {
  if (n == 0) return absl::OkStatus();
  return TROUPE_LAUNCH(gelu_forward_kernel<Tx>, dim3(CeilDiv(n, block)), dim3(block), 0, stream,
                       out, inp, n);
}

template <typename Tx>
absl::Status gelu_backward(Tx* dinp, const Tx* inp, const Tx* dout, int64_t n, Stream stream,
                           int block = kGeluBlock) {
  if (n == 0) return absl::OkStatus();
  return TROUPE_LAUNCH(gelu_backward_kernel<Tx>, dim3(CeilDiv(n, block)), dim3(block), 0, stream,
                       dinp, inp, dout, n);
}

}  // namespace troupe::kernels::cuda

#endif  // TROUPE_KERNELS_CUDA_GELU_CUH_
