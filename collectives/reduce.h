// Private: element kernels — bf16 <-> f32 conversion and the reduction ops, all in f32.
#ifndef TROUPE_COLLECTIVES_REDUCE_H_
#define TROUPE_COLLECTIVES_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "troupe/collectives/communicator.h"

namespace troupe::collectives {

inline float Bf16ToF32(uint16_t v) {
  uint32_t u = uint32_t{v} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

void Bf16ToF32(const uint16_t* in, float* out, size_t n);
void F32ToBf16(const float* in, uint16_t* out, size_t n);

// dst[i] = dst[i] (op) src[i]; kAvg reduces as kSum (the caller scales at the end).
void ReduceInto(float* dst, const float* src, size_t n, ReduceOp op);
// dst[i] = a[i] (op) b[i], in that operand order (the canonical tree order matters for sums).
void Combine(float* dst, const float* a, const float* b, size_t n, ReduceOp op);
void DivideBy(float* x, size_t n, float divisor);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_REDUCE_H_
