// seeded_words.h — a fixed, portable stream of random words per (seed, stream): SplitMix64. The
// same (seed, stream) gives the same words on every machine and standard library (whose
// distributions differ between implementations), so a chaos trial drawn here is drawn the same
// everywhere.
//
//   SeededWords w(/*seed=*/1, /*stream=*/7);   // e.g. trial 7 of seed 1
//   int64_t step = w.In(1, 59);
#ifndef TROUPE_BASE_SEEDED_WORDS_H_
#define TROUPE_BASE_SEEDED_WORDS_H_

#include <cstdint>

namespace troupe::base {

class SeededWords {
 public:
  SeededWords(uint64_t seed, int64_t stream)
      : state_(seed * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(stream) * 0xD1B54A32D192ED03ull) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // In [lo, hi] (hi >= lo); the modulo's bias is below 2^-40 for ranges under 2^24.
  int64_t In(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }

 private:
  uint64_t state_;
};

}  // namespace troupe::base

#endif  // TROUPE_BASE_SEEDED_WORDS_H_
