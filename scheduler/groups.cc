// Placement groups (gang: all bundles or none) and rescheduling after node loss.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal/state.h"
#include "troupe/base/status_macros.h"
#include "troupe/scheduler/scheduler.h"

namespace troupe::scheduler {
namespace internal {
namespace {

// Bundles in decreasing size (relative to the largest node) first: first-fit decreasing.
void OrderBySize(const State& s, const GroupRec& g, std::vector<int>& todo) {
  auto weight = [&](int b) {
    double w = 0;
    for (const auto& [r, amount] : g.demands[b].items) {
      w = std::max(w, static_cast<double>(amount) / static_cast<double>(s.max_total_[r]));
    }
    return w;
  };
  std::stable_sort(todo.begin(), todo.end(), [&](int a, int b) { return weight(a) > weight(b); });
}

}  // namespace

void State::AssignBundle(uint32_t group, int bundle, uint32_t node) {
  GroupRec& g = groups_[group];
  g.bundle_node[bundle] = static_cast<int>(node);
  Allocate(node, g.demands[bundle]);
  nodes_[node].bundles.insert(static_cast<uint64_t>(group) << 32 | static_cast<uint32_t>(bundle));
}

void State::UnassignBundle(uint32_t group, int bundle) {
  GroupRec& g = groups_[group];
  const int node = g.bundle_node[bundle];
  if (node < 0) return;
  Release(static_cast<uint32_t>(node), g.demands[bundle]);
  nodes_[node].bundles.erase(static_cast<uint64_t>(group) << 32 | static_cast<uint32_t>(bundle));
  g.bundle_node[bundle] = -1;
}

void State::DropGroup(uint32_t group) {
  GroupRec& g = groups_[group];
  for (int b = 0; b < static_cast<int>(g.bundle_node.size()); ++b) {
    for (uint32_t a : g.bundle_actors[b]) EraseActor(a);
    UnassignBundle(group, b);
  }
  group_by_id_.erase(g.id);
  g = GroupRec{};
  free_group_slots_.push_back(group);
}

namespace {

// One PlaceBundles call: the group's nodes so far, what this call placed (to undo on failure)
// and the nodes hidden from the index while it runs. Each strategy returns the bundle that
// found no node, or -1.
class Attempt {
 public:
  Attempt(State& s, uint32_t group, Filter base)
      : s_(s), group_(group), g_(s.groups_[group]), base_(std::move(base)), f_(base_) {
    const PlacementGroupRequest& req = g_.request;
    key_ = req.domain_key.empty() ? kNodeDomain : s_.InternLabelKey(req.domain_key);
    for (int n : g_.bundle_node) {
      if (n >= 0 && !Used(n)) used_.push_back(static_cast<uint32_t>(n));
    }
  }
  ~Attempt() {
    for (uint32_t n : hidden_) s_.Unhide(n);
  }

  int Run(const std::vector<int>& todo) {
    switch (g_.request.strategy) {
      case Strategy::kSpread:
        return Spread(todo, /*strict=*/false);
      case Strategy::kStrictSpread:
        return Spread(todo, /*strict=*/true);
      case Strategy::kPack:
        return Pack(todo);
      case Strategy::kStrictPack:
        return key_ == kNodeDomain ? StrictPackOnNode(todo) : StrictPackInDomain(todo);
    }
    return todo.front();
  }
  void Undo() {
    for (int b : placed_) s_.UnassignBundle(group_, b);
    placed_.clear();
  }
  int key() const { return key_; }
  size_t used() const { return used_.size(); }

 private:
  bool Used(int n) const { return std::find(used_.begin(), used_.end(), n) != used_.end(); }
  const Demand& demand(int b) const { return g_.demands[b]; }
  SpotPreference spot() const { return g_.request.spot; }

  void Place(int b, int n) {
    s_.AssignBundle(group_, b, static_cast<uint32_t>(n));
    placed_.push_back(b);
    if (!Used(n)) used_.push_back(static_cast<uint32_t>(n));
  }
  // Rules the node's failure domain out for the next bundles. By node, the node also leaves
  // the index until the call ends, so a 1,024-bundle group never rescans its own nodes.
  void Exclude(uint32_t n) {
    if (key_ == kNodeDomain) {
      f_.excluded_nodes.insert(n);
      s_.Hide(n);
      hidden_.push_back(n);
    } else {
      f_.excluded_domains.push_back({key_, s_.DomainOf(n, key_)});
    }
  }

