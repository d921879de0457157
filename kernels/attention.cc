#include "troupe/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "fast_math.h"
#include "troupe/kernels/matmul.h"
#include "troupe/kernels/parallel.h"

namespace troupe::kernels {
namespace {
// Rows per block of the causal score matrix (a function of nothing, so results do not depend on
// the thread count): smaller blocks skip more of the masked triangle, larger ones make better
// GEMMs. 64 computes 5/8 of the full matrix at T = 256.
constexpr int64_t kCausalRows = 64;

// A t x t scratch matrix of this thread's, kept from call to call: allocating and zeroing one per
// (batch, head) cost a memset of 192 MB per step of the 20M model. Every element a caller reads
// it writes first.
template <typename T>
T* ScoreScratch(int64_t t) {
  thread_local std::vector<T> scratch;
  if (static_cast<int64_t>(scratch.size()) < t * t) scratch.resize(t * t);
  return scratch.data();
}

// Softmax backward in place: dpre[i, j] = a[i, j] * (datt[i, j] - sum_k a[i, k] datt[i, k]).
template <typename T>
TROUPE_WIDE_SIMD void CausalSoftmaxBackwardRows(T* datt, const T* a, int64_t t) {
  for (int64_t i = 0; i < t; ++i) {
    const T* ar = a + i * t;
    T* dr = datt + i * t;
    const T dot = internal::LaneReduce<T>(i + 1, [&](int64_t j) { return ar[j] * dr[j]; });
    for (int64_t j = 0; j <= i; ++j) dr[j] = ar[j] * (dr[j] - dot);
    for (int64_t j = i + 1; j < t; ++j) dr[j] = 0;
  }
}

template <typename T>
TROUPE_WIDE_SIMD void CausalSoftmax(T* p, const T* x, int64_t t_len) {
  for (int64_t i = 0; i < t_len; ++i) {
    const T* xr = x + i * t_len;
    T* pr = p + i * t_len;
    const T mx = internal::LaneMax(xr, i + 1);
    for (int64_t j = 0; j <= i; ++j) pr[j] = internal::Exp<T>(xr[j] - mx);
    const T sum = internal::LaneSum(pr, i + 1);
    const T inv = T(1) / sum;
    for (int64_t j = 0; j <= i; ++j) pr[j] *= inv;
    for (int64_t j = i + 1; j < t_len; ++j) pr[j] = 0;
  }
}
}  // namespace

template <typename T>
void CausalSoftmaxRows(T* p, const T* x, int64_t t_len) {
  CausalSoftmax(p, x, t_len);
}

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int64_t b, int64_t t, int64_t c, int64_t nh) {
  const int64_t hs = c / nh;
  const T scale = T(1) / std::sqrt(T(hs));
  ParallelFor(b * nh, [&](int64_t bh) {
    const int64_t bi = bh / nh;
    const int64_t h = bh % nh;
    const T* q = qkv + bi * t * 3 * c + h * hs;
    const T* k = q + c;
    const T* v = q + 2 * c;
    T* a = att + bh * t * t;
    T* pre = ScoreScratch<T>(t);
    // Rows [i0, i1) attend to keys [0, i1) only: the masked upper triangle is never computed.
    for (int64_t i0 = 0; i0 < t; i0 += kCausalRows) {
      const int64_t i1 = std::min(t, i0 + kCausalRows);
      Gemm<T>(false, true, i1 - i0, i1, hs, scale, q + i0 * 3 * c, 3 * c, k, 3 * c, T(0),
              pre + i0 * t, t);
    }
    CausalSoftmaxRows(a, pre, t);
    for (int64_t i0 = 0; i0 < t; i0 += kCausalRows) {
      const int64_t i1 = std::min(t, i0 + kCausalRows);
      Gemm<T>(false, false, i1 - i0, hs, i1, T(1), a + i0 * t, t, v, 3 * c, T(0),
              out + (bi * t + i0) * c + h * hs, c);
    }
  });
}

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t b, int64_t t,
                       int64_t c, int64_t nh) {
  const int64_t hs = c / nh;
  const T scale = T(1) / std::sqrt(T(hs));
  ParallelFor(b * nh, [&](int64_t bh) {
    const int64_t bi = bh / nh;
    const int64_t h = bh % nh;
    const int64_t off = bi * t * 3 * c + h * hs;
    const T* q = qkv + off;
    const T* k = q + c;
    const T* v = q + 2 * c;
    T* dq = dqkv + off;
    T* dk = dq + c;
    T* dv = dq + 2 * c;
    const T* a = att + bh * t * t;
    const T* dout_h = dout + bi * t * c + h * hs;
    T* datt = ScoreScratch<T>(t);
    // As in the forward pass, blocks of rows skip the masked triangle: query row i only meets
    // keys j <= i, and key row j only gets gradient from queries i >= j. Each GEMM writes its
    // block of rows of dq, dk or dv whole (beta = 0): no block of dqkv is written twice.
    for (int64_t i0 = 0; i0 < t; i0 += kCausalRows) {
      const int64_t i1 = std::min(t, i0 + kCausalRows);
      Gemm<T>(false, true, i1 - i0, i1, hs, T(1), dout_h + i0 * c, c, v, 3 * c, T(0), datt + i0 * t,
              t);
      Gemm<T>(true, false, i1 - i0, hs, t - i0, T(1), a + i0 * t + i0, t, dout_h + i0 * c, c, T(0),
              dv + i0 * 3 * c, 3 * c);
    }
    CausalSoftmaxBackwardRows(datt, a, t);
    for (int64_t i0 = 0; i0 < t; i0 += kCausalRows) {
      const int64_t i1 = std::min(t, i0 + kCausalRows);
      Gemm<T>(false, false, i1 - i0, hs, i1, scale, datt + i0 * t, t, k, 3 * c, T(0),
              dq + i0 * 3 * c, 3 * c);
      Gemm<T>(true, false, i1 - i0, hs, t - i0, scale, datt + i0 * t + i0, t, q + i0 * 3 * c, 3 * c,
              T(0), dk + i0 * 3 * c, 3 * c);
    }
  });
}

#define TROUPE_INSTANTIATE(T)                                                                     \
  template void CausalSoftmaxRows<T>(T*, const T*, int64_t);                                      \
  template void AttentionForward<T>(T*, T*, const T*, int64_t, int64_t, int64_t, int64_t);        \
  template void AttentionBackward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, \
                                     int64_t);
TROUPE_INSTANTIATE(float)
TROUPE_INSTANTIATE(double)
#undef TROUPE_INSTANTIATE

}  // namespace troupe::kernels
