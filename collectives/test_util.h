// Private test helpers shared by the collectives tests: deterministic inputs, threads per rank,
// and the plain references the backends are checked against.
#ifndef TROUPE_COLLECTIVES_TEST_UTIL_H_
#define TROUPE_COLLECTIVES_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "algorithms.h"
#include "reduce.h"
#include "troupe/collectives/communicator.h"

namespace troupe::collectives::testing {

// A deterministic pseudo-random value in [-1, 1) for (rank, index, salt).
inline float Val(int rank, size_t i, uint32_t salt) {
  uint64_t x = (uint64_t{static_cast<uint32_t>(rank)} << 40) ^
               (uint64_t{i} * 0x9E3779B97F4A7C15ull) ^ (uint64_t{salt} << 20);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

// Input of `rank` as f32 values (already rounded to bf16 when dt is bf16).
inline std::vector<float> Input(int rank, size_t count, DType dt, uint32_t salt) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    v[i] = Val(rank, i, salt);
    if (dt == DType::kBF16) v[i] = Bf16ToF32(F32ToBf16(v[i]));
  }
  return v;
}

// A typed host buffer holding `values` in dtype `dt`.
struct HostBuf {
  DType dt;
  std::vector<float> f;
  std::vector<uint16_t> h;
  HostBuf(DType d, const std::vector<float>& values) : dt(d) {
    if (d == DType::kF32) {
      f = values;
    } else {
      h.resize(values.size());
      F32ToBf16(values.data(), h.data(), values.size());
    }
  }
  HostBuf(DType d, size_t n) : HostBuf(d, std::vector<float>(n, 0.0f)) {}
  Buffer buf() { return dt == DType::kF32 ? Buffer::F32(f) : Buffer::BF16(h); }
  Buffer sub(size_t offset, size_t n) {
    return dt == DType::kF32 ? Buffer::F32(f.data() + offset, n)
                             : Buffer::BF16(h.data() + offset, n);
  }
  std::vector<float> values() const {
    if (dt == DType::kF32) return f;
    std::vector<float> v(h.size());
    Bf16ToF32(h.data(), v.data(), h.size());
    return v;
  }
};

template <class F>
void ForEachRank(int n, F f) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back([&f, r] { f(r); });
  for (auto& t : ts) t.join();
}

// Tolerance of a reduced value against the f32 reference computed in rank order: f32 results
// differ from it only by summation order; bf16 results by at most one rounding to bf16.
inline float Tolerance(DType dt, float ref, float sum_abs, int n) {
  float tol = 4.0f * 1.1920929e-7f * static_cast<float>(n) * sum_abs;
  if (dt == DType::kBF16) tol += std::ldexp(std::fabs(ref), -8);
  return tol;
}

// Microbatch intervals [lo, hi), one per rank.
using Intervals = std::vector<std::pair<uint64_t, uint64_t>>;

// The power-of-two-aligned blocks the elastic trainer gives W ranks out of M microbatches
// (train/shard_layout.cc MicrobatchBlocks): split the first of the largest blocks at its canonical
// midpoint until there are W.
inline Intervals TrainerBlocks(uint64_t m, int w) {
  Intervals b = {{0, m}};
  while (static_cast<int>(b.size()) < w) {
    size_t best = 0;
    for (size_t i = 1; i < b.size(); ++i) {
      if (b[i].second - b[i].first > b[best].second - b[best].first) best = i;
    }
    const auto [lo, hi] = b[best];
    const uint64_t mid = CanonicalMid(lo, hi);
    b[best] = {lo, mid};
    b.insert(b.begin() + best + 1, {mid, hi});
  }
  return b;
}

}  // namespace troupe::collectives::testing

#endif  // TROUPE_COLLECTIVES_TEST_UTIL_H_
