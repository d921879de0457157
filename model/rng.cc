#include "troupe/model/rng.h"

#include <cmath>

namespace troupe::model {

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = kM0 * c[0];
    const uint64_t p1 = kM1 * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

std::array<uint32_t, 4> RandomBits(uint64_t seed, RngPurpose purpose, uint32_t a, uint64_t b) {
  return Philox4x32(
      {static_cast<uint32_t>(purpose), a, static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32)},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

namespace {
double ToUnit(uint32_t hi, uint32_t lo) {  // [0, 1) with 53 bits
  const uint64_t bits = ((uint64_t{hi} << 32) | lo) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}
}  // namespace

double UniformDouble(uint64_t seed, RngPurpose purpose, uint32_t a, uint64_t b) {
  const auto r = RandomBits(seed, purpose, a, b);
  return ToUnit(r[0], r[1]);
}

double NormalDouble(uint64_t seed, RngPurpose purpose, uint32_t a, uint64_t b) {
  const auto r = RandomBits(seed, purpose, a, b);
  const double u1 = 1.0 - ToUnit(r[0], r[1]);  // (0, 1]
  const double u2 = ToUnit(r[2], r[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2);
}

uint64_t PermuteIndex(uint64_t i, uint64_t n, uint64_t seed, uint32_t epoch) {
  if (n <= 1) return 0;
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  if (bits % 2) ++bits;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = i;
  do {  // cycle walking: re-encrypt until the value lands inside [0, n)
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 6; ++round) {
      const auto f = RandomBits(seed, RngPurpose::kDataOrder, epoch, (round << 40) | right);
      const uint64_t next = left ^ (((uint64_t{f[0]} << 32) | f[1]) & mask);
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= n);
  return x;
}

}  // namespace troupe::model
