#include "troupe/scheduler/elastic.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace troupe::scheduler {

const char* ScaleActionName(ScaleDecision::Action action) {
  switch (action) {
    case ScaleDecision::Action::kKeep:
      return "keep";
    case ScaleDecision::Action::kResize:
      return "resize";
    case ScaleDecision::Action::kPause:
      return "pause";
  }
  return "?";
}

absl::StatusOr<ElasticPolicy> ElasticPolicy::Create(const ElasticOptions& options) {
  if (options.min_workers < 1 || options.max_workers < options.min_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("ElasticOptions: need 1 <= min_workers <= max_workers, got min_workers=",
                     options.min_workers, " max_workers=", options.max_workers));
  }
  return ElasticPolicy(options);
}

int ElasticPolicy::usable_slots() const {
  int usable = 0;
  for (const auto& [name, node] : nodes_) usable += node.draining ? 0 : node.slots;
  return usable;
}

ScaleDecision ElasticPolicy::Decide(std::string event) {
  const int target =
      std::clamp(options_.target_workers, options_.min_workers, options_.max_workers);
  const int usable = usable_slots();
  ScaleDecision d;
  if (usable < options_.min_workers) {
    d.action = world_size_ == 0 ? ScaleDecision::Action::kKeep : ScaleDecision::Action::kPause;
    d.world_size = 0;
    d.reason = absl::StrCat(event, ": ", usable, " usable worker slots < min_workers ",
                            options_.min_workers, "; waiting for nodes");
  } else {
    d.world_size = std::min(target, usable);
    d.action =
        d.world_size == world_size_ ? ScaleDecision::Action::kKeep : ScaleDecision::Action::kResize;
    d.reason = absl::StrCat(event, ": ", usable, " usable slots, target ", target, " -> ",
                            d.world_size, " workers");
  }
  world_size_ = d.world_size;
  return d;
}

ScaleDecision ElasticPolicy::OnJoin(const std::string& node, int slots) {
  nodes_[node] = NodeSlots{std::max(slots, 0), false};
  return Decide(absl::StrCat("join ", node));
}

ScaleDecision ElasticPolicy::OnDrain(const std::string& node) {
  auto it = nodes_.find(node);
  if (it != nodes_.end()) it->second.draining = true;
  return Decide(absl::StrCat("drain ", node));
}

ScaleDecision ElasticPolicy::OnLeave(const std::string& node) {
  nodes_.erase(node);
  return Decide(absl::StrCat("leave ", node));
}

ScaleDecision ElasticPolicy::OnTargetChange(int target_workers) {
  options_.target_workers = target_workers;
  return Decide(absl::StrCat("target ", target_workers));
}

std::string ElasticPolicy::DebugString() const {
  return absl::StrCat("ElasticPolicy{min=", options_.min_workers, " max=", options_.max_workers,
                      " target=", options_.target_workers, " nodes=", nodes_.size(),
                      " usable=", usable_slots(), " world=", world_size_, "}");
}

}  // namespace troupe::scheduler
