// Private: the collective algorithms, written once against Transport and run by the Engine on
// f32 working buffers (bf16 is widened before and narrowed after, so all accumulation is f32).
//
//   ring reduce-scatter / all-gather   bandwidth-optimal, pieces pipelined (recv p+1 while
//                                      reducing p); used for large buffers
//   recursive doubling all-reduce      log2(n) rounds of whole-buffer exchange; small buffers
//   single-copy all-reduce            each rank reduces its segment reading the others'
//                                      buffers directly (Transport::ReadPeer), then reads their
//                                      reduced segments; one copy per byte; same host only
//   staged all-reduce                  the same through shared staging slots, piece by piece;
//                                      every rank on one host
//   ordered reduce-scatter             partials keyed by contribution interval, combined by the
//                                      owner in canonical tree order (PlanCanonicalCombine, which
//                                      the NCCL communicator runs too): bit-exact for any n
//   binomial / scatter+all-gather bcast, dissemination barrier
#ifndef TROUPE_COLLECTIVES_ALGORITHMS_H_
#define TROUPE_COLLECTIVES_ALGORITHMS_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reduce.h"
#include "transport.h"
#include "troupe/collectives/canonical_combine.h"
#include "troupe/collectives/communicator.h"

namespace troupe::collectives {

struct OpContext {
  Transport* t = nullptr;
  uint64_t seq = 0;
  absl::Time deadline = absl::InfiniteFuture();
  size_t piece_bytes = 512 * 1024;
  // Sub-tag: 4-bit phase, 8-bit step, 12-bit piece.
  uint64_t Tag(uint32_t phase, uint32_t step, uint32_t piece) const {
    return OpTag(seq, (phase << 20) | ((step & 0xff) << 12) | (piece & 0xfff));
  }
};

// Offsets of n nearly equal segments of `count` elements (n + 1 entries).
std::vector<size_t> EvenSegments(size_t count, int n);

// In place on w; afterwards segment `rank` of w holds the reduction of all ranks' segments.
[[nodiscard]] absl::Status RingReduceScatter(const OpContext& c, float* w,
                                             const std::vector<size_t>& off, ReduceOp op,
                                             uint32_t phase);
// In place on bytes; before, segment `rank` is local; afterwards all segments are.
[[nodiscard]] absl::Status RingAllGather(const OpContext& c, uint8_t* w,
                                         const std::vector<size_t>& off_bytes, uint32_t phase);
// The same, every rank sending its segment to every other at once: one message latency instead
// of n - 1 (the same bytes on each rank's link), for groups up to kDirectAllGatherRanks.
inline constexpr int kDirectAllGatherRanks = 8;
[[nodiscard]] absl::Status DirectAllGather(const OpContext& c, uint8_t* w,
                                           const std::vector<size_t>& off_bytes, uint32_t phase);
// DirectAllGather for groups up to kDirectAllGatherRanks, else RingAllGather.
[[nodiscard]] absl::Status AllGatherSegments(const OpContext& c, uint8_t* w,
                                             const std::vector<size_t>& off_bytes, uint32_t phase);
// A measured single copy's exchange (StagingCopy): this rank's estimates in, every rank's out,
// and the operation's time from the moment every rank had arrived.
struct SingleCopyVote {
  StagingCopy::Estimate mine;
  std::vector<StagingCopy::Estimate> all;
  double seconds = 0;
};
// In place on w (count = off.back()); needs c.t->CanReadPeers(). Afterwards segment `rank` of w
// holds the reduction (peers combined in rank order, as StagedAllReduce does: the two give the
// same bits) and, with `gather`, so do all segments. With `vote`, the ranks' estimates travel with
// the buffer addresses. Uses tag phases `phase` to `phase` + 2.
[[nodiscard]] absl::Status SingleCopyAllReduce(const OpContext& c, float* w,
                                               const std::vector<size_t>& off, ReduceOp op,
                                               bool gather, uint32_t phase,
                                               SingleCopyVote* vote = nullptr);
// The same result through the ranks' shared segments (needs c.t->HostShared()): step by step, each
// rank copies a piece of every other rank's segment of w into its staging slot, reduces its own
// segment's piece in w reading the peers' slots, and (with `gather`) publishes it in its slot and
// copies the others' reduced pieces into w.
// No system call (single copy's process_vm_readv pins every page it reads); what a rank stages
// it writes through its caches or around them, as `mode` says (StagingCopy::Next in reduce.h),
// and a measured operation records its time there.
[[nodiscard]] absl::Status StagedAllReduce(const OpContext& c, float* w,
                                           const std::vector<size_t>& off, ReduceOp op, bool gather,
                                           StagingCopy::Choice mode);
// The prior of the same-host path (StagingCopy::Next), until the ranks first agree on measured
// times: whether an all-reduce whose largest segment is `segment_bytes` reads the peers' buffers
// (SingleCopyAllReduce) rather than staging (StagedAllReduce), on vCPUs whose L2 holds
// `l2_bytes`: where the segment is 1 to 4 L2s. There the staged path's extra pass through the
// slots cost more than the system calls it saves on one day of the 2-vCPU VM (2 MiB L2): single
// copy took 0.80-0.87x the staged time from 4 to 16 MiB; the same at 2 and 24 MiB; staged faster
// below (no system call) and above (1.9x at 64 MiB). Every rank of a host computes the same
// answer (l2_bytes: L2Bytes).
bool PreferSingleCopy(size_t segment_bytes, size_t l2_bytes);
// The L2 of vCPU 0 (sysfs), the same on every rank of the host; 0 where sysfs does not say.
size_t L2Bytes();
// In place; every rank ends with the bit-identical reduction.
[[nodiscard]] absl::Status RecursiveDoublingAllReduce(const OpContext& c, float* w, size_t count,
                                                      ReduceOp op, uint32_t phase);
// Rank r's `w` (count = off.back()) is the partial sum over contributions [lo, hi). Writes the
// canonical-tree reduction of segment `rank` to `out`, and the number of contributions to
// `*contributions`.
[[nodiscard]] absl::Status OrderedReduceScatter(const OpContext& c, const float* w,
                                                const std::vector<size_t>& off, uint64_t lo,
                                                uint64_t hi, ReduceOp op, float* out,
                                                uint64_t* contributions, uint32_t phase);
[[nodiscard]] absl::Status BinomialBroadcast(const OpContext& c, uint8_t* buf, size_t bytes,
                                             int root, uint32_t phase);
[[nodiscard]] absl::Status ScatterAllGatherBroadcast(const OpContext& c, uint8_t* buf, size_t bytes,
                                                     int root, uint32_t phase);
[[nodiscard]] absl::Status DisseminationBarrier(const OpContext& c, uint32_t phase);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_ALGORITHMS_H_
