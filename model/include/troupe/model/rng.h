// Counter-based random numbers keyed by (seed, purpose, indices): Philox-4x32-10.
//
// There is no generator state to carry: the value for (seed, purpose, a, b) is a pure function, so
// any process can reproduce any draw — parameter init element by element, the data order of any
// epoch — without replaying a stream. Never std::*_distribution or std::shuffle (their output
// differs between standard libraries).
//
// Example:
//   float w = NormalFloat(seed, RngPurpose::kInit, /*a=*/tensor_index, /*b=*/element) * 0.02f;
//   uint64_t sample = PermuteIndex(position, num_samples, seed, epoch);
#ifndef TROUPE_MODEL_RNG_H_
#define TROUPE_MODEL_RNG_H_

#include <array>
#include <cstdint>

namespace troupe::model {

enum class RngPurpose : uint32_t {
  kInit = 1,       // parameter initialisation: a = tensor index, b = element
  kDataOrder = 2,  // per-epoch sample permutation: a = epoch, b = round/value
  kTest = 100,
};

// Philox-4x32 with 10 rounds (Salmon et al., SC'11).
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// 128 random bits for (seed, purpose, a, b): key = seed, counter = (purpose, a, b_lo, b_hi).
std::array<uint32_t, 4> RandomBits(uint64_t seed, RngPurpose purpose, uint32_t a, uint64_t b);

// Uniform in [0, 1) with 53 random bits.
double UniformDouble(uint64_t seed, RngPurpose purpose, uint32_t a, uint64_t b);
// Standard normal (Box–Muller on the 128 bits).
double NormalDouble(uint64_t seed, RngPurpose purpose, uint32_t a, uint64_t b);
inline float NormalFloat(uint64_t seed, RngPurpose purpose, uint32_t a, uint64_t b) {
  return static_cast<float>(NormalDouble(seed, purpose, a, b));
}

// A bijection of [0, n) chosen by (seed, epoch): a Feistel network on the next even power of two
// with cycle walking. O(1) memory, a pure function of its arguments.
uint64_t PermuteIndex(uint64_t i, uint64_t n, uint64_t seed, uint32_t epoch);

}  // namespace troupe::model

#endif  // TROUPE_MODEL_RNG_H_
