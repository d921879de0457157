// Invariant checks the simulator runs after every event, through the Scheduler's public views
// (and its own CheckInvariants for the accounting): no resource over-committed, strict
// strategies respected, no group partial, nothing on a dead node, and after a failure only
// what the dead nodes held has moved.
//
//   Snapshot before = TakeSnapshot(s);
//   auto report = s.RemoveNodes(wave);
//   CHECK_OK(CheckReschedule(before, wave, *report, s));
#ifndef TROUPE_SCHEDULER_SIM_INVARIANTS_H_
#define TROUPE_SCHEDULER_SIM_INVARIANTS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "troupe/scheduler/scheduler.h"

namespace troupe::scheduler::sim {

// Accounting (Scheduler::CheckInvariants) plus, from the views: every actor and bundle is on a
// node that is not dead, every group is complete, STRICT_SPREAD bundles are in distinct
// domains and STRICT_PACK bundles in one.
[[nodiscard]] absl::Status CheckCluster(const Scheduler& s);

struct Snapshot {
  std::map<std::string, std::string> actors;               // actor -> node
  std::map<std::string, std::string> actor_group;          // actor -> its group, if any
  std::map<std::string, std::vector<std::string>> groups;  // group -> bundle nodes
};
Snapshot TakeSnapshot(const Scheduler& s);

// After RemoveNodes(dead): actors and bundles not on a dead node are where they were; those
// that were are either re-placed (and listed as moved/repaired) or gone (listed as lost/broken
// with a reason); nothing else is reported, except the actors inside a broken group, which go
// with it (listed as lost).
[[nodiscard]] absl::Status CheckReschedule(const Snapshot& before,
                                           const std::vector<std::string>& dead,
                                           const RescheduleReport& report, const Scheduler& after);

}  // namespace troupe::scheduler::sim

#endif  // TROUPE_SCHEDULER_SIM_INVARIANTS_H_
