// Sums per-microbatch gradients in the canonical tree order, whatever the number of microbatches.
//
// The step gradient is T(0, M): T(lo, hi) = T(lo, mid) + T(mid, hi), mid = lo + the largest power
// of two below hi - lo. Adding microbatches left to right and merging equal-sized subtrees as they
// complete (a binary counter) produces exactly that tree with O(log M) buffers, so a single process
// and any power-of-two-aligned split over workers add the same numbers in the same order.
//
// The buffers and additions are an ArrayOps' (array_ops.h): the host's by default, a GPU's for
// gradients that live there — the same additions in the same order either way.
//
// Example:
//   TreeAccumulator acc(n);
//   for (int k = 0; k < M; ++k) { compute grad of microbatch k; TROUPE_CHECK_OK(acc.Add(grad)); }
//   TROUPE_CHECK_OK(acc.Finish(step_grad));
#ifndef TROUPE_MODEL_TREE_SUM_H_
#define TROUPE_MODEL_TREE_SUM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "troupe/model/array_ops.h"

namespace troupe::model {

class TreeAccumulator {
 public:
  explicit TreeAccumulator(int64_t n, ArrayOps& ops = HostArrayOps()) : n_(n), ops_(&ops) {}

  // Adds the next leaf (microbatch gradient) of n floats of the ArrayOps' memory.
  [[nodiscard]] absl::Status Add(const float* leaf);
  int64_t leaves() const { return leaves_; }
  // Writes T(0, leaves) to out (zeros if no leaf was added) and resets. After an error the
  // accumulator is reset too (its leaves are dropped).
  [[nodiscard]] absl::Status Finish(float* out);
  // Elements [begin, end) of what Add(last_leaf) then Finish would write — the same additions
  // in the same order, bit for bit — into out[begin, end), leaving the accumulator as it was. A
  // trainer finishes the last leaf range by range as its backward pass completes them (then
  // calls Reset). out may not alias last_leaf's range.
  [[nodiscard]] absl::Status FinishRangeWith(const float* last_leaf, int64_t begin, int64_t end,
                                             float* out) const;
  // Drops the leaves added so far (their buffers are kept for reuse).
  void Reset();

 private:
  struct Node {
    int64_t leaves;
    FloatArray sum;
  };
  absl::Status Fail(absl::Status s);
  int64_t n_;
  ArrayOps* ops_;
  int64_t leaves_ = 0;
  std::vector<Node> stack_;
  std::vector<FloatArray> spare_;
};

}  // namespace troupe::model

#endif  // TROUPE_MODEL_TREE_SUM_H_
