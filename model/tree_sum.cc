#include "troupe/model/tree_sum.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"

namespace troupe::model {

void TreeAccumulator::Reset() {
  for (Node& node : stack_) spare_.push_back(std::move(node.sum));
  stack_.clear();
  leaves_ = 0;
}

absl::Status TreeAccumulator::Fail(absl::Status s) {
  Reset();
  return s;
}

absl::Status TreeAccumulator::Add(const float* leaf) {
  ++leaves_;
  if (!stack_.empty() && stack_.back().leaves == 1) {
    // The leaf merges with the single leaf on top at once: added where it lies, never copied.
    if (absl::Status s = ops_->Add(stack_.back().sum.data(), stack_.back().sum.data(), leaf, n_);
        !s.ok()) {
      return Fail(s);
    }
    stack_.back().leaves = 2;
  } else {
    FloatArray buf;
    if (!spare_.empty()) {
      buf = std::move(spare_.back());
      spare_.pop_back();
    }
    if (absl::Status s = ops_->Resize(&buf, n_); !s.ok()) return Fail(s);
    if (absl::Status s = ops_->Copy(buf.data(), leaf, n_); !s.ok()) return Fail(s);
    stack_.push_back({1, std::move(buf)});
  }
  while (stack_.size() >= 2 && stack_[stack_.size() - 2].leaves == stack_.back().leaves) {
    Node right = std::move(stack_.back());
    stack_.pop_back();
    float* left = stack_.back().sum.data();
    if (absl::Status s = ops_->Add(left, left, right.sum.data(), n_); !s.ok()) return Fail(s);
    stack_.back().leaves += right.leaves;
    spare_.push_back(std::move(right.sum));
  }
  return absl::OkStatus();
}

absl::Status TreeAccumulator::FinishRangeWith(const float* last_leaf, int64_t begin, int64_t end,
                                              float* out) const {
  if (begin < 0 || end > n_ || begin > end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FinishRangeWith: expected 0 <= begin <= end <= ", n_, ", got [", begin, ", ", end, ")"));
  }
  // Add merges the new leaf into the equal-sized subtrees below it (left + right each time) and
  // Finish combines what remains from the right: either way the result is
  // stack[0] + (stack[1] + (… + (stack[top] + leaf))), one addition per level.
  const int64_t len = end - begin;
  float* to = out + begin;
  if (stack_.empty()) return ops_->Copy(to, last_leaf + begin, len);
  auto node = stack_.rbegin();
  TROUPE_RETURN_IF_ERROR(ops_->Add(to, last_leaf + begin, node->sum.data() + begin, len));
  for (++node; node != stack_.rend(); ++node) {
    TROUPE_RETURN_IF_ERROR(ops_->Add(to, to, node->sum.data() + begin, len));
  }
  return absl::OkStatus();
}

absl::Status TreeAccumulator::Finish(float* out) {
  if (stack_.empty()) return ops_->Fill(out, n_, 0.0f);
  // Remaining subtrees have strictly decreasing sizes; combine from the right.
  FloatArray acc = std::move(stack_.back().sum);
  stack_.pop_back();
  while (!stack_.empty()) {
    float* left = stack_.back().sum.data();
    if (absl::Status s = ops_->Add(left, left, acc.data(), n_); !s.ok()) {
      return Fail(s);
    }
    spare_.push_back(std::move(acc));
    acc = std::move(stack_.back().sum);
    stack_.pop_back();
  }
  absl::Status s = ops_->Copy(out, acc.data(), n_);
  spare_.push_back(std::move(acc));
  leaves_ = 0;
  return s;
}

}  // namespace troupe::model
