// Private: element kernels — bf16 <-> f32 conversion and the reduction ops, all in f32.
#ifndef TROUPE_COLLECTIVES_REDUCE_H_
#define TROUPE_COLLECTIVES_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

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

// How a same-host all-reduce runs, where both paths exist: staged through the shared segments
// (StagedAllReduce), the rank writing what it stages through its caches (VectorCopy; the peers
// then take the lines out of this core's cache) or around them (StreamCopy; they read memory), or
// by reading the peers' buffers (single copy, SingleCopyAllReduce).
// Which is faster depends on the machine and the moment: two processes exchanging 1 MiB through
// shared memory on this 2-vCPU VM moved 17 GB/s per direction through the caches and 6.5 around
// them in one minute, 4.4 and 8.5-10 in another (when the cores' caches answer each other
// slowly); 32 MiB all-reduces took 7.5-8.1 ms staged and 4.8-5.8 single copy one day, where an
// earlier day's runs had staged 1.9x faster at 64 MiB. So it is measured, per kind of operation
// (its bytes by powers of 4, and whether it gathers), at fixed operations of the kind, the same on
// every rank (they run the same operations in the same order): operation k runs staged cached
// when k % kMeasureEvery == 0, staged streamed when it is kMeasureEvery / 2, single copy when it
// is kMeasureEvery / 4 (where the peers' buffers are readable; the path not taken less often, see
// Agree), and those are timed. Every other operation takes single copy where the group last
// agreed on it, else the staging mode this rank measured faster.
// - The write mode needs no agreement: ranks that stage differently still run one protocol; only
//   operations in which all ranks wrote the same way are measured (each rank's time is the
//   group's: one rank's writes show in its peers' reads).
// - The path does: a rank that stages while another reads its buffer deadlocks. Each single-copy
//   measurement exchanges the ranks' estimates (Estimate) with the buffer addresses, and every
//   rank applies the same rule to the same numbers (Agree). Until a kind's first agreement, the
//   path is the caller's prior (PreferSingleCopy).
class StagingCopy {
 public:
  static constexpr uint64_t kMeasureEvery = 16;
  struct Choice {
    bool streamed = false;     // StreamCopy, else VectorCopy
    bool measure = false;      // time this operation and Record it
    bool single_copy = false;  // read the peers' buffers instead of staging
  };
  // This rank's estimates of a kind, in ns per byte (0: not measured yet).
  struct Estimate {
    double staged = 0;  // the faster write mode's
    double single_copy = 0;
  };
  // `can_read_peers`: whether single copy is possible (else operations only stage); `prior`: the
  // path before the kind's first agreement.
  Choice Next(size_t bytes, bool gather, bool can_read_peers = false, bool prior = false);
  void Record(size_t bytes, bool gather, Choice how, double seconds);
  Estimate Estimated(size_t bytes, bool gather) const;
  // Every rank's Estimated, gathered at one operation of the kind (the same on every rank): single
  // copy from now on where the slowest rank's single copy estimate is below the slowest rank's
  // staged one; unchanged while any rank lacks either estimate. The path not taken is measured
  // every period while it is within 1.25x of the other, every 4 within 2x, else every 16 (a 2x
  // slower staging measured twice in 16 operations would cost 12 %; twice in 256, 0.8 %). The
  // path changes only where the other is more than 5 % faster: near a tie, noise does not flip it
  // at every exchange.
  void Agree(size_t bytes, bool gather, const std::vector<Estimate>& all);
  static void Copy(bool streamed, void* dst, const void* src, size_t bytes) {
    streamed ? StreamCopy(dst, src, bytes) : VectorCopy(dst, src, bytes);
  }

 private:
  struct Kind {
    uint64_t ops = 0;
    double ns_per_byte[3] = {0, 0, 0};  // cached, streamed, single copy; 0 = not measured yet
    bool single_copy = false;           // the path agreed on (or the prior)
    uint64_t stretch = 1;               // the path not taken is measured every stretch periods
  };
  static constexpr int kSizeClasses = 24;
  static int KindOf(size_t bytes, bool gather);
  Kind kinds_[2 * kSizeClasses];
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_REDUCE_H_
