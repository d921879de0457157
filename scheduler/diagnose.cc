// Unschedulable reasons a person can act on, and whether waiting can help. Runs only when a
// placement failed, so it may scan every node.
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal/state.h"

namespace troupe::scheduler::internal {

std::string State::FormatAmount(int64_t fixed) const {
  if (fixed % kResourceScale == 0) return absl::StrCat(fixed / kResourceScale);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4f", static_cast<double>(fixed) / kResourceScale);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  return s;
}

std::string State::FormatDemand(const Demand& demand) const {
  std::vector<std::string> parts;
  for (const auto& [r, amount] : demand.items) {
    parts.push_back(absl::StrCat(resource_names_[r], "=", FormatAmount(amount)));
  }
  std::sort(parts.begin(), parts.end());
  return parts.empty() ? "nothing" : absl::StrJoin(parts, " ");
}

Unschedulable State::Diagnose(const Demand& demand, const Filter& filter) const {
  struct Best {
    int64_t free = -1, total = -1;
    int free_node = -1, total_node = -1;
  };
  std::vector<Best> best(demand.items.size());
  int alive = 0, draining = 0, draining_fit = 0, matching = 0, fits_idle = 0, fits_now = 0;
  for (uint32_t n = 0; n < nodes_.size(); ++n) {
    const NodeRec& node = nodes_[n];
    if (node.state == NodeState::kDraining) {
      ++draining;
      if (FitsWhenIdle(node, demand) && Passes(n, filter)) ++draining_fit;
    }
    if (node.state != NodeState::kAlive) continue;
    ++alive;
    if (!Passes(n, filter)) continue;
    ++matching;
    if (FitsWhenIdle(node, demand)) ++fits_idle;
    if (Fits(node, demand)) ++fits_now;
    for (size_t i = 0; i < demand.items.size(); ++i) {
      const int r = demand.items[i].first;
      if (node.Free(r) > best[i].free) best[i].free = node.Free(r), best[i].free_node = n;
      if (node.Total(r) > best[i].total) best[i].total = node.Total(r), best[i].total_node = n;
    }
  }
  const std::string need = absl::StrCat("needs ", FormatDemand(demand));
  const std::string among =
      filter.description.empty() ? "" : absl::StrCat(" among nodes with ", filter.description);
  // Draining nodes do not count: they are about to leave. They are named so a person knows.
  const std::string drain_note =
      draining_fit == 0
          ? ""
          : absl::StrCat(" (", draining_fit, " draining node(s) could, if undrained)");
  if (alive == 0) {
    return {absl::StrCat(need, "; no node is alive", drain_note), false};
  }
  if (matching == 0) {
    return {
        absl::StrCat(need, "; none of the ", alive, " alive nodes satisfies: ", filter.description),
        false};
  }
  auto largest = [&](size_t i, bool free) {
    const int r = demand.items[i].first;
    const int n = free ? best[i].free_node : best[i].total_node;
    return absl::StrCat(nodes_[n].name, " with ", resource_names_[r], "=",
                        FormatAmount(free ? best[i].free : best[i].total));
  };
  if (fits_idle == 0) {
    for (size_t i = 0; i < demand.items.size(); ++i) {
      if (best[i].total < demand.items[i].second) {
        return {absl::StrCat(need, "; no alive node could ever fit it", among, ": the largest is ",
                             largest(i, false), drain_note),
                false};
      }
    }
    return {absl::StrCat(need, "; no alive node", among, " has all of it at once", drain_note),
            false};
  }
  const std::string idle = absl::StrCat(" (", fits_idle, " alive node", fits_idle == 1 ? "" : "s",
                                        among, " could fit it when idle)");
  if (fits_now > 0) {
    return {absl::StrCat(need, "; the ", fits_now, " node(s) with room are ruled out by ",
                         "the placement strategy or affinity", idle),
            true};
  }
  // The resource furthest from fitting: the smallest largest-free relative to the demand.
  int worst = -1;
  double worst_ratio = 2;
  for (size_t i = 0; i < demand.items.size(); ++i) {
    const double ratio =
        static_cast<double>(best[i].free) / static_cast<double>(demand.items[i].second);
    if (ratio < 1 && ratio < worst_ratio) worst_ratio = ratio, worst = static_cast<int>(i);
  }
  if (worst >= 0) {
    return {absl::StrCat(need, "; the largest free is ", largest(worst, true), idle), true};
  }
  return {absl::StrCat(need, "; no node has all of it free at once", idle), true};
}

// Whether the group would fit if every alive node matching the selector were idle. A
// necessary-condition check (it does not solve the packing), so "false" is definite.
bool State::GroupFeasibleWhenIdle(const GroupRec& g, const Filter& filter) const {
  const PlacementGroupRequest& req = g.request;
  const int key = req.domain_key.empty()                 ? kNodeDomain
                  : label_key_ids_.count(req.domain_key) ? label_key_ids_.at(req.domain_key)
                                                         : -2;
  std::vector<const Demand*> parts;
  for (const Demand& d : g.demands) {
    if (!d.unknown_resource.empty()) return false;
    parts.push_back(&d);
  }
  const Demand sum = SumDemands(parts);
  // Groups usually repeat one bundle shape: test each distinct shape once per node.
  std::vector<const Demand*> shapes;
  for (const Demand& d : g.demands) {
    if (std::none_of(shapes.begin(), shapes.end(),
                     [&](const Demand* s) { return s->items == d.items; })) {
      shapes.push_back(&d);
    }
    if (shapes.size() > 64) break;  // many shapes: the check below stays correct, just slower
  }
  if (shapes.size() > 64) {
    shapes.clear();
    for (const Demand& d : g.demands) shapes.push_back(&d);
  }
  std::vector<char> bundle_fits(shapes.size(), 0);
  absl::flat_hash_map<int, std::vector<int64_t>> domain_total;  // for STRICT_PACK by label
  absl::flat_hash_set<int> spread_domains;                      // domains fitting some bundle
  bool pack_node = false;
  std::vector<int64_t> cluster_total(resource_names_.size(), 0);
  for (uint32_t n = 0; n < nodes_.size(); ++n) {
    const NodeRec& node = nodes_[n];
    if (node.state != NodeState::kAlive || !Passes(n, filter)) continue;
    bool any = false;
    for (size_t b = 0; b < shapes.size(); ++b) {
      if (FitsWhenIdle(node, *shapes[b])) bundle_fits[b] = 1, any = true;
    }
    const int domain = key == -2 ? -1 - static_cast<int>(n) : DomainOf(n, key);
    if (any) spread_domains.insert(domain);
    if (FitsWhenIdle(node, sum)) pack_node = true;
    for (size_t r = 0; r < resource_names_.size(); ++r) {
      cluster_total[r] += node.Total(static_cast<int>(r));
    }
    if (req.strategy == Strategy::kStrictPack && key != kNodeDomain) {
      auto& dt = domain_total[domain];
      dt.resize(resource_names_.size(), 0);
      for (size_t r = 0; r < resource_names_.size(); ++r) dt[r] += node.Total(static_cast<int>(r));
    }
  }
  if (std::find(bundle_fits.begin(), bundle_fits.end(), 0) != bundle_fits.end()) return false;
  auto covers = [&](const std::vector<int64_t>& totals) {
    for (const auto& [r, amount] : sum.items) {
      if (totals[r] < amount) return false;
    }
    return true;
  };
  switch (req.strategy) {
    case Strategy::kStrictSpread:
      return spread_domains.size() >= g.demands.size();
    case Strategy::kStrictPack:
      if (key == kNodeDomain) return pack_node;
      for (const auto& [domain, totals] : domain_total) {
        if (covers(totals)) return true;
      }
      return false;
    default:
      return covers(cluster_total);
  }
}

}  // namespace troupe::scheduler::internal
