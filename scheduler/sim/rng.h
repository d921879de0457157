// A seeded, counter-free deterministic generator for the simulator (splitmix64). The same seed
// gives the same clusters, workloads and failure traces on every standard library, which the
// std:: distributions do not promise.
//
//   SplitMix64 rng(42);
//   int zone = rng.Uniform(4);        // 0..3
//   bool spot = rng.Bernoulli(0.5);
#ifndef TROUPE_SCHEDULER_SIM_RNG_H_
#define TROUPE_SCHEDULER_SIM_RNG_H_

#include <cstdint>

namespace troupe::scheduler::sim {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) by multiply-shift (n > 0).
  uint64_t Uniform(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }
  // Uniform in [0, 1) with 53 random bits.
  double Real() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  bool Bernoulli(double p) { return Real() < p; }

 private:
  uint64_t state_;
};

}  // namespace troupe::scheduler::sim

#endif  // TROUPE_SCHEDULER_SIM_RNG_H_
