// Scheduler: node lifecycle and single-actor placement; the public API forwards to State.
#include "troupe/scheduler/scheduler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "internal/state.h"

namespace troupe::scheduler {

const char* StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kPack:
      return "PACK";
    case Strategy::kSpread:
      return "SPREAD";
    case Strategy::kStrictPack:
      return "STRICT_PACK";
    case Strategy::kStrictSpread:
      return "STRICT_SPREAD";
  }
  return "?";
}

absl::Status Unschedulable::ToStatus() const {
  return retry_can_help ? absl::ResourceExhaustedError(reason)
                        : absl::FailedPreconditionError(reason);
}

namespace internal {

Filter State::ActorFilter(const ActorRequest& request, std::optional<Unschedulable>& why) {
  Filter f = CompileSelector(request.selector);
  for (const ActorAffinity& a : request.affinity) {
    const int key = a.domain_key.empty() ? kNodeDomain : InternLabelKey(a.domain_key);
    const std::string scope = a.domain_key.empty() ? "node" : a.domain_key;
    if (!f.description.empty()) absl::StrAppend(&f.description, ", ");
    absl::StrAppend(&f.description, a.anti ? "not on the " : "on the ", scope, " of actor '",
                    a.actor, "'");
    auto it = actor_by_id_.find(a.actor);
    if (it == actor_by_id_.end() || actors_[it->second].node < 0) {
      if (!a.anti) {
        why = Unschedulable{absl::StrCat("affinity to actor '", a.actor, "', which is not placed"),
                            /*retry_can_help=*/true};
      }
      continue;
    }
    const uint32_t target = static_cast<uint32_t>(actors_[it->second].node);
    if (key == kNodeDomain && a.anti) {
      f.excluded_nodes.insert(target);
    } else if (key == kNodeDomain) {
      if (f.required_node >= 0 && f.required_node != static_cast<int>(target)) {
        why = Unschedulable{"affinity to actors on two different nodes", true};
      }
      f.required_node = static_cast<int>(target);
    } else if (a.anti) {
      f.excluded_domains.push_back({key, DomainOf(target, key)});
    } else {
      f.required_domains.push_back({key, DomainOf(target, key)});
    }
  }
  return f;
}

std::optional<Unschedulable> State::PlaceActorRec(uint32_t handle) {
  ActorRec& a = actors_[handle];
  if (!a.demand.unknown_resource.empty()) {
    return Unschedulable{
        absl::StrCat("needs resource '", a.demand.unknown_resource, "', which no node has"), false};
  }
  std::optional<Unschedulable> why;
  Filter f = ActorFilter(a.request, why);
  if (why) return why;
  if (!a.request.group.empty()) return PlaceInBundle(handle, f);
  const int n = FindBest(a.demand, a.request.strategy, f, a.request.spot);
  if (n < 0) return Diagnose(a.demand, f);
  a.node = n;
  Allocate(static_cast<uint32_t>(n), a.demand);
  nodes_[n].actors.insert(handle);
  return std::nullopt;
}

std::optional<Unschedulable> State::PlaceInBundle(uint32_t handle, const Filter& f) {
  ActorRec& a = actors_[handle];
  const std::string& name = a.request.group;
  auto it = group_by_id_.find(name);
  if (it == group_by_id_.end()) {
    return Unschedulable{absl::StrCat("placement group '", name,
                                      "' does not exist (not created, removed or broken)"),
                         false};
  }
  GroupRec& g = groups_[it->second];
  const int bundles = static_cast<int>(g.bundle_node.size());
  const int want = a.request.bundle;
  if (want >= bundles) {
    return Unschedulable{
        absl::StrCat("group '", name, "' has ", bundles, " bundles, no bundle ", want), false};
  }
  bool ever = false;  // some candidate bundle reserves enough, on a node the filter accepts
  for (int b = want < 0 ? 0 : want; b < (want < 0 ? bundles : want + 1); ++b) {
    const int n = g.bundle_node[b];
    if (n < 0 || !Passes(static_cast<uint32_t>(n), f)) continue;
    const std::vector<int64_t>& left = g.bundle_free[b];
    bool reserved = true, fits = true;
    for (const auto& [r, amount] : a.demand.items) {
      int64_t total = 0;
      for (const auto& [br, bamount] : g.demands[b].items) total += br == r ? bamount : 0;
      reserved &= total >= amount;
      fits &= r < static_cast<int>(left.size()) && left[r] >= amount;
    }
    ever |= reserved;
    if (!fits || nodes_[n].state != NodeState::kAlive) continue;
    for (const auto& [r, amount] : a.demand.items) g.bundle_free[b][r] -= amount;
    g.bundle_actors[b].insert(handle);
    a.node = n;
    a.group = static_cast<int>(it->second);
    a.bundle = b;
    return std::nullopt;
  }
  const std::string where = want < 0 ? "any bundle" : absl::StrCat("bundle ", want);
  return Unschedulable{
      absl::StrCat("needs ", FormatDemand(a.demand), " inside ", where, " of group '", name, "'",
                   ever ? ": the reservation is taken by other actors (or its node is draining)"
                        : ": no such bundle reserves that much",
                   f.description.empty() ? "" : " on a node with " + f.description),
      ever};
}

void State::EraseActor(uint32_t handle) {
  actor_by_id_.erase(actors_[handle].id);
  actors_[handle] = ActorRec{};
  free_actor_slots_.push_back(handle);
}

}  // namespace internal

