// GptCuda's internals (gpt.cuh): the kernels converting between the fp32 master weights and the
// Tx copy, zeroing and host <-> device copies that run the same through the SIMT layer, and the
// arena that carves the model's buffers out of one allocator block.
#ifndef TROUPE_MODEL_CUDA_GPT_INTERNAL_CUH_
#define TROUPE_MODEL_CUDA_GPT_INTERNAL_CUH_

// clang-format off
// First, as in gpt.cuh: under g++ the SIMT layer (simt.h) must define __device__ & co. before any
// CUDA header does.
#include "device.cuh"
// clang-format on

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator.h"
#include "check.h"
#include "matmul_lt.h"
#include "troupe/base/status_macros.h"

namespace troupe::model::cuda {

using namespace ::troupe::kernels::cuda;  // NOLINT(build/namespaces): as in gpt.cuh

namespace gpt_internal {

inline constexpr int kConvertBlock = 256;

// The Tx copy of the fp32 master weights.
template <typename Tx>
__global__ void gpt_from_float_kernel(Tx* out, const float* inp, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = FromFloat<Tx>(inp[i]);
}

// Tx gradients widened to fp32 (exact: every bf16 value is a float).
template <typename Tx>
__global__ void gpt_to_float_kernel(float* out, const Tx* inp, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = ToFloat(inp[i]);
}

template <typename Tx>
constexpr MatmulDtype DtypeOf() {
  static_assert(std::is_same_v<Tx, float> || std::is_same_v<Tx, __nv_bfloat16>);
  return std::is_same_v<Tx, float> ? MatmulDtype::kF32 : MatmulDtype::kBf16;
}

// The largest power of two (at most 16 bytes) dividing every pointer of the call: what the plan
// may promise cuBLASLt (MatmulShape::alignment).
inline uint32_t AlignmentOf(const MatmulBuffers& b) {
  uintptr_t bits = 16;
  for (const void* p : {static_cast<const void*>(b.out), b.inp, b.weight, b.dout, b.bias,
                        static_cast<const void*>(b.pre_gelu), b.ones}) {
    bits |= reinterpret_cast<uintptr_t>(p);
  }
  return static_cast<uint32_t>(bits & (~bits + 1));
}

inline absl::Status Zero(void* p, size_t bytes, Stream stream) {
#ifdef __CUDACC__
  TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaMemsetAsync(p, 0, bytes, stream)));
#else
  (void)stream;
  std::memset(p, 0, bytes);
#endif
  return absl::OkStatus();
}

// A copy between host and device memory (to the device when `to_device`), waited for: after the
// work enqueued before it, and the host buffer may be pageable and short-lived, so it may be reused
// on return rather than rely on staging.
inline absl::Status CopyAndWait(void* dst, const void* src, size_t bytes, bool to_device,
                                Stream stream) {
#ifdef __CUDACC__
  // The adapter's function, not TROUPE_CUDA_CALL: the error names the direction, not the ternary.
  TROUPE_RETURN_IF_ERROR(CudaErrorStatus(
      cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                      stream),
      to_device ? "cudaMemcpyAsync(host to device)" : "cudaMemcpyAsync(device to host)", __FILE__,
      __LINE__));
  TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaStreamSynchronize(stream)));
#else
  (void)to_device;
  (void)stream;
  std::memcpy(dst, src, bytes);
#endif
  return absl::OkStatus();
}

// Host memory to device memory; `src` may be reused on return.
inline absl::Status ToDevice(void* dst, const void* src, size_t bytes, Stream stream) {
  return CopyAndWait(dst, src, bytes, /*to_device=*/true, stream);
}

// Device memory to host memory, after the work enqueued before it.
inline absl::Status ToHost(void* dst, const void* src, size_t bytes, Stream stream) {
  return CopyAndWait(dst, src, bytes, /*to_device=*/false, stream);
}

// Carves one allocator block into 256-byte-aligned buffers: Add them, then Allocate.
class Arena {
 public:
  template <typename T>
  void Add(T*& p, int64_t count) {
    parts_.push_back({reinterpret_cast<void**>(&p), static_cast<size_t>(count) * sizeof(T)});
  }
  absl::Status Allocate(CachingAllocator& alloc) {
    size_t total = 0;
    for (const Part& part : parts_) total += Round(part.bytes);
    TROUPE_ASSIGN_OR_RETURN(void* block, alloc.Allocate(total));
    block_ = block;
    size_t at = 0;
    for (const Part& part : parts_) {
      *part.slot = static_cast<unsigned char*>(block_) + at;
      at += Round(part.bytes);
    }
    return absl::OkStatus();
  }
  absl::Status Free(CachingAllocator& alloc) {
    for (const Part& part : parts_) *part.slot = nullptr;
    parts_.clear();
    void* block = block_;
    block_ = nullptr;
    return alloc.Free(block);
  }

 private:
  struct Part {
    void** slot;
    size_t bytes;
  };
  static size_t Round(size_t bytes) { return (bytes + 255) / 256 * 256; }
  std::vector<Part> parts_;
  void* block_ = nullptr;
};

}  // namespace gpt_internal

}  // namespace troupe::model::cuda

#endif  // TROUPE_MODEL_CUDA_GPT_INTERNAL_CUH_
