#include "troupe/kernels/embedding.h"

#include "troupe/kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kRowBlock = 64;
constexpr int64_t kColBlock = 16;
}  // namespace

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t b,
                      int64_t t, int64_t c) {
  ParallelForRange(b * t, kRowBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* te = wte + static_cast<int64_t>(tokens[i]) * c;
      const T* pe = wpe + (i % t) * c;
      T* o = out + i * c;
      for (int64_t j = 0; j < c; ++j) o[j] = te[j] + pe[j];
    }
  });
}

template <typename T>
void EmbeddingBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t b, int64_t t,
                       int64_t c) {
  ParallelForRange(c, kColBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = 0; i < b * t; ++i) {
      const T* g = dout + i * c;
      if (dwte != nullptr) {
        T* te = dwte + static_cast<int64_t>(tokens[i]) * c;
        for (int64_t j = lo; j < hi; ++j) te[j] += g[j];
      }
      if (dwpe != nullptr) {
        T* pe = dwpe + (i % t) * c;
        for (int64_t j = lo; j < hi; ++j) pe[j] += g[j];
      }
    }
  });
}

template void EmbeddingForward<float>(float*, const int32_t*, const float*, const float*, int64_t,
                                      int64_t, int64_t);
template void EmbeddingForward<double>(double*, const int32_t*, const double*, const double*,
                                       int64_t, int64_t, int64_t);
template void EmbeddingBackward<float>(float*, float*, const float*, const int32_t*, int64_t,
                                       int64_t, int64_t);
template void EmbeddingBackward<double>(double*, double*, const double*, const int32_t*, int64_t,
                                        int64_t, int64_t);

}  // namespace troupe::kernels
