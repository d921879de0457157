// Self-checks (recomputed accounting, index and strategy invariants), views and DebugString.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "internal/state.h"
#include "troupe/base/status_macros.h"

namespace troupe::scheduler::internal {
namespace {

// By node, then resource id: what actors and bundles hold, recomputed from the records.
using Usage = std::vector<std::vector<int64_t>>;

absl::Status Broken(const std::string& what) { return absl::InternalError("invariant: " + what); }

// Adds what `who` holds to node n's usage; `who` must sit on a node that is not dead.
absl::Status Charge(const State& s, int n, const Demand& d, const std::string& who, Usage& used) {
  if (n < 0 || n >= static_cast<int>(s.nodes_.size())) return Broken(who + " has no node");
  if (s.nodes_[n].state == NodeState::kDead) return Broken(who + " is on dead " + s.nodes_[n].name);
  for (const auto& [r, amount] : d.items) used[n][r] += amount;
  return absl::OkStatus();
}

// Actors outside groups are charged to their node; those inside sit in their bundle, whose
// resources are the bundle's (charged by CheckGroups).
absl::Status CheckActors(const State& s, Usage& used) {
  size_t live_actors = 0;
  for (uint32_t a = 0; a < s.actors_.size(); ++a) {
    const ActorRec& rec = s.actors_[a];
    if (!rec.live) continue;
    ++live_actors;
    if (rec.group >= 0) {
      const GroupRec& g = s.groups_[rec.group];
      if (!g.live || rec.bundle < 0 || rec.bundle >= static_cast<int>(g.bundle_node.size()) ||
          g.bundle_node[rec.bundle] != rec.node || !g.bundle_actors[rec.bundle].contains(a) ||
          s.nodes_[rec.node].actors.contains(a)) {
        return Broken("actor " + rec.id + " is not inside its bundle");
      }
      continue;
    }
    TROUPE_RETURN_IF_ERROR(Charge(s, rec.node, rec.demand, "actor " + rec.id, used));
    if (!s.nodes_[rec.node].actors.contains(a)) return Broken("node misses actor " + rec.id);
  }
  if (live_actors != s.actor_by_id_.size()) return Broken("actor map size");
  return absl::OkStatus();
}

// What a bundle has left for actors is its reservation minus its actors' demands, never negative.
absl::Status CheckBundleActors(const State& s, uint32_t g, size_t b, const std::string& who) {
  const GroupRec& rec = s.groups_[g];
  std::vector<int64_t> left(rec.bundle_free[b].size(), 0);
  for (const auto& [r, amount] : rec.demands[b].items) left[r] = amount;
  for (uint32_t a : rec.bundle_actors[b]) {
    if (!s.actors_[a].live || s.actors_[a].group != static_cast<int>(g)) {
      return Broken(who + " actor");
    }
    for (const auto& [r, amount] : s.actors_[a].demand.items) {
      if (r >= static_cast<int>(left.size())) return Broken(who + " holds an unreserved resource");
      left[r] -= amount;
    }
  }
  if (left != rec.bundle_free[b]) return Broken(who + " reservation accounting");
  for (int64_t v : left) {
    if (v < 0) return Broken(who + " over-committed by its actors");
  }
  return absl::OkStatus();
}

// `domains`: the failure domain of each bundle, in bundle order.
absl::Status CheckStrategy(const GroupRec& rec, const std::vector<int>& domains) {
  std::vector<int> distinct = domains;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (rec.request.strategy == Strategy::kStrictSpread && distinct.size() != domains.size()) {
    return Broken("STRICT_SPREAD group " + rec.id + " shares a domain");
  }
  if (rec.request.strategy == Strategy::kStrictPack && distinct.size() != 1) {
    return Broken("STRICT_PACK group " + rec.id + " spans domains");
  }
  return absl::OkStatus();
}

absl::Status CheckGroup(const State& s, uint32_t g, Usage& used) {
  const GroupRec& rec = s.groups_[g];
  std::vector<int> domains;
  const int key =
      rec.request.domain_key.empty() ? kNodeDomain : s.label_key_ids_.at(rec.request.domain_key);
  for (size_t b = 0; b < rec.bundle_node.size(); ++b) {
    const std::string who = absl::StrCat("group ", rec.id, " bundle ", b);
    TROUPE_RETURN_IF_ERROR(Charge(s, rec.bundle_node[b], rec.demands[b], who, used));
    if (!s.nodes_[rec.bundle_node[b]].bundles.contains(static_cast<uint64_t>(g) << 32 | b)) {
      return Broken("node misses " + who);
    }
    domains.push_back(s.DomainOf(rec.bundle_node[b], key));
    TROUPE_RETURN_IF_ERROR(CheckBundleActors(s, g, b, who));
  }
  return CheckStrategy(rec, domains);
}

// free == total - used, never negative.
absl::Status CheckNodeAccounting(const State& s, uint32_t n, const std::vector<int64_t>& used) {
  const NodeRec& node = s.nodes_[n];
  for (size_t r = 0; r < node.total.size(); ++r) {
    if (node.free[r] != node.total[r] - used[r]) {
      return Broken(absl::StrCat(node.name, " ", s.resource_names_[r], " free ", node.free[r],
                                 " != total ", node.total[r], " - used ", used[r]));
    }
    if (node.free[r] < 0) return Broken("over-commit on " + node.name);
  }
  return absl::OkStatus();
}

// The index holds exactly the alive nodes, under their current keys.
absl::Status CheckNodeIndexed(const State& s, uint32_t n) {
  const NodeRec& node = s.nodes_[n];
  if (node.indexed != (node.state == NodeState::kAlive) || node.hidden) {
    return Broken("index membership of " + node.name);
  }
  for (size_t r = 0; node.indexed && r < node.total.size(); ++r) {
    if (node.total[r] <= 0) continue;
    const int rr = static_cast<int>(r);
    const auto* by_free = s.index_.by_free(rr, node.spot_class).Find(node.free[r], n);
    const auto* by_util = s.index_.by_util(rr, node.spot_class).Find(Index::Util(node, rr), n);
    if (by_free == nullptr || by_util == nullptr) return Broken("index key of " + node.name);
    if (by_free->hot != Index::Hot(node) || by_util->hot != Index::Hot(node)) {
      return Broken("stale free amounts in the index entries of " + node.name);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNodes(const State& s, const Usage& used) {
  for (uint32_t n = 0; n < s.nodes_.size(); ++n) {
    const NodeRec& node = s.nodes_[n];
    if (node.state == NodeState::kDead) {
      if (!node.actors.empty() || !node.bundles.empty() || node.indexed) {
        return Broken("dead node " + node.name + " holds something or is indexed");
      }
      continue;
    }
    TROUPE_RETURN_IF_ERROR(CheckNodeAccounting(s, n, used[n]));
    TROUPE_RETURN_IF_ERROR(CheckNodeIndexed(s, n));
  }
  return absl::OkStatus();
}

// Each resource's sets are well-formed and list every indexed node offering it, once.
absl::Status CheckIndexSizes(const State& s) {
  for (int r = 0; r < s.index_.resources(); ++r) {
    size_t expected = 0;
    for (const NodeRec& node : s.nodes_) expected += node.indexed && node.Total(r) > 0;
    for (int cls : {kOnDemand, kSpot}) {
      if (!s.index_.by_free(r, cls).Valid() || !s.index_.by_util(r, cls).Valid()) {
        return Broken("index structure of " + s.resource_names_[r]);
      }
    }
    const size_t got = s.index_.by_free(r, 0).size() + s.index_.by_free(r, 1).size();
    const size_t got_util = s.index_.by_util(r, 0).size() + s.index_.by_util(r, 1).size();
    if (got != expected || got_util != expected) {
      return Broken("index size " + s.resource_names_[r]);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status State::CheckInvariants() const {
  // Actors and groups fill `used` before the nodes are checked against it.
  Usage used(nodes_.size());
  for (size_t n = 0; n < nodes_.size(); ++n) used[n].assign(nodes_[n].total.size(), 0);
  TROUPE_RETURN_IF_ERROR(CheckActors(*this, used));
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    if (!groups_[g].live) continue;
    TROUPE_RETURN_IF_ERROR(CheckGroup(*this, g, used));
  }
  TROUPE_RETURN_IF_ERROR(CheckNodes(*this, used));
  return CheckIndexSizes(*this);
}

NodeView State::View(uint32_t n) const {
  const NodeRec& node = nodes_[n];
  NodeView v;
  v.name = node.name;
  v.state = node.state;
  v.labels = node.label_map;
  for (size_t r = 0; r < node.total.size(); ++r) {
    if (node.total[r] == 0) continue;
    v.total[resource_names_[r]] = static_cast<double>(node.total[r]) / kResourceScale;
    v.free[resource_names_[r]] = static_cast<double>(node.free[r]) / kResourceScale;
  }
  v.actors = static_cast<int>(node.actors.size());
  v.bundles = static_cast<int>(node.bundles.size());
  return v;
}

std::string State::DebugString() const {
  int draining = 0, dead = 0;
  std::vector<int64_t> total(resource_names_.size(), 0), free(resource_names_.size(), 0);
  for (const NodeRec& node : nodes_) {
    draining += node.state == NodeState::kDraining;
    dead += node.state == NodeState::kDead;
    if (node.state != NodeState::kAlive) continue;
    for (size_t r = 0; r < node.total.size(); ++r) {
      total[r] += node.total[r];
      free[r] += node.free[r];
    }
  }
  std::string out = absl::StrCat(
      "Scheduler{placer=", options_.placer == Scheduler::Placer::kIndexed ? "indexed" : "brute",
      " nodes: alive=", alive_, " draining=", draining, " dead=", dead,
      " actors=", actor_by_id_.size(), " groups=", group_by_id_.size(), " free/total on alive:");
  for (size_t r = 0; r < resource_names_.size(); ++r) {
    absl::StrAppend(&out, " ", resource_names_[r], "=", FormatAmount(free[r]), "/",
                    FormatAmount(total[r]));
  }
  absl::StrAppend(&out, "}");
  return out;
}

}  // namespace troupe::scheduler::internal