  // STRICT_SPREAD over nodes with one bundle shape, on the indexed placer: placing a bundle
  // changes only the node it lands on, which is then excluded, so the greedy choices are simply
  // the first fitting nodes in index order. One scan instead of a query per bundle.
  bool BatchSpreadApplies(const std::vector<int>& todo) const {
    if (s_.options_.placer != Scheduler::Placer::kIndexed || key_ != kNodeDomain) return false;
    for (int b : todo) {
      if (demand(b).items != demand(todo.front()).items) return false;
    }
    return true;
  }
  int BatchSpread(const std::vector<int>& todo) {
    for (uint32_t n : used_) f_.excluded_nodes.insert(n);
    const std::vector<uint32_t> picks =
        s_.FirstSpread(demand(todo.front()), f_, spot(), todo.size());
    for (size_t i = 0; i < picks.size(); ++i) Place(todo[i], static_cast<int>(picks[i]));
    return picks.size() == todo.size() ? -1 : todo[picks.size()];
  }

  // Least-loaded nodes outside the group's domains first; SPREAD then reuses its own nodes.
  int Spread(const std::vector<int>& todo, bool strict) {
    if (strict && BatchSpreadApplies(todo) && demand(todo.front()).primary >= 0) {
      return BatchSpread(todo);
    }
    for (uint32_t n : used_) Exclude(n);
    for (int b : todo) {
      int n = s_.FindBest(demand(b), Strategy::kSpread, f_, spot());
      if (n < 0 && !strict) n = s_.BestAmong(used_, demand(b), Strategy::kSpread, base_);
      if (n < 0) return b;
      if (!Used(n)) Exclude(static_cast<uint32_t>(n));  // before allocating: no index update
      Place(b, n);
    }
    return -1;
  }

  // Best fit among the group's own nodes first, then in the cluster.
  int Pack(const std::vector<int>& todo) {
    for (int b : todo) {
      int n = s_.BestAmong(used_, demand(b), Strategy::kPack, base_);
      if (n < 0) n = s_.FindBest(demand(b), Strategy::kPack, base_, spot());
      if (n < 0) return b;
      Place(b, n);
    }
    return -1;
  }

  // All bundles on one node: one best-fit decision for their sum.
  int StrictPackOnNode(const std::vector<int>& todo) {
    if (!used_.empty()) f_.required_node = static_cast<int>(used_.front());
    std::vector<const Demand*> parts;
    for (int b : todo) parts.push_back(&demand(b));
    const int n = s_.FindBest(s_.SumDemands(parts), Strategy::kPack, f_, spot());
    if (n < 0) return todo.front();
    for (int b : todo) Place(b, n);
    return -1;
  }

  // All bundles in one labelled domain: the survivors' one, or the first (by label) that fits.
  int StrictPackInDomain(const std::vector<int>& todo) {
    std::vector<int> domains;
    if (!used_.empty()) {
      domains.push_back(s_.DomainOf(used_.front(), key_));
    } else {
      for (const NodeRec& node : s_.nodes_) {
        const int d = node.Label(key_);
        if (node.state == NodeState::kAlive && d >= 0 &&
            std::find(domains.begin(), domains.end(), d) == domains.end()) {
          domains.push_back(d);
        }
      }
      std::sort(domains.begin(), domains.end());
    }
    int failed = todo.front();
    for (int d : domains) {
      f_.required_domains = {{key_, d}};
      failed = -1;
      for (int b : todo) {
        const int n = s_.FindBest(demand(b), Strategy::kPack, f_, spot());
        if (n < 0) {
          failed = b;
          break;
        }
        Place(b, n);
      }
      if (failed < 0) return -1;
      Undo();
    }
    return failed;
  }

