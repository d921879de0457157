// troupe/train/shard_layout.h — the arithmetic of the elastic step's ranges, with no state, no
// memory and no communication: who owns which parameters (ShardLayout), which microbatches a
// replica computes (MicrobatchBlocks), where a range's mirror lives (the buddy offset) and
// whether a new group can restore from memory. ElasticRank (elastic.h) and the coordinator's core
// build on it; shard_layout_test.cc pins it case by case.
//
//   const ShardLayout l = ShardLayout::Make(/*num_params=*/10000, /*world=*/3);
//   // l.per_rank == 4096 (one 4 Ki norm chunk); rank 2 owns [8192, 10000), padded to 12288.
//   Intersect({{0, 5000}, {9000, 9500}}, l.begin(1), l.end(1));  // {{4096, 5000}}
//
// Ranges are flat [begin, end) element intervals of the model's parameter vector, sorted and
// disjoint wherever a function here returns them.
#ifndef TROUPE_TRAIN_SHARD_LAYOUT_H_
#define TROUPE_TRAIN_SHARD_LAYOUT_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::train {

// Which ranks own which parameters: the flat vector is padded to world · per_rank elements,
// per_rank a multiple of kernels::kNormChunk (so the gradient norm's chunks never straddle two
// ranks); rank r owns [r·per_rank, (r+1)·per_rank) ∩ [0, num_params) — possibly empty.
struct ShardLayout {
  int world = 1;
  int64_t num_params = 0;
  int64_t per_rank = 0;  // a multiple of kernels::kNormChunk

  static ShardLayout Make(int64_t num_params, int world);
  int64_t padded() const { return per_rank * world; }
  // The real (unpadded) range of rank r; begin == end for a rank that owns only padding.
  int64_t begin(int r) const;
  int64_t end(int r) const;
};

// [lo, hi) of the M microbatches for each of `world` ranks: power-of-two-aligned subtrees of the
// canonical tree of [0, M), in order. InvalidArgument unless 1 <= world <= M.
[[nodiscard]] absl::StatusOr<std::vector<std::pair<int32_t, int32_t>>> MicrobatchBlocks(
    int32_t microbatches, int world);

// ---- Buddies: rank r's range is mirrored on rank (r + buddy) mod W.
// -------------------------------

// Where one generation's ranks go in the next: `gone` (sorted) are the old ranks not carried
// over; the others keep their order and come first, so old rank o becomes new rank
// o − |gone below o| (new rank 0 holds the committed parameters). A plan names the few gone
// ranks, not a map of the whole old world: O(deaths) per rank on the wire.
// Old rank o's new rank, or -1 if it is gone. O(log |gone|).
int NewRank(const std::vector<int>& gone, int o);

// True if every old range survives in memory: its owner or its buddy ((o + buddy) mod W) is in
// the new group, W = old_world (0: no old group) — or, where every rank holds the whole optimizer
// state (`replicated`), any rank of the old world. O(|gone| log |gone|).
bool MemoryRestorePossible(int old_world, const std::vector<int>& gone, int buddy = 1,
                           bool replicated = false);

// The buddy offset k for a group whose rank r is in failure domain domains[r] (a zone, else a
// host): the smallest k in [1, W) that puts the fewest buddies (r + k) mod W in their owner's
// domain — none whenever some offset allows it (equal-sized domains in rank order: k = the
// domain size). 1 for a world of one.
int BuddyOffset(const std::vector<std::string>& domains);
// How many ranks r of `domains` share their domain with their buddy (r + buddy) mod W.
int BuddiesSharingADomain(const std::vector<std::string>& domains, int buddy);

// An offset a plan may carry: 1 <= buddy < world (1 for a world of one).
inline bool ValidBuddy(int buddy, int world) { return buddy >= 1 && buddy < std::max(2, world); }
// The rank that mirrors `rank`'s range, and the rank whose range `rank` mirrors.
inline int BuddyRank(int rank, int buddy, int world) { return (rank + buddy) % world; }
inline int MirroredRank(int rank, int buddy, int world) {
  return (rank + world - buddy % world) % world;
}

// ---- Ranges
// --------------------------------------------------------------------------------------

using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // flat [begin, end)

// r ∩ [lo, hi), in r's order; empty pieces dropped.
Ranges Intersect(const Ranges& r, int64_t lo, int64_t hi);
// Elements in r (its ranges disjoint).
int64_t TotalSize(const Ranges& r);
// Where flat element `at` (inside one of r's ranges) is when r's ranges lie one after the other
// in one buffer; TotalSize(r) when no range holds it.
int64_t PackedOffset(const Ranges& r, int64_t at);
// r sorted, overlapping or touching ranges joined.
Ranges Merged(Ranges r);
// [0, n) minus r (r sorted and disjoint, inside [0, n)): the gaps between r's ranges, in order.
Ranges Complement(const Ranges& r, int64_t n);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_SHARD_LAYOUT_H_
