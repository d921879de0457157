#include "troupe/kernels/norm.h"

#include "fast_math.h"
#include "troupe/kernels/parallel.h"

namespace troupe::kernels {

void ChunkSquareSums(const float* x, int64_t n, double* out) {
  ParallelForRange(n, kNormChunk, [&](int64_t lo, int64_t hi) {
    const float* c = x + lo;
    out[lo / kNormChunk] = internal::LaneReduce<double>(
        hi - lo, [c](int64_t i) { return static_cast<double>(c[i]) * c[i]; });
  });
}

double TreeSum(const double* v, int64_t n) {
  if (n <= 0) return 0;
  if (n == 1) return v[0];
  int64_t half = 1;
  while (half * 2 < n) half *= 2;  // largest power of two strictly below n
  return TreeSum(v, half) + TreeSum(v + half, n - half);
}

}  // namespace troupe::kernels
