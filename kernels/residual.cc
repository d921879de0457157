#include "troupe/kernels/residual.h"

#include "troupe/kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kBlock = 32768;
}

template <typename T>
void ResidualForward(T* out, const T* a, const T* b, int64_t n) {
  ParallelForRange(n, kBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
  });
}

template <typename T>
void ResidualBackward(T* da, T* db, const T* dout, int64_t n) {
  ParallelForRange(n, kBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) da[i] += dout[i];
    for (int64_t i = lo; i < hi; ++i) db[i] += dout[i];
  });
}

template void ResidualForward<float>(float*, const float*, const float*, int64_t);
template void ResidualForward<double>(double*, const double*, const double*, int64_t);
template void ResidualBackward<float>(float*, float*, const float*, int64_t);
template void ResidualBackward<double>(double*, double*, const double*, int64_t);

}  // namespace troupe::kernels
