#include "troupe/kernels/norm.h"

#include "troupe/kernels/parallel.h"

namespace troupe::kernels {

void ChunkSquareSums(const float* x, int64_t n, double* out) {
  ParallelForRange(n, kNormChunk, [&](int64_t lo, int64_t hi) {
    double s = 0;
    for (int64_t i = lo; i < hi; ++i) s += static_cast<double>(x[i]) * x[i];
    out[lo / kNormChunk] = s;
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
