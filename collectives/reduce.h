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

// memcpy for data another process on this host reads next (a staging slot of the shared
// segments), stored around this core's caches: the reader then fetches it from memory instead of
// snooping it out of the writer's cache. `dst` must be 16-byte aligned.
void StreamCopy(void* dst, const void* src, size_t bytes);
// memcpy as a plain vector loop, for reads of another process's staged data (glibc's rep movsb
// took 4x as long for 128-512 KiB of it here).
void VectorCopy(void* dst, const void* src, size_t bytes);

// How a rank writes the staged pieces its peers read: through its caches (VectorCopy; the peers
// then take the lines out of this core's cache) or around them (StreamCopy; they read memory).
// Which is faster depends on the moment: two processes exchanging 1 MiB through shared memory on
// this 2-vCPU VM moved 17 GB/s per direction through the caches and 6.5 around them in one
// minute, 4.4 and 8.5-10 in another (when the cores' caches answer each other slowly). So it is
// measured, per kind of operation (its bytes by powers of 4, and whether it gathers): operation
// k of a kind runs cached when k % kMeasureEvery == 0 and streamed when it is kMeasureEvery / 2,
// on every rank of the group alike (they run the same operations in the same order), and those
// two are timed; every other operation takes the mode whose recent measurements were faster.
// Only operations in which all ranks wrote the same way are measured: each rank's time is the
// group's (one rank's writes show in its peers' reads), so the ranks' estimates agree.
class StagingCopy {
 public:
  static constexpr uint64_t kMeasureEvery = 16;
  struct Choice {
    bool streamed = false;  // StreamCopy, else VectorCopy
    bool measure = false;   // time this operation and Record it
  };
  Choice Next(size_t bytes, bool gather);
  void Record(size_t bytes, bool gather, bool streamed, double seconds);
  static void Copy(bool streamed, void* dst, const void* src, size_t bytes) {
    streamed ? StreamCopy(dst, src, bytes) : VectorCopy(dst, src, bytes);
  }

 private:
  struct Kind {
    uint64_t ops = 0;
    double ns_per_byte[2] = {0, 0};  // by mode; 0 = not measured yet
  };
  static constexpr int kSizeClasses = 24;
  static int KindOf(size_t bytes, bool gather);
  Kind kinds_[2 * kSizeClasses];
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_REDUCE_H_
