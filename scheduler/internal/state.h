// Private: the scheduler's state (nodes, index, actors, groups) and the placement core shared by
// the single-actor path (scheduler.cc, placer.cc), placement groups and rescheduling
// (groups.cc), and the Unschedulable diagnosis (diagnose.cc).
#ifndef TROUPE_SCHEDULER_INTERNAL_STATE_H_
#define TROUPE_SCHEDULER_INTERNAL_STATE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "internal/block_list.h"
#include "troupe/scheduler/scheduler.h"
#include "troupe/scheduler/types.h"

namespace troupe::scheduler::internal {

inline constexpr int kOnDemand = 0;
inline constexpr int kSpot = 1;
inline constexpr int kNodeDomain = -1;  // domain key id meaning "the node itself"

// A request's resource demands in fixed point, by resource id (ascending).
struct Demand {
  std::vector<std::pair<int, int64_t>> items;
  // The resource the index orders by (see ChoosePrimary); -1 when nothing is demanded.
  // Refreshed by FindBest and BestAmong before every decision, as new nodes may change it.
  mutable int primary = -1;
  mutable int64_t primary_amount = 0;
  std::string unknown_resource;  // a demanded resource no node has ever offered
};

struct CompiledTerm {
  int key = -1;  // -1: no node has this label key
  LabelTerm::Op op = LabelTerm::Op::kIn;
  std::vector<int> values;  // interned; values no node has are dropped
};

// Hard constraints on the candidate nodes, checked by both placers alike.
struct Filter {
  std::vector<CompiledTerm> selector;
  int required_node = -1;
  std::vector<std::pair<int, int>> required_domains;  // (domain key id, domain value)
  std::vector<std::pair<int, int>> excluded_domains;
  absl::flat_hash_set<uint32_t> excluded_nodes;
  std::string description;  // human text of the selector and affinity, for reasons
};

struct NodeRec {
  std::string name;
  NodeState state = NodeState::kAlive;
  int spot_class = kOnDemand;
  bool indexed = false;              // present in the index (alive and not hidden)
  bool hidden = false;               // temporarily out of the index during a group placement
  std::vector<int64_t> total, free;  // by resource id; shorter vectors mean 0
  std::vector<int> labels;           // label value id by label key id; -1 absent
  LabelMap label_map;
  absl::flat_hash_set<uint32_t> actors;
  absl::flat_hash_set<uint64_t> bundles;  // group handle << 32 | bundle index

  int64_t Total(int r) const { return r < static_cast<int>(total.size()) ? total[r] : 0; }
  int64_t Free(int r) const { return r < static_cast<int>(free.size()) ? free[r] : 0; }
  int Label(int key) const {
    return key >= 0 && key < static_cast<int>(labels.size()) ? labels[key] : -1;
  }
};

struct ActorRec {
  bool live = false;
  std::string id;
  ActorRequest request;
  Demand demand;
  int node = -1;
  int group = -1;  // inside a placement group's bundle, or -1
  int bundle = -1;
  uint64_t seq = 0;
};

struct GroupRec {
  bool live = false;
  std::string id;
  PlacementGroupRequest request;
  std::vector<Demand> demands;
  std::vector<int> bundle_node;                   // -1 while unplaced
  std::vector<std::vector<int64_t>> bundle_free;  // reservation left for actors, by resource id
  std::vector<absl::flat_hash_set<uint32_t>> bundle_actors;
  uint64_t seq = 0;
};

// Nodes ordered by free amount (best fit) and by utilisation (least loaded), per resource and
// per spot class, in block lists (block_list.h) that carry each node's first free amounts. Only
// nodes with a non-zero total of the resource appear.
class Index {
 public:
  using FreeSet = BlockList<int64_t>;
  using UtilSet = BlockList<double>;

  void InsertNode(const NodeRec& node, uint32_t id);
  void EraseNode(const NodeRec& node, uint32_t id);
  void InsertResource(const NodeRec& node, uint32_t id, int r);
  void EraseResource(const NodeRec& node, uint32_t id, int r);
  // Rewrites the free-amount copies in resource r's entries (whose keys did not change).
  void RefreshHot(const NodeRec& node, uint32_t id, int r);
  static HotFree Hot(const NodeRec& node);

  const FreeSet& by_free(int r, int cls) const { return by_free_[r][cls]; }
  const UtilSet& by_util(int r, int cls) const { return by_util_[r][cls]; }
  int resources() const { return static_cast<int>(by_free_.size()); }
  static double Util(const NodeRec& node, int r);

