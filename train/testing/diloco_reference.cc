#include "troupe/train/diloco_reference.h"

#include <algorithm>

namespace troupe::train {

void DiLoCoReference::Start(const std::string& group, const float* params, int64_t n) {
  if (global_.empty()) {
    global_.assign(params, params + n);
    momentum_.assign(n, 0.0f);
  }
  base_[group].assign(params, params + n);
}

void DiLoCoReference::Outer(const std::vector<const std::vector<float>*>& deltas) {
  if (deltas.empty()) return;
  for (size_t i = 0; i < global_.size(); ++i) {
    float sum = 0.0f;
    for (const std::vector<float>* d : deltas) sum += (*d)[i];
    const float mean = sum / static_cast<float>(deltas.size());
    momentum_[i] = mu_ * momentum_[i] + mean;
    global_[i] = global_[i] - lr_ * (mean + mu_ * momentum_[i]);
  }
}

void DiLoCoReference::RoundEnd(const std::vector<std::pair<std::string, float*>>& groups, bool last,
                               const std::function<bool(const std::string&)>& applies) {
  const size_t n = global_.size();
  std::map<std::string, std::vector<float>> now;
  std::vector<const std::vector<float>*> newest, held;
  for (const auto& [g, p] : groups) {
    const std::vector<float>& from = stale_ ? base_[g] : global_;
    for (size_t i = 0; i < n; ++i) now[g].push_back(from[i] - p[i]);
    if (!applies || applies(g)) newest.push_back(&now[g]);
    if (pending_.count(g)) held.push_back(&pending_[g]);
  }
  if (stale_) Outer(held);  // the round in flight, of the groups still here
  if (!stale_ || last) {
    Outer(newest);
    for (const auto& [g, p] : groups) std::copy(global_.begin(), global_.end(), p);
    return;
  }
  for (const auto& [g, p] : groups) {
    for (size_t i = 0; i < n; ++i) p[i] = global_[i] - now[g][i];
    base_[g].assign(p, p + n);
  }
  pending_ = std::move(now);
}

}  // namespace troupe::train