using internal::NodeRec;

Scheduler::Scheduler() : Scheduler(Options{}) {}
Scheduler::Scheduler(Options options) : state_(std::make_unique<internal::State>(options)) {}
Scheduler::~Scheduler() = default;
Scheduler::Scheduler(Scheduler&&) noexcept = default;
Scheduler& Scheduler::operator=(Scheduler&&) noexcept = default;

absl::Status Scheduler::AddNode(const NodeSpec& spec) {
  internal::State& s = *state_;
  if (spec.name.empty()) return absl::InvalidArgumentError("AddNode: node.name is empty");
  if (s.node_by_name_.contains(spec.name)) {
    return absl::InvalidArgumentError(absl::StrCat("AddNode: node '", spec.name, "' exists"));
  }
  NodeRec node;
  node.name = spec.name;
  for (const auto& [name, amount] : spec.resources) {
    if (!std::isfinite(amount) || amount < 0 || amount > 1e12) {
      return absl::InvalidArgumentError(absl::StrCat("AddNode '", spec.name, "': resource '", name,
                                                     "' must be finite and >= 0, got ", amount));
    }
  }
  for (const auto& [name, amount] : spec.resources) {
    auto [it, inserted] =
        s.resource_ids_.try_emplace(name, static_cast<int>(s.resource_names_.size()));
    if (inserted) {
      s.resource_names_.push_back(name);
      s.max_total_.push_back(0);
    }
    const int r = it->second;
    if (static_cast<int>(node.total.size()) <= r) {
      node.total.resize(r + 1, 0);
      node.free.resize(r + 1, 0);
    }
    node.total[r] = node.free[r] = std::llround(amount * kResourceScale);
    s.max_total_[r] = std::max(s.max_total_[r], node.total[r]);
  }
  for (const auto& [key, value] : spec.labels) {
    const int k = s.InternLabelKey(key);
    auto [it, inserted] =
        s.label_value_ids_.try_emplace(value, static_cast<int>(s.label_values_.size()));
    if (inserted) s.label_values_.push_back(value);
    if (static_cast<int>(node.labels.size()) <= k) node.labels.resize(k + 1, -1);
    node.labels[k] = it->second;
  }
  node.label_map = spec.labels;
  auto spot = spec.labels.find(kSpotLabel);
  node.spot_class =
      spot != spec.labels.end() && spot->second == "true" ? internal::kSpot : internal::kOnDemand;
  const uint32_t id = static_cast<uint32_t>(s.nodes_.size());
  node.indexed = true;
  s.index_.InsertNode(node, id);
  s.nodes_.push_back(std::move(node));
  s.node_by_name_[spec.name] = id;
  ++s.alive_;
  return absl::OkStatus();
}

absl::Status Scheduler::DrainNode(const std::string& name) {
  internal::State& s = *state_;
  auto it = s.node_by_name_.find(name);
  if (it == s.node_by_name_.end()) return absl::NotFoundError("DrainNode: no node " + name);
  NodeRec& node = s.nodes_[it->second];
  if (node.state != NodeState::kAlive) return absl::OkStatus();
  if (node.indexed) s.index_.EraseNode(node, it->second);
  node.indexed = false;
  node.state = NodeState::kDraining;
  --s.alive_;
  return absl::OkStatus();
}

absl::Status Scheduler::UndrainNode(const std::string& name) {
  internal::State& s = *state_;
  auto it = s.node_by_name_.find(name);
  if (it == s.node_by_name_.end()) return absl::NotFoundError("UndrainNode: no node " + name);
  NodeRec& node = s.nodes_[it->second];
  if (node.state != NodeState::kDraining) return absl::OkStatus();
  node.state = NodeState::kAlive;
  node.indexed = true;
  s.index_.InsertNode(node, it->second);
  ++s.alive_;
  return absl::OkStatus();
}

