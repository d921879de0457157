// The scheduler's vocabulary: nodes (resources, labels, states), requests (one actor, or a
// placement group of bundles) and results (a placement, or Unschedulable with a reason a person
// can act on). Pure data: no I/O, no threads.
//
//   NodeSpec node{"node-3", {{"cpu", 32}, {"gpu", 4}}, {{"zone", "a"}, {"spot", "true"}}};
//   ActorRequest req;
//   req.actor = "trainer-0";
//   req.demands = {{"gpu", 1}, {"cpu", 4}};
//   req.selector = {{"zone", LabelTerm::Op::kIn, {"a", "b"}}};
//   req.spot = SpotPreference::kPreferSpot;  // workers may ride on spot nodes
//
// Node state machine (owned by Scheduler; a dead node is never revived, a returning machine
// joins again as a new node under the same name):
//
//        AddNode            DrainNode              RemoveNodes
//   ───────────▶ kAlive ─────────────▶ kDraining ─────────────▶ kDead
//                  │    ◀───────────── (UndrainNode)               ▲
//                  └───────────────────────────────────────────────┘
//                                      RemoveNodes
//
//   kAlive:    takes new placements.
//   kDraining: keeps what it holds, takes nothing new (e.g. a spot preemption notice).
//   kDead:     holds nothing; whatever it held is re-placed by RemoveNodes or reported.
#ifndef TROUPE_SCHEDULER_TYPES_H_
#define TROUPE_SCHEDULER_TYPES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace troupe::scheduler {

// Resource amounts are doubles at the API and fixed point inside (1/10000 of a unit, as Ray
// does), so that allocate followed by release restores a node's free amount exactly.
inline constexpr int64_t kResourceScale = 10000;

// Named resources: "cpu", "gpu", "memory" (bytes or GiB: the caller's unit) or any custom name.
using ResourceMap = std::map<std::string, double>;
// Node labels: "zone" -> "a", "spot" -> "true", "instance" -> "p4d.24xlarge", ...
using LabelMap = std::map<std::string, std::string>;

// A node whose "spot" label is "true" is preemptible; any other value, or none, is on-demand.
inline constexpr char kSpotLabel[] = "spot";
inline constexpr char kZoneLabel[] = "zone";

enum class NodeState { kAlive, kDraining, kDead };

struct NodeSpec {
  std::string name;  // unique among the nodes that are not dead
  ResourceMap resources;
  LabelMap labels;
};

// One term of a label selector; a selector matches a node when all its terms do.
struct LabelTerm {
  enum class Op { kIn, kNotIn };
  std::string key;
  Op op = Op::kIn;
  std::vector<std::string> values;  // kIn: the node's value is one of these (absent: no match)
};                                  // kNotIn: it is none of these (absent: match)

// Soft preference between spot and on-demand nodes: the preferred kind is tried first and the
// other only when no preferred node fits. Coordinators and checkpoint writers should ask for
// kPreferOnDemand, workers may ask for kPreferSpot. A hard requirement is a LabelTerm on "spot".
enum class SpotPreference { kNone, kPreferOnDemand, kPreferSpot };

// kPack: best fit (the feasible node with the least free of the request's scarcest resource).
// kSpread: least loaded (the feasible node with the lowest utilisation of that resource).
// kStrictPack / kStrictSpread apply to placement groups only.
enum class Strategy { kPack, kSpread, kStrictPack, kStrictSpread };
const char* StrategyName(Strategy strategy);

// Hard (anti-)affinity to another actor's failure domain: domain_key "" is the node itself,
// otherwise a label key such as "zone" (a node without that label is a domain of its own).
struct ActorAffinity {
  std::string actor;
  bool anti = false;       // anti: never share the domain (e.g. replicas of one shard)
  std::string domain_key;  // "" (node) or a label key
};

struct ActorRequest {
  std::string actor;  // unique among placed actors
  ResourceMap demands;
  std::vector<LabelTerm> selector;
  std::vector<ActorAffinity> affinity;
  Strategy strategy = Strategy::kPack;  // kPack or kSpread
  SpotPreference spot = SpotPreference::kNone;
  // Run inside a placement group: the actor takes its demands from a bundle's reservation
  // (not from the node's free resources) and moves with the bundle. bundle -1: the first
  // bundle with room. Strategy and spot preference do not apply; selector and affinity must
  // hold on the bundle's node.
  std::string group;
  int bundle = -1;
};

// A placement group is gang-scheduled: all bundles are placed or none is.
struct PlacementGroupRequest {
  std::string group;                 // unique among live groups
  std::vector<ResourceMap> bundles;  // bundle i reserves bundles[i] on one node
  Strategy strategy = Strategy::kPack;
  std::string domain_key;           // failure domain for the strict strategies: "" or "zone"
  std::vector<LabelTerm> selector;  // applies to every bundle
  SpotPreference spot = SpotPreference::kNone;
};

// Why something could not be placed. retry_can_help says whether waiting for resources to be
// released can help (true: busy) or not (false: no node could ever fit, e.g. gpu=8 while the
// largest alive node has 4 GPUs; only new nodes would).
struct Unschedulable {
  std::string reason;
  bool retry_can_help = false;
  // ResourceExhausted when retry can help, FailedPrecondition otherwise.
  [[nodiscard]] absl::Status ToStatus() const;
};

struct ActorDecision {
  std::string node;                            // where the actor runs, when placed
  std::optional<Unschedulable> unschedulable;  // set when it is not placed
  bool placed() const { return !unschedulable.has_value(); }
};

struct GroupDecision {
  std::vector<std::string> bundle_nodes;       // node of bundle i, when placed
  std::optional<Unschedulable> unschedulable;  // set when nothing was placed
  bool placed() const { return !unschedulable.has_value(); }
};

// What RemoveNodes did. Only actors and bundles on the dead nodes appear here; nothing else
// moved. An actor or group it could not re-place is no longer held by the scheduler.
struct RescheduleReport {
  struct MovedActor {
    std::string actor, from, to;
  };
  struct LostActor {
    std::string actor, from;
    Unschedulable why;
  };
  struct RepairedGroup {
    std::string group;
    std::vector<int> bundles;            // the bundle indices that moved
    std::vector<std::string> new_nodes;  // their new nodes, same order
  };
  struct BrokenGroup {
    std::string group;
    Unschedulable why;  // the whole group was released (gang: never silently partial)
  };
  std::vector<MovedActor> moved;
  std::vector<LostActor> lost;
  std::vector<RepairedGroup> repaired;
  std::vector<BrokenGroup> broken;
};

// Read-only view of one node, for tests, the simulator and the head's status page.
struct NodeView {
  std::string name;
  NodeState state = NodeState::kAlive;
  ResourceMap total;
  ResourceMap free;
  LabelMap labels;
  int actors = 0;
  int bundles = 0;
};

}  // namespace troupe::scheduler

#endif  // TROUPE_SCHEDULER_TYPES_H_
