#include "reduce.h"

#include <algorithm>

namespace troupe::collectives {

size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

void Bf16ToF32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToF32(in[i]);
}

void F32ToBf16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = F32ToBf16(in[i]);
}

void ReduceInto(float* __restrict dst, const float* __restrict src, size_t n, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }
}

void Combine(float* dst, const float* a, const float* b, size_t n, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) dst[i] = std::max(a[i], b[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
  }
}

void DivideBy(float* x, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) x[i] /= divisor;
}

}  // namespace troupe::collectives
