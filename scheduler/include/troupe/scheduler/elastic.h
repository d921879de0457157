// Elastic worker policy: from node events (join, drain, leave) to the world size of an elastic
// training job, within its min/max and toward its target. Pure logic; the coordinator applies a
// decision at the next step boundary.
//
//   ElasticOptions options;
//   options.min_workers = 2;
//   options.max_workers = options.target_workers = 8;
//   absl::StatusOr<ElasticPolicy> p = ElasticPolicy::Create(options);
//   p->OnJoin("node-1", 4);   // {kResize, 4}: 4 usable slots, min reached
//   p->OnJoin("node-2", 4);   // {kResize, 8}
//   p->OnDrain("node-2");     // {kResize, 4}: a spot notice; shrink before the node goes
//   p->OnLeave("node-1");     // {kPause, 0}: below min_workers, wait for nodes
//
// Per-node state machine (a node that leaves and comes back joins again):
//
//   OnJoin ──▶ usable ──OnDrain──▶ draining ──OnLeave──▶ gone
//                 └──────────────────OnLeave──────────────▶ gone
//
// Thread safety: none; the coordinator's actor owns it.
#ifndef TROUPE_SCHEDULER_ELASTIC_H_
#define TROUPE_SCHEDULER_ELASTIC_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace troupe::scheduler {

struct ElasticOptions {
  int min_workers = 1;     // below this the job pauses
  int max_workers = 1;     // never more than this
  int target_workers = 1;  // what the job asks for; clamped to [min, max]
};

struct ScaleDecision {
  enum class Action {
    kKeep,    // world size unchanged
    kResize,  // run the next step with world_size workers
    kPause,   // fewer than min_workers usable: stop after this step, wait for nodes
  };
  Action action = Action::kKeep;
  int world_size = 0;  // workers to run with (0 when paused)
  std::string reason;
};
const char* ScaleActionName(ScaleDecision::Action action);

class ElasticPolicy {
 public:
  // InvalidArgument unless 1 <= min_workers <= max_workers.
  [[nodiscard]] static absl::StatusOr<ElasticPolicy> Create(const ElasticOptions& options);

  // A node offering `slots` worker slots joined (a rejoin replaces the old slot count).
  ScaleDecision OnJoin(const std::string& node, int slots);
  // A preemption notice: the node's workers leave at the next step boundary.
  ScaleDecision OnDrain(const std::string& node);
  // The node is gone (dead or done draining).
  ScaleDecision OnLeave(const std::string& node);
  ScaleDecision OnTargetChange(int target_workers);

  int world_size() const { return world_size_; }
  int usable_slots() const;
  std::string DebugString() const;

 private:
  explicit ElasticPolicy(const ElasticOptions& options) : options_(options) {}
  ScaleDecision Decide(std::string event);

  struct NodeSlots {
    int slots = 0;
    bool draining = false;
  };
  ElasticOptions options_;
  std::map<std::string, NodeSlots> nodes_;
  int world_size_ = 0;
};

}  // namespace troupe::scheduler

#endif  // TROUPE_SCHEDULER_ELASTIC_H_
