// troupe/runtime/placement.h — what a remote spawn asks of the cluster.
//
//   Placement p;
//   p.resources = "gpu=1,cpu=4";
//   p.labels = "zone=a";
//   p.spot = "prefer";
//   client.Spawn("trainer", args, "trainer-0", p);
#ifndef TROUPE_RUNTIME_PLACEMENT_H_
#define TROUPE_RUNTIME_PLACEMENT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "caf/meta/type_name.hpp"

namespace troupe::runtime {

// Where a remotely spawned actor may run and what it needs; the head asks the scheduler
// (troupe::scheduler) and then picks the least-loaded worker on the chosen node.
struct Placement {
  std::string node;               // only this node ("" = any)
  std::string worker;             // only this worker ("" = any worker on the chosen node)
  std::string resources;          // demands, e.g. "cpu=1,gpu=1,memory=2G" ("" = none)
  std::string labels;             // node label selector, e.g. "zone=a,spot=false" (all hold)
  std::string strategy = "pack";  // pack (best fit) | spread (least loaded)
  std::string spot;               // "" | "prefer" (workers) | "avoid" (coordinator, writers)
  std::string group;              // inside this placement group ...
  int64_t bundle = -1;            // ... in this bundle (-1: the first with room)

  // "" / "any", "node=<name>" or "worker=<id>".
  [[nodiscard]] static absl::StatusOr<Placement> Parse(const std::string& where);
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Placement& x) {
  return f(caf::meta::type_name("troupe.Placement"), x.node, x.worker, x.resources, x.labels,
           x.strategy, x.spot, x.group, x.bundle);
}

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_PLACEMENT_H_
