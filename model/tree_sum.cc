#include "troupe/model/tree_sum.h"

#include <utility>

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
  FloatArray buf;
  if (!spare_.empty()) {
    buf = std::move(spare_.back());
    spare_.pop_back();
  }
  if (absl::Status s = ops_->Resize(&buf, n_); !s.ok()) return Fail(s);
  if (absl::Status s = ops_->Copy(buf.data(), leaf, n_); !s.ok()) return Fail(s);
  stack_.push_back({1, std::move(buf)});
  ++leaves_;
  while (stack_.size() >= 2 && stack_[stack_.size() - 2].leaves == stack_.back().leaves) {
    Node right = std::move(stack_.back());
    stack_.pop_back();
    if (absl::Status s = ops_->AddInto(stack_.back().sum.data(), right.sum.data(), n_); !s.ok()) {
      return Fail(s);
    }
    stack_.back().leaves += right.leaves;
    spare_.push_back(std::move(right.sum));
  }
  return absl::OkStatus();
}

absl::Status TreeAccumulator::Finish(float* out) {
  if (stack_.empty()) return ops_->Fill(out, n_, 0.0f);
  // Remaining subtrees have strictly decreasing sizes; combine from the right.
  FloatArray acc = std::move(stack_.back().sum);
  stack_.pop_back();
  while (!stack_.empty()) {
    if (absl::Status s = ops_->AddInto(stack_.back().sum.data(), acc.data(), n_); !s.ok()) {
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
