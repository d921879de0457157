// Sums of squares in fixed chunks, and the canonical tree sum that combines them.
//
// The gradient norm for clipping must be the same bits whoever computes it: one process, or range
// owners that each hold some chunks. So the flat buffer is cut into chunks of kNormChunk elements
// at absolute offsets, each chunk is summed in double (8 lanes by index, fixed combine), and the
// chunk sums are combined by TreeSum: T(lo, hi) = T(lo, mid) + T(mid, hi), mid = lo + the largest
// power of two below hi - lo.
//
// Example:
//   std::vector<double> partial((n + kNormChunk - 1) / kNormChunk);
//   ChunkSquareSums(grads, n, partial.data());
//   double norm = std::sqrt(TreeSum(partial.data(), partial.size()));
#ifndef TROUPE_KERNELS_NORM_H_
#define TROUPE_KERNELS_NORM_H_

#include <cstdint>

namespace troupe::kernels {

inline constexpr int64_t kNormChunk = 4096;

// out[i] = sum of x[j]^2 for j in chunk i (chunk i = [i*kNormChunk, min(n, (i+1)*kNormChunk))).
void ChunkSquareSums(const float* x, int64_t n, double* out);

// Canonical pairwise sum of v[0..n). Returns 0 for n == 0.
double TreeSum(const double* v, int64_t n);

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_NORM_H_