absl::StatusOr<RescheduleReport> Scheduler::RemoveNodes(const std::vector<std::string>& nodes) {
  return state_->RemoveNodes(nodes);
}

absl::StatusOr<ActorDecision> Scheduler::PlaceActor(const ActorRequest& request) {
  internal::State& s = *state_;
  if (request.actor.empty()) return absl::InvalidArgumentError("PlaceActor: actor id is empty");
  if (s.actor_by_id_.contains(request.actor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PlaceActor: actor '", request.actor, "' is already placed"));
  }
  if (request.bundle < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlaceActor '", request.actor, "': bundle must be >= -1, got ", request.bundle));
  }
  if (request.strategy != Strategy::kPack && request.strategy != Strategy::kSpread) {
    return absl::InvalidArgumentError(absl::StrCat("PlaceActor '", request.actor,
                                                   "': strategy must be PACK or SPREAD, got ",
                                                   StrategyName(request.strategy)));
  }
  absl::StatusOr<internal::Demand> demand =
      s.CompileDemand(request.demands, "PlaceActor '" + request.actor + "'");
  if (!demand.ok()) return demand.status();

  uint32_t handle;
  if (!s.free_actor_slots_.empty()) {
    handle = s.free_actor_slots_.back();
    s.free_actor_slots_.pop_back();
  } else {
    handle = static_cast<uint32_t>(s.actors_.size());
    s.actors_.emplace_back();
  }
  internal::ActorRec& a = s.actors_[handle];
  a.live = true;
  a.id = request.actor;
  a.request = request;
  a.demand = *std::move(demand);
  a.node = -1;
  a.seq = s.next_seq_++;
  ActorDecision decision;
  decision.unschedulable = s.PlaceActorRec(handle);
  if (decision.unschedulable) {
    s.actors_[handle] = internal::ActorRec{};
    s.free_actor_slots_.push_back(handle);
    return decision;
  }
  s.actor_by_id_[request.actor] = handle;
  decision.node = s.nodes_[s.actors_[handle].node].name;
  return decision;
}

absl::Status Scheduler::ReleaseActor(const std::string& actor) {
  internal::State& s = *state_;
  auto it = s.actor_by_id_.find(actor);
  if (it == s.actor_by_id_.end()) return absl::NotFoundError("ReleaseActor: no actor " + actor);
  const uint32_t handle = it->second;
  internal::ActorRec& a = s.actors_[handle];
  if (a.group >= 0) {
    internal::GroupRec& g = s.groups_[a.group];
    for (const auto& [r, amount] : a.demand.items) g.bundle_free[a.bundle][r] += amount;
    g.bundle_actors[a.bundle].erase(handle);
  } else if (a.node >= 0) {
    s.Release(static_cast<uint32_t>(a.node), a.demand);
    s.nodes_[a.node].actors.erase(handle);
  }
  s.EraseActor(handle);
  return absl::OkStatus();
}

std::optional<std::string> Scheduler::ActorNode(const std::string& actor) const {
  auto it = state_->actor_by_id_.find(actor);
  if (it == state_->actor_by_id_.end()) return std::nullopt;
  return state_->nodes_[state_->actors_[it->second].node].name;
}

std::optional<ActorRequest> Scheduler::ActorSpec(const std::string& actor) const {
  auto it = state_->actor_by_id_.find(actor);
  if (it == state_->actor_by_id_.end()) return std::nullopt;
  return state_->actors_[it->second].request;
}

std::optional<NodeView> Scheduler::Node(const std::string& name) const {
  auto it = state_->node_by_name_.find(name);
  if (it == state_->node_by_name_.end()) return std::nullopt;
  return state_->View(it->second);
}

std::vector<std::string> Scheduler::ActorIds() const {
  std::vector<std::pair<uint64_t, std::string>> order;
  for (const auto& a : state_->actors_) {
    if (a.live) order.push_back({a.seq, a.id});
  }
  std::sort(order.begin(), order.end());
  std::vector<std::string> ids;
  for (auto& [seq, id] : order) ids.push_back(std::move(id));
  return ids;
}

int Scheduler::alive_nodes() const { return state_->alive_; }
absl::Status Scheduler::CheckInvariants() const { return state_->CheckInvariants(); }
std::string Scheduler::DebugString() const { return state_->DebugString(); }

}  // namespace troupe::scheduler
