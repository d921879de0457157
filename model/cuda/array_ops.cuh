// The device code behind the CUDA ArrayOps (array_ops_cuda.h): the element-wise addition and fill
// the elastic trainer's gradient sum and buffers need, and the two optimizer pieces of
// model/optimizer.h over one rank's range [begin, end) of the flat parameter buffer, built from the
// existing kernels:
//   add                      out[i] = x[i] + y[i] (one float addition, as HostArrayOps)
//   fill                     dst[i] = value
//   range_chunk_square_sums  model::RangeChunkSquareSums: the same bounds check and error, then
//                            chunk_square_sums (norm.cuh) over the range's CeilDiv(end - begin,
//                            kNormChunk) chunks (begin is chunk-aligned, so these are the absolute
//                            chunks of the whole buffer)
//   adamw_update_range       model::AdamWUpdateRange: [begin, end) split by the ParamTensor list,
//                            weight decay 0 where the tensor's `decay` is false, one adamw_update
//                            (adamw.cuh) launch per piece
// All give the host functions' bits (element-wise float arithmetic compiled without contraction;
// the chunk sums in the CPU's lane order). Pointers are device memory (host memory under the SIMT
// layer); params, grads, m, v and x point at element `begin` of their buffer. Launchers only
// enqueue on `stream`; the caller waits.
//
// Example:
//   absl::StatusOr<int64_t> chunks = RangeChunkCount(begin, end, total);  // InvalidArgument if
//   if (!chunks.ok()) return chunks.status();                            // not chunk-aligned
//   TROUPE_RETURN_IF_ERROR(range_chunk_square_sums(sums_d, grads_d, begin, end, total, stream));
//   TROUPE_RETURN_IF_ERROR(adamw_update_range(tensors, begin, end, params_d, grads_d, m_d, v_d,
//                                             scalars, stream));
#ifndef TROUPE_MODEL_CUDA_ARRAY_OPS_CUH_
#define TROUPE_MODEL_CUDA_ARRAY_OPS_CUH_

// clang-format off
#include "device.cuh"  // first: under g++ the SIMT layer's qualifiers precede the CUDA headers
// clang-format on

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "adamw.cuh"
#include "norm.cuh"
#include "troupe/base/status_macros.h"
#include "troupe/kernels/adamw.h"
#include "troupe/kernels/norm.h"
#include "troupe/model/config.h"

namespace troupe::model::cuda {

// The GPU model sits on kernels/cuda: the per-op kernels and device.cuh.
using namespace ::troupe::kernels::cuda;  // NOLINT(build/namespaces)
using ::troupe::kernels::AdamWScalars;
using ::troupe::kernels::AdamWSources;
using ::troupe::kernels::kNormChunk;

inline constexpr int kArrayOpsBlock = 256;

// Templates (instantiated for float), so that every translation unit that includes this header
// may instantiate them without duplicate kernel symbols.
template <typename T>
__global__ void add_kernel(T* out, const T* x, const T* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = x[i] + y[i];
}

template <typename T>
__global__ void fill_kernel(T* dst, int64_t n, T value) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  dst[i] = value;
}

namespace array_ops_internal {

inline absl::Status CheckBlock(const char* what, int block) {
  if (block <= 0 || block > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": block size ", block, " is not in [1, 1024]"));
  }
  return absl::OkStatus();
}

}  // namespace array_ops_internal

// out[i] = x[i] + y[i] for i < n; nothing for n <= 0. out may be x or y; x == y is allowed.
template <typename T>
absl::Status add(T* out, const T* x, const T* y, int64_t n, Stream stream,
                 int block = kArrayOpsBlock) {
  TROUPE_RETURN_IF_ERROR(array_ops_internal::CheckBlock("add", block));
  if (n <= 0) return absl::OkStatus();
  return TROUPE_LAUNCH(add_kernel<T>, dim3(CeilDiv(n, block)), dim3(block), 0, stream, out, x, y,
                       n);
}

// dst[i] = value for i < n (any bits, -0.0 and NaNs included); nothing for n <= 0.
template <typename T>
absl::Status fill(T* dst, int64_t n, T value, Stream stream, int block = kArrayOpsBlock) {
  TROUPE_RETURN_IF_ERROR(array_ops_internal::CheckBlock("fill", block));
  if (n <= 0) return absl::OkStatus();
  return TROUPE_LAUNCH(fill_kernel<T>, dim3(CeilDiv(n, block)), dim3(block), 0, stream, dst, n,
                       value);
}

// The length of model::RangeChunkSquareSums' result for [begin, end) of `total`, CeilDiv(end -
// begin, kNormChunk) (0 for an empty range), or its InvalidArgument error, word for word, when the
// bounds are not chunk-aligned (begin, and end unless end == total) or not 0 <= begin <= end <=
// total.
inline absl::StatusOr<int64_t> RangeChunkCount(int64_t begin, int64_t end, int64_t total) {
  const int64_t chunk = kNormChunk;
  if (begin < 0 || end < begin || end > total || begin % chunk != 0 ||
      (end != total && end % chunk != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("range [", begin, ", ", end, ") of ", total,
                                                   ": expected bounds aligned to ", chunk,
                                                   " elements (or end == total)"));
  }
  return (end - begin + chunk - 1) / chunk;
}

// out[0, RangeChunkCount(begin, end, total)) = the range's chunk square sums, x pointing at element
// `begin`: model::RangeChunkSquareSums' values, bit for bit. Errors as RangeChunkCount (nothing
// launched); an empty range launches nothing.
inline absl::Status range_chunk_square_sums(double* out, const float* x, int64_t begin, int64_t end,
                                            int64_t total, Stream stream,
                                            int block = kChunkSquareSumsBlock) {
  absl::StatusOr<int64_t> chunks = RangeChunkCount(begin, end, total);
  if (!chunks.ok()) return chunks.status();
  return chunk_square_sums<float>(out, x, end - begin, stream, block);
}

// model::AdamWUpdateRange on the device: for each tensor overlapping [begin, end), its overlap
// [lo, hi) is updated by adamw_update with `scalars`, weight_decay 0 where the tensor has no decay.
// params, grads, m and v (and `from`'s sources, out of place) point at element `begin`
// (range-local storage). Elements of [begin, end) that no tensor covers are left alone, as on the
// host.
inline absl::Status adamw_update_range(const std::vector<model::ParamTensor>& tensors,
                                       int64_t begin, int64_t end, float* params,
                                       const float* grads, float* m, float* v,
                                       const AdamWScalars& scalars, Stream stream,
                                       int block = kAdamWBlock,
                                       const AdamWSources* from = nullptr) {
  TROUPE_RETURN_IF_ERROR(array_ops_internal::CheckBlock("adamw_update_range", block));
  for (const model::ParamTensor& t : tensors) {
    const int64_t lo = std::max(begin, t.offset);
    const int64_t hi = std::min(end, t.offset + t.size);
    if (lo >= hi) continue;
    AdamWScalars s = scalars;
    if (!t.decay) s.weight_decay = 0;
    const int64_t off = lo - begin;
    const AdamWSources at = from != nullptr ? from->At(off) : AdamWSources{};
    TROUPE_RETURN_IF_ERROR(adamw_update<float>(params + off, nullptr, grads + off, m + off, v + off,
                                               hi - lo, s, stream, block,
                                               from != nullptr ? &at : nullptr));
  }
  return absl::OkStatus();
}

}  // namespace troupe::model::cuda

#endif  // TROUPE_MODEL_CUDA_ARRAY_OPS_CUH_
