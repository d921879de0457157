// Sums per-microbatch gradients in the canonical tree order, whatever the number of microbatches.
//
// The step gradient is T(0, M): T(lo, hi) = T(lo, mid) + T(mid, hi), mid = lo + the largest power
// of two below hi - lo. Adding microbatches left to right and merging equal-sized subtrees as they
// complete (a binary counter) produces exactly that tree with O(log M) buffers, so a single process
// and any power-of-two-aligned split over workers add the same numbers in the same order.
//
// Example:
//   TreeAccumulator acc(n);
//   for (int k = 0; k < M; ++k) { compute grad of microbatch k; acc.Add(grad); }
//   acc.Finish(step_grad);
#ifndef TROUPE_MODEL_TREE_SUM_H_
#define TROUPE_MODEL_TREE_SUM_H_

#include <cstdint>
#include <vector>

namespace troupe::model {

class TreeAccumulator {
 public:
  explicit TreeAccumulator(int64_t n) : n_(n) {}

  // Adds the next leaf (microbatch gradient) of n floats.
  void Add(const float* leaf);
  int64_t leaves() const { return leaves_; }
  // Writes T(0, leaves) to out (zeros if no leaf was added) and resets.
  void Finish(float* out);

 private:
  struct Node {
    int64_t leaves;
    std::vector<float> sum;
  };
  int64_t n_;
  int64_t leaves_ = 0;
  std::vector<Node> stack_;
  std::vector<std::vector<float>> spare_;
};

}  // namespace troupe::model

#endif  // TROUPE_MODEL_TREE_SUM_H_
