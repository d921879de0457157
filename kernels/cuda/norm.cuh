// Sums of squares of a flat buffer in chunks of kNormChunk elements at absolute offsets, one double
// per chunk, with the same bits as the CPU kernel ChunkSquareSums (kernels/norm.cc), so that a GPU
// rank and a CPU rank agree on the global gradient norm, and so on the clip factor, bit for bit.
// The chunk sums are combined on the host with troupe::kernels::TreeSum (a few thousand doubles).
//
// The CPU order (internal::LaneReduce): lane j = i mod 8 of a chunk sums its terms x[i]² in double
// one after the other, in index order, starting from 0; the 8 lanes are then combined as
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). Each lane is a serial chain of up to 512
// rounded additions that no other order reproduces, so here each lane is one thread: thread t runs
// lane t mod 8 of chunk t / 8 (a warp holds 4 chunks), and the 8 threads of a chunk combine with
// xor-shuffles at distances 1, 2, 4, which is that tree exactly (lane 0 ends with it; IEEE
// addition is commutative). The term x² of a float is exact in double, so even a fused
// multiply-add would not change a bit; the additions are correctly rounded on both sides.
// The block size must be a multiple of 32 (whole warps: the shuffles take all 32 lanes).
//
// Example:
//   std::vector<double> partial(CeilDiv(n, kNormChunk));  // on the device: cudaMalloc
//   TROUPE_RETURN_IF_ERROR(chunk_square_sums(partial_d, grads_d, n, stream));
//   … copy partial to the host …
//   double norm = std::sqrt(TreeSum(partial.data(), partial.size()));
#ifndef TROUPE_KERNELS_CUDA_NORM_CUH_
#define TROUPE_KERNELS_CUDA_NORM_CUH_

#include "device.cuh"
#include "troupe/kernels/norm.h"

namespace troupe::kernels::cuda {

inline constexpr int kNormLanes = 8;  // the CPU's LaneReduce lanes
inline constexpr int kChunkSquareSumsBlock = 256;

template <typename Tx>
__global__ void chunk_square_sums_kernel(double* out, const Tx* x, int64_t n) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunk = t / kNormLanes;
  const int lane = static_cast<int>(t % kNormLanes);
  const int64_t lo = chunk * kNormChunk;
  double acc = 0.0;
  if (lo < n) {
    const Tx* c = x + lo;
    if (n - lo >= kNormChunk) {
      // A full chunk: a constant trip count, so the loads of an unrolled group are issued ahead
      // of the (serial) additions.
#ifdef __CUDACC__
#pragma unroll 16
#endif
      for (int k = 0; k < kNormChunk / kNormLanes; ++k) {
        const double xi = ToFloat(c[k * kNormLanes + lane]);
        acc += xi * xi;
      }
    } else {
      const int64_t len = n - lo;
      for (int64_t i = lane; i < len; i += kNormLanes) {
        const double xi = ToFloat(c[i]);
        acc += xi * xi;
      }
    }
  }
  // Threads past the last chunk take part with 0: the shuffles need every lane of the warp.
  acc += __shfl_xor_sync(kFullMask, acc, 1);
  acc += __shfl_xor_sync(kFullMask, acc, 2);
  acc += __shfl_xor_sync(kFullMask, acc, 4);
  if (lane == 0 && lo < n) out[chunk] = acc;
}

// out[i] = Σ x[j]² over chunk i = [i·kNormChunk, min(n, (i+1)·kNormChunk)), for the
// CeilDiv(n, kNormChunk) chunks.
template <typename Tx>
absl::Status chunk_square_sums(double* out, const Tx* x, int64_t n, Stream stream,
                               int block = kChunkSquareSumsBlock) {
  if (block <= 0 || block % 32 != 0 || block > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_square_sums: block size ", block,
                                                   " is not a multiple of 32 in [32, 1024]"));
  }
  if (n <= 0) return absl::OkStatus();
  const int64_t threads = static_cast<int64_t>(CeilDiv(n, kNormChunk)) * kNormLanes;
  return TROUPE_LAUNCH(chunk_square_sums_kernel<Tx>, dim3(CeilDiv(threads, block)), dim3(block), 0,
                       stream, out, x, n);
}

}  // namespace troupe::kernels::cuda

#endif  // TROUPE_KERNELS_CUDA_NORM_CUH_
