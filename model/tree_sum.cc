#include "troupe/model/tree_sum.h"

#include <algorithm>

#include "troupe/kernels/parallel.h"

namespace troupe::model {
namespace {
// left[i] = left[i] + right[i]; element-wise, so independent of the thread count.
void AddInto(float* left, const float* right, int64_t n) {
  kernels::ParallelForRange(n, 65536, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) left[i] = left[i] + right[i];
  });
}
}  // namespace

void TreeAccumulator::Add(const float* leaf) {
  std::vector<float> buf;
  if (!spare_.empty()) {
    buf = std::move(spare_.back());
    spare_.pop_back();
  }
  buf.assign(leaf, leaf + n_);
  stack_.push_back({1, std::move(buf)});
  ++leaves_;
  while (stack_.size() >= 2 && stack_[stack_.size() - 2].leaves == stack_.back().leaves) {
    Node right = std::move(stack_.back());
    stack_.pop_back();
    AddInto(stack_.back().sum.data(), right.sum.data(), n_);
    stack_.back().leaves += right.leaves;
    spare_.push_back(std::move(right.sum));
  }
}

void TreeAccumulator::Finish(float* out) {
  if (stack_.empty()) {
    std::fill(out, out + n_, 0.0f);
    return;
  }
  // Remaining subtrees have strictly decreasing sizes; combine from the right.
  std::vector<float> acc = std::move(stack_.back().sum);
  stack_.pop_back();
  while (!stack_.empty()) {
    AddInto(stack_.back().sum.data(), acc.data(), n_);
    spare_.push_back(std::move(acc));
    acc = std::move(stack_.back().sum);
    stack_.pop_back();
  }
  std::copy(acc.begin(), acc.end(), out);
  spare_.push_back(std::move(acc));
  leaves_ = 0;
}

}  // namespace troupe::model
