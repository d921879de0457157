// troupe/collectives/canonical_combine.h — the order in which partial sums keyed by contribution
// interval are added (docs/ARCHITECTURE.md, "Determinism"): the ordered reduce-scatter of the host
// and NCCL communicators runs it, and so does a pipeline's gradient exchange (train/elastic.h),
// so every path sums each element in the one canonical tree.
#ifndef TROUPE_COLLECTIVES_CANONICAL_COMBINE_H_
#define TROUPE_COLLECTIVES_CANONICAL_COMBINE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::collectives {

// The canonical split point: lo + the largest power of two strictly below hi - lo.
uint64_t CanonicalMid(uint64_t lo, uint64_t hi);

// The combine of an ordered reduce-scatter, planned from every rank's contribution interval (the
// same on every rank): the host algorithm and the NCCL communicator both run this plan, so
// their sums are bit-identical. An operand is rank `index`'s partial of the block being reduced,
// inner temporary `index`, or the output.
struct CombineOperand {
  enum class Kind { kNone, kPartial, kInner, kOutput };
  Kind kind = Kind::kNone;
  int index = 0;
  bool operator==(const CombineOperand& o) const { return kind == o.kind && index == o.index; }
};
// dst = x + y, in that operand order (x holds the lower contributions); y kNone: dst = x.
struct CombineStep {
  CombineOperand dst, x, y;
  bool operator==(const CombineStep& o) const { return dst == o.dst && x == o.x && y == o.y; }
};
struct CombinePlan {
  uint64_t total = 0;  // contributions: the largest interval end
  int inner = 0;       // temporaries the steps use: at most the tree's depth (~log2 ranks), reused
                       // once read; a step may write the temporary it reads as x (dst = x + y)
  std::vector<CombineStep> steps;  // in execution order; the last one writes kOutput
};
// The canonical tree T(0, total) over the ranks' partials, T(lo, hi) = T(lo, mid) + T(mid, hi)
// with mid = CanonicalMid(lo, hi), cut at the nodes some rank holds (an inner node is a
// temporary, the root the output). InvalidArgument unless the intervals are disjoint
// power-of-two-aligned subtrees covering [0, total), every rank's used once.
//   {{0, 4}, {4, 6}, {6, 7}}: inner0 = partial1 + partial2; output = partial0 + inner0.
[[nodiscard]] absl::StatusOr<CombinePlan> PlanCanonicalCombine(
    const std::vector<std::pair<uint64_t, uint64_t>>& intervals_by_rank);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_CANONICAL_COMBINE_H_