  State& s_;
  const uint32_t group_;
  GroupRec& g_;
  const Filter base_;
  Filter f_;
  int key_ = kNodeDomain;
  std::vector<uint32_t> used_;  // nodes holding bundles of this group, in first-use order
  std::vector<int> placed_;
  std::vector<uint32_t> hidden_;
};

}  // namespace

// Places the bundles in `todo` next to those of the group already placed, under the group's
// strategy. All or nothing: on failure every bundle placed by this call is taken back.
std::optional<Unschedulable> State::PlaceBundles(uint32_t group, std::vector<int> todo) {
  GroupRec& g = groups_[group];
  const PlacementGroupRequest& req = g.request;
  for (int b : todo) {
    if (!g.demands[b].unknown_resource.empty()) {
      return Unschedulable{absl::StrCat("bundle ", b, " needs resource '",
                                        g.demands[b].unknown_resource, "', which no node has"),
                           false};
    }
  }
  OrderBySize(*this, g, todo);
  const Filter base = CompileSelector(req.selector);
  int failed, key;
  size_t used;
  {
    Attempt attempt(*this, group, base);
    failed = attempt.Run(todo);
    if (failed >= 0) attempt.Undo();
    key = attempt.key();
    used = attempt.used();
  }  // unhides before anything else reads the index
  if (failed < 0) return std::nullopt;
  // STRICT_PACK on one node needs the sum of the bundles on that node: explain that.
  const bool whole = req.strategy == Strategy::kStrictPack && key == kNodeDomain;
  std::vector<const Demand*> parts;
  for (const Demand& d : g.demands) parts.push_back(&d);
  Unschedulable why = Diagnose(whole ? SumDemands(parts) : g.demands[failed], base);
  why.reason = absl::StrCat(
      StrategyName(req.strategy), " group '", g.id, "' of ", g.demands.size(), " bundles: bundle ",
      failed, " found no node",
      req.strategy == Strategy::kStrictSpread
          ? absl::StrCat(" outside the ", used, " ", key == kNodeDomain ? "node" : req.domain_key,
                         " domains already used")
          : "",
      "; ", why.reason);
  why.retry_can_help = GroupFeasibleWhenIdle(g, base);
  return why;
}

namespace {

// (creation sequence, handle) pairs: sorted, they list actors or groups in creation order, so
// reports do not depend on hash-set iteration order.
using BySeq = std::vector<std::pair<uint64_t, uint32_t>>;

// What the dead nodes held: actors outside groups, and groups with a bundle there.
struct Lost {
  BySeq actors, groups;
};

// A group's bundles that were on dead nodes, now unplaced, and the node each was on.
struct LostBundles {
  std::vector<int> todo;
  std::vector<std::string> from;
};

absl::StatusOr<std::vector<uint32_t>> ResolveNodes(const State& s,
                                                   const std::vector<std::string>& names) {
  std::vector<uint32_t> dead;
  for (const std::string& name : names) {
    auto it = s.node_by_name_.find(name);
    if (it == s.node_by_name_.end()) return absl::NotFoundError("RemoveNodes: no node " + name);
    if (std::find(dead.begin(), dead.end(), it->second) == dead.end()) dead.push_back(it->second);
  }
  return dead;
}

// Takes the nodes out of the cluster. What they held keeps the node it was on, encoded as
// -(node + 2), until it is re-placed or reported.
Lost MarkDead(State& s, const std::vector<uint32_t>& dead) {
  Lost lost;
  for (uint32_t n : dead) {
    NodeRec& node = s.nodes_[n];
    if (node.indexed) s.index_.EraseNode(node, n);
    if (node.state == NodeState::kAlive) --s.alive_;
    node.indexed = false;
    node.state = NodeState::kDead;
    s.node_by_name_.erase(node.name);
    for (uint32_t a : node.actors) {
      lost.actors.push_back({s.actors_[a].seq, a});
      s.actors_[a].node = -(static_cast<int>(n) + 2);
    }
    for (uint64_t gb : node.bundles) {
      const uint32_t g = static_cast<uint32_t>(gb >> 32);
      s.groups_[g].bundle_node[static_cast<uint32_t>(gb)] = -(static_cast<int>(n) + 2);
      lost.groups.push_back({s.groups_[g].seq, g});
    }
    node.actors.clear();
    node.bundles.clear();
  }
  std::sort(lost.actors.begin(), lost.actors.end());
  std::sort(lost.groups.begin(), lost.groups.end());
  lost.groups.erase(std::unique(lost.groups.begin(), lost.groups.end()), lost.groups.end());
  return lost;
}

LostBundles DetachLostBundles(State& s, GroupRec& group) {
  LostBundles lost;
  for (int b = 0; b < static_cast<int>(group.bundle_node.size()); ++b) {
    if (group.bundle_node[b] < -1) {
      lost.from.push_back(s.nodes_[-group.bundle_node[b] - 2].name);
      group.bundle_node[b] = -1;
      lost.todo.push_back(b);
    }
  }
  return lost;
}

// The actors in bundles [first, last) of the group, in creation order.
BySeq BundleActorsBySeq(const State& s, const GroupRec& group, size_t first, size_t last) {
  BySeq inside;
  for (size_t b = first; b < last; ++b) {
    for (uint32_t a : group.bundle_actors[b]) inside.push_back({s.actors_[a].seq, a});
  }
  std::sort(inside.begin(), inside.end());
  return inside;
}

// Reports the group broken and drops it; its actors go with it, each reported from where it ran.
void BreakGroup(State& s, uint32_t g, const LostBundles& lost, Unschedulable why,
                RescheduleReport& report) {
  const GroupRec& group = s.groups_[g];
  std::vector<std::string> where = lost.from;
  std::sort(where.begin(), where.end());
  where.erase(std::unique(where.begin(), where.end()), where.end());
  why.reason = absl::StrCat("lost ", lost.todo.size(), " bundle(s) on ", absl::StrJoin(where, ","),
                            " and could not re-place them: ", why.reason);
  for (const auto& [aseq, a] : BundleActorsBySeq(s, group, 0, group.bundle_actors.size())) {
    const int n = s.actors_[a].node;
    const std::string was = n >= 0 ? s.nodes_[n].name : "";
    report.lost.push_back(
        {s.actors_[a].id, was,
         Unschedulable{absl::StrCat("its placement group '", group.id, "' broke: ", why.reason),
                       why.retry_can_help}});
  }
  report.broken.push_back({group.id, std::move(why)});
  s.DropGroup(g);
}

// The re-placed bundles' actors follow them to their new nodes.
void RecordRepairedGroup(State& s, const GroupRec& group, const LostBundles& lost,
                         RescheduleReport& report) {
  RescheduleReport::RepairedGroup repaired{group.id, lost.todo, {}};
  for (size_t i = 0; i < lost.todo.size(); ++i) {
    const int b = lost.todo[i];
    repaired.new_nodes.push_back(s.nodes_[group.bundle_node[b]].name);
    for (const auto& [aseq, a] : BundleActorsBySeq(s, group, b, b + 1)) {
      s.actors_[a].node = group.bundle_node[b];
      report.moved.push_back({s.actors_[a].id, lost.from[i], repaired.new_nodes.back()});
    }
  }
  report.repaired.push_back(std::move(repaired));
}

void RepairGroup(State& s, uint32_t g, RescheduleReport& report) {
  const LostBundles lost = DetachLostBundles(s, s.groups_[g]);
  std::optional<Unschedulable> why = s.PlaceBundles(g, lost.todo);
  if (why) {
    BreakGroup(s, g, lost, *std::move(why), report);
    return;
  }
  RecordRepairedGroup(s, s.groups_[g], lost, report);
}

// Re-places an actor that ran outside groups on a dead node, or reports it lost and forgets it.
void ReplaceLostActor(State& s, uint32_t a, RescheduleReport& report) {
  ActorRec& actor = s.actors_[a];
  const std::string from = s.nodes_[-actor.node - 2].name;
  actor.node = -1;
  std::optional<Unschedulable> why = s.PlaceActorRec(a);
  if (why) {
    report.lost.push_back({actor.id, from, *std::move(why)});
    s.actor_by_id_.erase(actor.id);
    actor = ActorRec{};
    s.free_actor_slots_.push_back(a);
    return;
  }
  report.moved.push_back({actor.id, from, s.nodes_[actor.node].name});
}

}  // namespace

absl::StatusOr<RescheduleReport> State::RemoveNodes(const std::vector<std::string>& names) {
  TROUPE_ASSIGN_OR_RETURN(std::vector<uint32_t> dead, ResolveNodes(*this, names));
  const Lost lost = MarkDead(*this, dead);
  RescheduleReport report;
  for (const auto& [seq, g] : lost.groups) RepairGroup(*this, g, report);
  for (const auto& [seq, a] : lost.actors) ReplaceLostActor(*this, a, report);
  return report;
}

}  // namespace internal

absl::StatusOr<GroupDecision> Scheduler::CreatePlacementGroup(const PlacementGroupRequest& req) {
  internal::State& s = *state_;
  const std::string what = "CreatePlacementGroup '" + req.group + "'";
  if (req.group.empty()) return absl::InvalidArgumentError(what + ": group id is empty");
  if (s.group_by_id_.contains(req.group)) {
    return absl::InvalidArgumentError(what + ": group already exists");
  }
  if (req.bundles.empty()) return absl::InvalidArgumentError(what + ": bundles is empty");
  internal::GroupRec g;
  for (size_t b = 0; b < req.bundles.size(); ++b) {
    absl::StatusOr<internal::Demand> d =
        s.CompileDemand(req.bundles[b], absl::StrCat(what, " bundle ", b));
    if (!d.ok()) return d.status();
    g.demands.push_back(*std::move(d));
  }
  g.live = true;
  g.id = req.group;
  g.request = req;
  g.bundle_node.assign(req.bundles.size(), -1);
  g.bundle_actors.resize(req.bundles.size());
  for (const internal::Demand& d : g.demands) {
    std::vector<int64_t> left(d.items.empty() ? 0 : d.items.back().first + 1, 0);
    for (const auto& [r, amount] : d.items) left[r] = amount;
    g.bundle_free.push_back(std::move(left));
  }
  g.seq = s.next_seq_++;
  uint32_t handle;
  if (!s.free_group_slots_.empty()) {
    handle = s.free_group_slots_.back();
    s.free_group_slots_.pop_back();
    s.groups_[handle] = std::move(g);
  } else {
    handle = static_cast<uint32_t>(s.groups_.size());
    s.groups_.push_back(std::move(g));
  }
  s.group_by_id_[req.group] = handle;
  std::vector<int> all(req.bundles.size());
  for (size_t b = 0; b < all.size(); ++b) all[b] = static_cast<int>(b);
  GroupDecision decision;
  decision.unschedulable = s.PlaceBundles(handle, std::move(all));
  if (decision.unschedulable) {
    s.DropGroup(handle);
    return decision;
  }
  for (int n : s.groups_[handle].bundle_node) decision.bundle_nodes.push_back(s.nodes_[n].name);
  return decision;
}

absl::Status Scheduler::RemovePlacementGroup(const std::string& group) {
  auto it = state_->group_by_id_.find(group);
  if (it == state_->group_by_id_.end()) {
    return absl::NotFoundError("RemovePlacementGroup: no group " + group);
  }
  state_->DropGroup(it->second);
  return absl::OkStatus();
}

std::optional<std::vector<std::string>> Scheduler::GroupNodes(const std::string& group) const {
  auto it = state_->group_by_id_.find(group);
  if (it == state_->group_by_id_.end()) return std::nullopt;
  std::vector<std::string> nodes;
  for (int n : state_->groups_[it->second].bundle_node) nodes.push_back(state_->nodes_[n].name);
  return nodes;
}

std::optional<PlacementGroupRequest> Scheduler::GroupRequest(const std::string& group) const {
  auto it = state_->group_by_id_.find(group);
  if (it == state_->group_by_id_.end()) return std::nullopt;
  return state_->groups_[it->second].request;
}

std::vector<std::string> Scheduler::GroupIds() const {
  std::vector<std::pair<uint64_t, std::string>> order;
  for (const auto& g : state_->groups_) {
    if (g.live) order.push_back({g.seq, g.id});
  }
  std::sort(order.begin(), order.end());
  std::vector<std::string> ids;
  for (auto& [seq, id] : order) ids.push_back(std::move(id));
  return ids;
}

}  // namespace troupe::scheduler
