#include "troupe/kernels/crossentropy.h"

#include <cmath>

#include "fast_math.h"
#include "troupe/kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kRowBlock = 16;

template <typename T>
TROUPE_WIDE_SIMD void CrossEntropyRows(T* losses, T* probs, const T* logits, const int32_t* targets,
                                       int64_t lo, int64_t hi, int64_t v) {
  for (int64_t i = lo; i < hi; ++i) {
    const T* x = logits + i * v;
    T* p = probs + i * v;
    const T mx = internal::LaneMax(x, v);
    for (int64_t j = 0; j < v; ++j) p[j] = internal::Exp<T>(x[j] - mx);
    const T sum = internal::LaneSum(p, v);
    const T inv = T(1) / sum;
    for (int64_t j = 0; j < v; ++j) p[j] *= inv;
    // log-sum-exp form keeps the loss finite even where the probability underflows.
    losses[i] = (mx + std::log(sum)) - x[targets[i]];
  }
}

template <typename T>
TROUPE_WIDE_SIMD void CrossEntropyBackwardRows(T* dlogits, const T* probs, const int32_t* targets,
                                               T dloss, int64_t lo, int64_t hi, int64_t v,
                                               bool accumulate) {
  for (int64_t i = lo; i < hi; ++i) {
    const T* p = probs + i * v;
    T* d = dlogits + i * v;
    const int64_t target = targets[i];
    if (accumulate) {
      for (int64_t j = 0; j < v; ++j) d[j] += (p[j] - (j == target ? T(1) : T(0))) * dloss;
    } else {
      for (int64_t j = 0; j < v; ++j) d[j] = (p[j] - (j == target ? T(1) : T(0))) * dloss;
    }
  }
}
}  // namespace

template <typename T>
void CrossEntropyForward(T* losses, T* probs, const T* logits, const int32_t* targets, int64_t n,
                         int64_t v) {
  ParallelForRange(n, kRowBlock, [&](int64_t lo, int64_t hi) {
    CrossEntropyRows(losses, probs, logits, targets, lo, hi, v);
  });
}

template <typename T>
void CrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, T dloss, int64_t n,
                          int64_t v, bool accumulate) {
  ParallelForRange(n, kRowBlock, [&](int64_t lo, int64_t hi) {
    CrossEntropyBackwardRows(dlogits, probs, targets, dloss, lo, hi, v, accumulate);
  });
}

template void CrossEntropyForward<float>(float*, float*, const float*, const int32_t*, int64_t,
                                         int64_t);
template void CrossEntropyForward<double>(double*, double*, const double*, const int32_t*, int64_t,
                                          int64_t);
template void CrossEntropyBackward<float>(float*, const float*, const int32_t*, float, int64_t,
                                          int64_t, bool);
template void CrossEntropyBackward<double>(double*, const double*, const int32_t*, double, int64_t,
                                           int64_t, bool);

}  // namespace troupe::kernels
