// Test helpers for the kernels: random inputs, central finite differences in double precision,
// and running a computation at several thread counts. Private to the kernels' tests.
#ifndef TROUPE_KERNELS_TEST_UTIL_H_
#define TROUPE_KERNELS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "troupe/kernels/parallel.h"

namespace troupe::kernels::testing {

inline uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [-scale, -scale/8] ∪ [scale/8, scale]: random and never zero.
inline std::vector<double> RandomVector(int64_t n, uint64_t seed, double scale = 1.0) {
  std::vector<double> v(n);
  uint64_t s = seed * 7919 + 17;
  for (auto& x : v) {
    const double u = static_cast<double>(SplitMix(s) >> 11) / 9007199254740992.0;  // [0, 1)
    const double mag = scale * (0.125 + 0.875 * u);
    x = (SplitMix(s) & 1) ? mag : -mag;
  }
  return v;
}

inline std::vector<int32_t> RandomTokens(int64_t n, int32_t vocab, uint64_t seed) {
  std::vector<int32_t> v(n);
  uint64_t s = seed * 104729 + 3;
  for (auto& x : v) x = static_cast<int32_t>(SplitMix(s) % vocab);
  return v;
}

inline std::vector<float> ToFloat(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ‖a − b‖ / ‖b‖.
template <typename A, typename B>
double RelErr(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

// Tolerances of the float64 finite-difference check, for every op and the whole model:
// central differences with step kFdEps; |fd − analytic| ≤ kFdAbsTol + kFdRelTol·|analytic|.
inline constexpr double kFdEps = 1e-5;
inline constexpr double kFdAbsTol = 1e-7;
inline constexpr double kFdRelTol = 1e-6;

// Checks analytic[i] = d objective / d x[i] by central differences at up to max_checks indices
// spread over x (all of them when x is small). objective() reads x.
inline void ExpectGradientMatchesFd(const char* what, std::vector<double>& x,
                                    const std::vector<double>& analytic,
                                    const std::function<double()>& objective,
                                    int64_t max_checks = 300) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t stride = std::max<int64_t>(1, n / max_checks);
  int64_t checked = 0;
  for (int64_t i = (n > max_checks ? (stride / 2) : 0); i < n; i += stride) {
    const double saved = x[i];
    x[i] = saved + kFdEps;
    const double up = objective();
    x[i] = saved - kFdEps;
    const double down = objective();
    x[i] = saved;
    const double fd = (up - down) / (2 * kFdEps);
    ASSERT_LE(std::fabs(fd - analytic[i]), kFdAbsTol + kFdRelTol * std::fabs(analytic[i]))
        << what << "[" << i << "]: finite difference " << fd << " vs analytic " << analytic[i];
    ++checked;
  }
  EXPECT_GT(checked, 0) << what;
}

// Runs fn at 1, 2 and 3 threads; fn returns the bytes of its outputs, which must be identical.
inline void ExpectSameBitsAtThreadCounts(const std::function<std::vector<float>()>& fn) {
  SetNumThreads(1);
  const std::vector<float> one = fn();
  for (int threads : {2, 3}) {
    SetNumThreads(threads);
    const std::vector<float> other = fn();
    ASSERT_EQ(one.size(), other.size());
    EXPECT_EQ(0, std::memcmp(one.data(), other.data(), one.size() * sizeof(float)))
        << "output differs at " << threads << " threads";
  }
  SetNumThreads(1);
}

template <typename T>
void Append(std::vector<float>& out, const std::vector<T>& v) {
  out.insert(out.end(), v.begin(), v.end());
}

}  // namespace troupe::kernels::testing

#endif  // TROUPE_KERNELS_TEST_UTIL_H_
