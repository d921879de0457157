// The scheduler: a cluster view plus requests in, placements or Unschedulable out. Pure logic
// (no I/O, no clock, no threads); the runtime's head owns one and calls it for remote spawn and
// supervisor restarts, and the simulator in scheduler/sim/ drives it at 10,000 nodes.
//
//   Scheduler s;
//   CHECK_OK(s.AddNode({"node-1", {{"cpu", 32}, {"gpu", 4}}, {{"zone", "a"}}}));
//   CHECK_OK(s.AddNode({"node-2", {{"cpu", 32}, {"gpu", 4}}, {{"zone", "b"}}}));
//   ActorRequest req;
//   req.actor = "w0";
//   req.demands = {{"gpu", 8}};
//   absl::StatusOr<ActorDecision> d = s.PlaceActor(req);
//   // d->unschedulable->reason: "needs gpu=8; no alive node could ever fit it: the largest
//   //   is node-1 with gpu=4"; d->unschedulable->retry_can_help == false.
//   PlacementGroupRequest pg;
//   pg.group = "pg";
//   pg.bundles = {{{"gpu", 1}}, {{"gpu", 1}}};
//   pg.strategy = Strategy::kStrictSpread;
//   absl::StatusOr<GroupDecision> g = s.CreatePlacementGroup(pg);  // {"node-1", "node-2"}
//   ActorRequest member;                       // an actor inside bundle 1 of the group
//   member.actor = "w1";
//   member.demands = {{"gpu", 1}};
//   member.group = "pg";
//   member.bundle = 1;
//   d = s.PlaceActor(member);
//   auto report = s.RemoveNodes({"node-1"});  // re-places only what node-1 held
//
// Lifecycle of an actor (a bundle of a group follows the same arrows, the group as a whole; an
// actor inside a bundle moves with its bundle and is lost with its group):
//
//   PlaceActor ──▶ placed on node N ──ReleaseActor──▶ gone
//        │               │
//        │               └─ N dies (RemoveNodes) ─▶ re-placed on M  (report.moved)
//        │                                      └─▶ gone, reason    (report.lost)
//        └──▶ Unschedulable{reason, retry_can_help}: nothing held; the caller may retry later.
//
// Placement uses an index (per resource, per spot/on-demand class: nodes ordered by free amount
// for kPack and by utilisation for kSpread), so a decision costs O(log nodes) in the usual case.
// Options::placer = kBruteForce scores every node instead; it makes the same decisions and serves
// as the test oracle and the benchmark's baseline.
//
// Thread safety: none. One thread (the head's scheduler actor) owns a Scheduler.
#ifndef TROUPE_SCHEDULER_SCHEDULER_H_
#define TROUPE_SCHEDULER_SCHEDULER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/scheduler/types.h"

namespace troupe::scheduler {

namespace internal {
class State;
}  // namespace internal

class Scheduler {
 public:
  enum class Placer { kIndexed, kBruteForce };
  struct Options {
    Placer placer = Placer::kIndexed;
  };

  Scheduler();
  explicit Scheduler(Options options);
  ~Scheduler();
  Scheduler(Scheduler&&) noexcept;
  Scheduler& operator=(Scheduler&&) noexcept;

  // ---- cluster view ----
  // InvalidArgument for an empty or duplicate name, or a negative/non-finite amount.
  [[nodiscard]] absl::Status AddNode(const NodeSpec& node);
  // alive -> draining: keeps what it holds, takes nothing new. NotFound for an unknown node.
  [[nodiscard]] absl::Status DrainNode(const std::string& node);
  [[nodiscard]] absl::Status UndrainNode(const std::string& node);
  // -> dead, then re-places only the actors and bundles those nodes held (groups first, then
  // actors, each in the order they were first placed). Unknown names: NotFound, nothing changes.
  [[nodiscard]] absl::StatusOr<RescheduleReport> RemoveNodes(const std::vector<std::string>& nodes);

  // ---- requests ----
  // InvalidArgument for a bad request (empty or duplicate id, bad amount, bad strategy).
  // Unschedulable is not an error: it is a decision, returned inside the value.
  [[nodiscard]] absl::StatusOr<ActorDecision> PlaceActor(const ActorRequest& request);
  [[nodiscard]] absl::Status ReleaseActor(const std::string& actor);
  [[nodiscard]] absl::StatusOr<GroupDecision> CreatePlacementGroup(
      const PlacementGroupRequest& request);
  // Releases the group's bundles and the actors placed inside them.
  [[nodiscard]] absl::Status RemovePlacementGroup(const std::string& group);

  // ---- views ----
  std::optional<std::string> ActorNode(const std::string& actor) const;
  std::optional<ActorRequest> ActorSpec(const std::string& actor) const;
  std::optional<std::vector<std::string>> GroupNodes(const std::string& group) const;
  std::optional<PlacementGroupRequest> GroupRequest(const std::string& group) const;
  std::optional<NodeView> Node(const std::string& node) const;
  std::vector<std::string> ActorIds() const;  // in placement order
  std::vector<std::string> GroupIds() const;  // in creation order
  int alive_nodes() const;

  // Recomputes every node's free resources from what the actors and bundles hold and checks
  // them against the incremental accounting and the index: Internal on any mismatch,
  // over-commit, or holding on a dead node. O(everything); for tests and the simulator.
  [[nodiscard]] absl::Status CheckInvariants() const;
  std::string DebugString() const;

 private:
  std::unique_ptr<internal::State> state_;
};

}  // namespace troupe::scheduler

#endif  // TROUPE_SCHEDULER_SCHEDULER_H_
