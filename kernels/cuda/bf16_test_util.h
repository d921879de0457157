// Test helpers that need only cuda_bf16.h: bf16 rounding and ulp distance, and comparisons with
// a double-precision reference. Used by the SIMT-run kernel tests (through cuda_test_util.h,
// which includes the SIMT layer first) and by the host-side CUDA tests (cuBLASLt), which include
// this header alone. Private to kernels/cuda/ tests.
#ifndef TROUPE_KERNELS_CUDA_BF16_TEST_UTIL_H_
#define TROUPE_KERNELS_CUDA_BF16_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace troupe::kernels::cuda::testing {

inline std::vector<__nv_bfloat16> ToBf16(const std::vector<double>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(static_cast<float>(v[i]));
  return out;
}

inline std::vector<double> ToDouble(const std::vector<__nv_bfloat16>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

// Distance in representable bf16 values (0: equal, 1: neighbours).
inline int64_t Bf16UlpDistance(__nv_bfloat16 a, __nv_bfloat16 b) {
  auto ordered = [](__nv_bfloat16 x) {
    uint16_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    return (bits & 0x8000) ? -static_cast<int64_t>(bits & 0x7fff) : static_cast<int64_t>(bits);
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// Every element of `got` within 1 bf16 ulp of the reference rounded to bf16.
inline void ExpectWithinOneBf16Ulp(const std::vector<__nv_bfloat16>& got,
                                   const std::vector<double>& reference, const char* what) {
  ASSERT_EQ(got.size(), reference.size()) << what;
  int64_t worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t d = Bf16UlpDistance(got[i], __float2bfloat16(static_cast<float>(reference[i])));
    if (d > worst) worst = d, at = i;
  }
  EXPECT_LE(worst, 1) << what << ": element " << at << " is " << __bfloat162float(got[at])
                      << ", reference " << reference[at];
}

// Every element within `rel` of the reference, relative to max(|reference|, floor).
template <typename T>
void ExpectClose(const std::vector<T>& got, const std::vector<double>& reference, double rel,
                 const char* what, double floor = 1e-3) {
  ASSERT_EQ(got.size(), reference.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - reference[i]) /
                       std::fmax(std::fabs(reference[i]), floor);
    if (!(err <= worst)) worst = err, at = i;
  }
  EXPECT_LE(worst, rel) << what << ": element " << at << " is " << got[at] << ", reference "
                        << reference[at];
}

}  // namespace troupe::kernels::cuda::testing

#endif  // TROUPE_KERNELS_CUDA_BF16_TEST_UTIL_H_
