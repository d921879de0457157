// troupe/runtime/placement.h — what a remote spawn asks of the cluster.
//
//   Placement p;
//   p.resources = "gpu=1,cpu=4";
//   p.labels = "zone=a";
//   p.spot = SpotPreference::kPrefer;
//   client.Spawn("trainer", args, "trainer-0", p);
//
//   client.CreatePlacementGroup("pair", {"gpu=1", "gpu=1"}, GroupStrategy::kStrictSpread);
//
// The enums here are printed and parsed only at text edges (flags, configs, logs): Name(x) and
// Parse...(text), whose errors name the field, the expected values and the text.
#ifndef TROUPE_RUNTIME_PLACEMENT_H_
#define TROUPE_RUNTIME_PLACEMENT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "caf/meta/type_name.hpp"

namespace troupe::runtime {

// How the scheduler picks among the nodes that fit one actor. Printed "pack" | "spread".
enum class PlacementStrategy {
  kPack,    // best fit: the feasible node with the least free of the scarcest demanded resource
  kSpread,  // least loaded: the feasible node with the lowest utilisation of that resource
};

// Soft preference between spot and on-demand nodes: the preferred kind is tried first, the other
// only when none fits (a hard requirement is a label selector on "spot"). Printed "none" |
// "prefer" | "avoid"; ParseSpotPreference also takes "" for kNone.
enum class SpotPreference {
  kNone,    // no preference
  kPrefer,  // prefer spot nodes: workers, which a preemption only shrinks
  kAvoid,   // prefer on-demand nodes: the coordinator, checkpoint writers
};

// How the bundles of a placement group are laid out (all or nothing). Printed "pack" | "spread"
// | "strict_pack" | "strict_spread".
enum class GroupStrategy {
  kPack,          // as few nodes as possible, more when one does not fit them all
  kSpread,        // as many failure domains as possible, sharing when there are too few
  kStrictPack,    // all bundles in one domain (one node by default), or unschedulable
  kStrictSpread,  // every bundle in a distinct domain, or unschedulable
};

// The text forms above; "?" for a value outside the enum.
const char* Name(PlacementStrategy strategy);
const char* Name(SpotPreference spot);
const char* Name(GroupStrategy strategy);
// The inverses of Name: InvalidArgument naming the field, the expected values and the text.
absl::StatusOr<PlacementStrategy> ParsePlacementStrategy(const std::string& text);
absl::StatusOr<SpotPreference> ParseSpotPreference(const std::string& text);
absl::StatusOr<GroupStrategy> ParseGroupStrategy(const std::string& text);

// CAF 0.17 serializes an enum as its underlying integer; these make its message printing show
// the names instead of "<unprintable>".
inline std::string to_string(PlacementStrategy x) { return Name(x); }
inline std::string to_string(SpotPreference x) { return Name(x); }
inline std::string to_string(GroupStrategy x) { return Name(x); }

// Where a remotely spawned actor may run and what it needs; the head asks the scheduler
// (troupe::scheduler) and then picks the least-loaded worker on the chosen node.
struct Placement {
  std::string node;       // only this node ("" = any)
  std::string worker;     // only this worker ("" = any worker on the chosen node)
  std::string resources;  // demands, e.g. "cpu=1,gpu=1,memory=2G" ("" = none)
  std::string labels;     // node label selector, e.g. "zone=a,spot=false" (all hold)
  PlacementStrategy strategy = PlacementStrategy::kPack;
  SpotPreference spot = SpotPreference::kNone;
  std::string group;    // inside this placement group ...
  int64_t bundle = -1;  // ... in this bundle (-1: the first with room)

  // The text edge: "" / "any", "node=<name>" or "worker=<id>".
  [[nodiscard]] static absl::StatusOr<Placement> Parse(const std::string& where);
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Placement& x) {
  return f(caf::meta::type_name("troupe.Placement"), x.node, x.worker, x.resources, x.labels,
           x.strategy, x.spot, x.group, x.bundle);
}

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_PLACEMENT_H_
