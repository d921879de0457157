#include "sim/invariants.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "troupe/base/status_macros.h"

namespace troupe::scheduler::sim {
namespace {

absl::Status Violated(const std::string& what) {
  return absl::InternalError("sim invariant: " + what);
}

std::string DomainOf(const NodeView& node, const std::string& key) {
  if (key.empty()) return node.name;
  auto it = node.labels.find(key);
  return it == node.labels.end() ? "node:" + node.name : it->second;
}

}  // namespace

absl::Status CheckCluster(const Scheduler& s) {
  TROUPE_RETURN_IF_ERROR(s.CheckInvariants());
  for (const std::string& actor : s.ActorIds()) {
    auto node = s.ActorNode(actor);
    if (!node || !s.Node(*node)) return Violated("actor " + actor + " is on no live node");
  }
  for (const std::string& group : s.GroupIds()) {
    auto nodes = s.GroupNodes(group);
    auto req = s.GroupRequest(group);
    if (!nodes || !req || nodes->size() != req->bundles.size()) {
      return Violated("group " + group + " is partial");
    }
    std::vector<std::string> domains;
    for (const std::string& n : *nodes) {
      auto view = s.Node(n);
      if (!view) return Violated("group " + group + " holds dead node " + n);
      domains.push_back(DomainOf(*view, req->domain_key));
    }
    const std::set<std::string> distinct(domains.begin(), domains.end());
    if (req->strategy == Strategy::kStrictSpread && distinct.size() != domains.size()) {
      return Violated("STRICT_SPREAD group " + group +
                      " shares a domain: " + absl::StrJoin(domains, ","));
    }
    if (req->strategy == Strategy::kStrictPack && distinct.size() != 1) {
      return Violated("STRICT_PACK group " + group + " spans " + absl::StrJoin(distinct, ","));
    }
  }
  return absl::OkStatus();
}

Snapshot TakeSnapshot(const Scheduler& s) {
  Snapshot snap;
  for (const std::string& a : s.ActorIds()) {
    snap.actors[a] = *s.ActorNode(a);
    const std::string group = s.ActorSpec(a)->group;
    if (!group.empty()) snap.actor_group[a] = group;
  }
  for (const std::string& g : s.GroupIds()) snap.groups[g] = *s.GroupNodes(g);
  return snap;
}

absl::Status CheckReschedule(const Snapshot& before, const std::vector<std::string>& dead,
                             const RescheduleReport& report, const Scheduler& after) {
  const std::set<std::string> dead_set(dead.begin(), dead.end());
  std::map<std::string, std::string> moved, lost;
  for (const auto& m : report.moved) moved[m.actor] = m.to;
  for (const auto& l : report.lost) {
    if (l.why.reason.empty()) return Violated("actor " + l.actor + " lost without a reason");
    lost[l.actor] = l.from;
  }
  std::set<std::string> broken;
  for (const auto& b : report.broken) {
    if (b.why.reason.empty()) return Violated("group " + b.group + " broken without a reason");
    broken.insert(b.group);
  }
  size_t affected = 0;
  for (const auto& [actor, node] : before.actors) {
    auto now = after.ActorNode(actor);
    auto group = before.actor_group.find(actor);
    const bool group_broke = group != before.actor_group.end() && broken.count(group->second);
    if (!dead_set.count(node) && group_broke) {  // goes with its group
      ++affected;
      if (now || !lost.count(actor)) return Violated("actor " + actor + " outlived its group");
      continue;
    }
    if (!dead_set.count(node)) {
      if (!now || *now != node) return Violated("unaffected actor " + actor + " moved");
      continue;
    }
    ++affected;
    if (moved.count(actor)) {
      if (!now || *now != moved[actor] || dead_set.count(*now)) {
        return Violated("moved actor " + actor + " is not where the report says");
      }
    } else if (lost.count(actor)) {
      if (now) return Violated("lost actor " + actor + " is still placed");
    } else {
      return Violated("affected actor " + actor + " is neither moved nor lost");
    }
  }
  if (affected != moved.size() + lost.size()) return Violated("report lists unaffected actors");

  std::map<std::string, const RescheduleReport::RepairedGroup*> repaired;
  for (const auto& r : report.repaired) repaired[r.group] = &r;
  size_t affected_groups = 0;
  for (const auto& [group, nodes] : before.groups) {
    auto now = after.GroupNodes(group);
    const bool hit = std::any_of(nodes.begin(), nodes.end(),
                                 [&](const std::string& n) { return dead_set.count(n) > 0; });
    if (!hit) {
      if (!now || *now != nodes) return Violated("unaffected group " + group + " moved");
      continue;
    }
    ++affected_groups;
    if (broken.count(group)) {
      if (now) return Violated("broken group " + group + " still holds bundles");
      continue;
    }
    if (!repaired.count(group) || !now) return Violated("group " + group + " silently partial");
    for (size_t b = 0; b < nodes.size(); ++b) {
      const bool was_dead = dead_set.count(nodes[b]) > 0;
      const auto& moved_bundles = repaired[group]->bundles;
      const bool listed = std::count(moved_bundles.begin(), moved_bundles.end(), b) > 0;
      if (was_dead != listed) return Violated(absl::StrCat("group ", group, " bundle ", b));
      if (!was_dead && (*now)[b] != nodes[b]) {
        return Violated(absl::StrCat("unaffected bundle ", b, " of ", group, " moved"));
      }
    }
  }
  if (affected_groups != repaired.size() + broken.size()) {
    return Violated("report lists unaffected groups");
  }
  return CheckCluster(after);
}

}  // namespace troupe::scheduler::sim