 private:
  void Grow(int r);
  std::vector<std::array<FreeSet, 2>> by_free_;
  std::vector<std::array<UtilSet, 2>> by_util_;
};

class State {
 public:
  explicit State(Scheduler::Options options) : options_(options) {}

  // ---- interning and compilation (placer.cc) ----
  [[nodiscard]] absl::StatusOr<Demand> CompileDemand(const ResourceMap& demands,
                                                     const std::string& what) const;
  Demand SumDemands(const std::vector<const Demand*>& parts) const;
  void ChoosePrimary(const Demand& demand) const;
  Filter CompileSelector(const std::vector<LabelTerm>& selector);
  int InternLabelKey(const std::string& key);
  int DomainOf(uint32_t node, int key) const;

  // ---- the placement core (placer.cc) ----
  bool Fits(const NodeRec& node, const Demand& demand) const;
  bool FitsWhenIdle(const NodeRec& node, const Demand& demand) const;
  bool Passes(uint32_t node, const Filter& filter) const;
  // The best alive node for the demand under the strategy (kPack or kSpread), or -1.
  int FindBest(const Demand& demand, Strategy strategy, const Filter& filter,
               SpotPreference spot) const;
  // The first `count` distinct alive nodes in kSpread order that fit the demand and pass the
  // filter (fewer if there are not enough), honouring the spot preference: what `count`
  // FindBest calls would pick if each pick were then excluded. Indexed placer only.
  std::vector<uint32_t> FirstSpread(const Demand& demand, const Filter& filter, SpotPreference spot,
                                    size_t count) const;
  // Among the given nodes only (a group's own nodes), the best one, or -1.
  int BestAmong(const std::vector<uint32_t>& nodes, const Demand& demand, Strategy strategy,
                const Filter& filter) const;
  void Adjust(uint32_t node, const Demand& demand, int sign);
  void Allocate(uint32_t node, const Demand& demand);
  void Release(uint32_t node, const Demand& demand);
  void Hide(uint32_t node);
  void Unhide(uint32_t node);

  // ---- single actors (scheduler.cc) ----
  // Builds the filter for an actor request: selector plus affinity. Sets `why` when the
  // affinity itself cannot be met.
  Filter ActorFilter(const ActorRequest& request, std::optional<Unschedulable>& why);
  // Places (or explains); on success the actor record is updated and resources allocated.
  std::optional<Unschedulable> PlaceActorRec(uint32_t handle);
  std::optional<Unschedulable> PlaceInBundle(uint32_t handle, const Filter& filter);
  // Forgets an actor (its resources must already be released or gone with its node).
  void EraseActor(uint32_t handle);

  // ---- placement groups and rescheduling (groups.cc) ----
  std::optional<Unschedulable> PlaceBundles(uint32_t group, std::vector<int> todo);
  void AssignBundle(uint32_t group, int bundle, uint32_t node);
  void UnassignBundle(uint32_t group, int bundle);
  void DropGroup(uint32_t group);
  [[nodiscard]] absl::StatusOr<RescheduleReport> RemoveNodes(const std::vector<std::string>& names);

  // ---- reasons (diagnose.cc) ----
  Unschedulable Diagnose(const Demand& demand, const Filter& filter) const;
  bool GroupFeasibleWhenIdle(const GroupRec& group, const Filter& filter) const;
  std::string FormatDemand(const Demand& demand) const;
  std::string FormatAmount(int64_t fixed) const;

  // ---- invariants and views (invariants.cc) ----
  [[nodiscard]] absl::Status CheckInvariants() const;
  std::string DebugString() const;
  NodeView View(uint32_t node) const;

  Scheduler::Options options_;
  std::vector<NodeRec> nodes_;
  absl::flat_hash_map<std::string, uint32_t> node_by_name_;  // nodes that are not dead
  int alive_ = 0;
  std::vector<std::string> resource_names_;
  absl::flat_hash_map<std::string, int> resource_ids_;
  std::vector<int64_t> max_total_;  // largest total ever offered, by resource id
  std::vector<std::string> label_keys_, label_values_;
  absl::flat_hash_map<std::string, int> label_key_ids_, label_value_ids_;
  Index index_;

  std::vector<ActorRec> actors_;
  std::vector<uint32_t> free_actor_slots_;
  absl::flat_hash_map<std::string, uint32_t> actor_by_id_;
  std::vector<GroupRec> groups_;
  std::vector<uint32_t> free_group_slots_;
  absl::flat_hash_map<std::string, uint32_t> group_by_id_;
  uint64_t next_seq_ = 1;
};

}  // namespace troupe::scheduler::internal

#endif  // TROUPE_SCHEDULER_INTERNAL_STATE_H_
