// Bit-exact comparisons and float inputs for the tests of kernels/cuda/, plain host C++ with no
// CUDA or SIMT header, so that g++ tests of the SIMT layer, g++ tests linked against the CUDA
// runtime and nvcc tests all take it. Private to kernels/cuda/ tests; kernel_cases.h builds on it.
//
// Conventions: "same bits" compares the bytes (-0 differs from 0); generators take explicit seeds.
// Example:
//
//   const std::vector<float> x = SpreadFloats(n, /*seed=*/1, /*signed_zeros=*/true);
//   ExpectSameBits(got, want, "params");
#ifndef TROUPE_KERNELS_CUDA_BITS_TEST_UTIL_H_
#define TROUPE_KERNELS_CUDA_BITS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

namespace troupe::kernels::cuda::testing {

inline std::vector<float> ToF(const std::vector<double>& v) { return kernels::testing::ToFloat(v); }

inline std::vector<double> ToD(const std::vector<float>& v) { return {v.begin(), v.end()}; }

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The bits of a double, for exact comparisons that also tell -0 from 0 and NaNs apart.
inline uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Fails at the first element of `got` whose bytes differ from `want`'s; `source` names where
// `want` comes from in the message.
template <typename T>
void ExpectSameBits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what,
                    const char* source = "host") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(&got[i], &want[i], sizeof(T)))
        << what << "[" << i << "] is " << got[i] << ", " << source << " " << want[i];
  }
}

// Random floats of both signs spread over 2^-20 … 2^20, so that double or float sums round and the
// order of the additions shows in the bits; with `signed_zeros`, every 17th element (from the 4th)
// is replaced by -0 or +0. No NaN or infinity: their payloads and signs after arithmetic differ
// between the CPU and the GPU.
inline std::vector<float> SpreadFloats(int64_t n, uint64_t seed, bool signed_zeros = false) {
  const std::vector<double> r = kernels::testing::RandomVector(n, seed);
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(std::ldexp(r[i], static_cast<int>((i * 7919 + seed) % 41) - 20));
    if (signed_zeros && i % 17 == 3) x[i] = (i % 2 != 0) ? -0.0f : 0.0f;
  }
  return x;
}

// SpreadFloats with signed zeros among them.
inline std::vector<float> SpreadFloatsWithZeros(int64_t n, uint64_t seed) {
  return SpreadFloats(n, seed, /*signed_zeros=*/true);
}

}  // namespace troupe::kernels::cuda::testing

#endif  // TROUPE_KERNELS_CUDA_BITS_TEST_UTIL_H_
