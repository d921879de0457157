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

namespace {

// For one demanded resource, the largest free and total amounts on a matching alive node.
struct Largest {
  int64_t free = -1, total = -1;
  int free_node = -1, total_node = -1;
};

// How the nodes stand against one demand and filter.
struct Census {
  std::vector<Largest> best;  // by demand item
  int alive = 0, draining_fit = 0, matching = 0, fits_idle = 0, fits_now = 0;
};

Census TakeCensus(const State& s, const Demand& demand, const Filter& filter) {
  Census c;
  c.best.resize(demand.items.size());
  for (uint32_t n = 0; n < s.nodes_.size(); ++n) {
    const NodeRec& node = s.nodes_[n];
    if (node.state == NodeState::kDraining && s.FitsWhenIdle(node, demand) && s.Passes(n, filter)) {
      ++c.draining_fit;
    }
    if (node.state != NodeState::kAlive) continue;
    ++c.alive;
    if (!s.Passes(n, filter)) continue;
    ++c.matching;
    if (s.FitsWhenIdle(node, demand)) ++c.fits_idle;
    if (s.Fits(node, demand)) ++c.fits_now;
    for (size_t i = 0; i < demand.items.size(); ++i) {
      const int r = demand.items[i].first;
      Largest& best = c.best[i];
      if (node.Free(r) > best.free) best.free = node.Free(r), best.free_node = n;
      if (node.Total(r) > best.total) best.total = node.Total(r), best.total_node = n;
    }
  }
  return c;
}

// "node with resource=amount": the node with the most of demand item i, free or in total.
std::string LargestOf(const State& s, const Demand& demand, const Census& c, size_t i, bool free) {
  const int r = demand.items[i].first;
  const int n = free ? c.best[i].free_node : c.best[i].total_node;
  return absl::StrCat(s.nodes_[n].name, " with ", s.resource_names_[r], "=",
                      s.FormatAmount(free ? c.best[i].free : c.best[i].total));
}

// The first demand item larger than every matching node's total, or -1.
int FirstNeverFitting(const Demand& demand, const Census& c) {
  for (size_t i = 0; i < demand.items.size(); ++i) {
    if (c.best[i].total < demand.items[i].second) return static_cast<int>(i);
  }
  return -1;
}

// The resource furthest from fitting: the smallest largest-free relative to the demand, or -1.
int FurthestFromFitting(const Demand& demand, const Census& c) {
  int worst = -1;
  double worst_ratio = 2;
  for (size_t i = 0; i < demand.items.size(); ++i) {
    const double ratio =
        static_cast<double>(c.best[i].free) / static_cast<double>(demand.items[i].second);
    if (ratio < 1 && ratio < worst_ratio) worst_ratio = ratio, worst = static_cast<int>(i);
  }
  return worst;
}

// Groups usually repeat one bundle shape: the distinct ones are tested once per node. Past 64
// shapes every bundle is its own (the check stays correct, just slower).
std::vector<const Demand*> DistinctShapes(const GroupRec& g) {
  std::vector<const Demand*> shapes;
  for (const Demand& d : g.demands) {
    if (std::none_of(shapes.begin(), shapes.end(),
                     [&](const Demand* s) { return s->items == d.items; })) {
      shapes.push_back(&d);
    }
    if (shapes.size() > 64) break;
  }
  if (shapes.size() > 64) {
    shapes.clear();
    for (const Demand& d : g.demands) shapes.push_back(&d);
  }
  return shapes;
}

// Whether the totals, by resource id, hold all of the demand.
bool Covers(const std::vector<int64_t>& totals, const Demand& demand) {
  for (const auto& [r, amount] : demand.items) {
    if (totals[r] < amount) return false;
  }
  return true;
}

}  // namespace

Unschedulable State::Diagnose(const Demand& demand, const Filter& filter) const {
  const Census c = TakeCensus(*this, demand, filter);
  const std::string need = absl::StrCat("needs ", FormatDemand(demand));
  const std::string among =
      filter.description.empty() ? "" : absl::StrCat(" among nodes with ", filter.description);
  // Draining nodes do not count: they are about to leave. They are named so a person knows.
  const std::string drain_note =
      c.draining_fit == 0
          ? ""
          : absl::StrCat(" (", c.draining_fit, " draining node(s) could, if undrained)");
  if (c.alive == 0) {
    return {absl::StrCat(need, "; no node is alive", drain_note), false};
  }
  if (c.matching == 0) {
    return {absl::StrCat(need, "; none of the ", c.alive,
                         " alive nodes satisfies: ", filter.description),
            false};
  }
  if (c.fits_idle == 0) {
    if (const int i = FirstNeverFitting(demand, c); i >= 0) {
      return {absl::StrCat(need, "; no alive node could ever fit it", among, ": the largest is ",
                           LargestOf(*this, demand, c, i, /*free=*/false), drain_note),
              false};
    }
    return {absl::StrCat(need, "; no alive node", among, " has all of it at once", drain_note),
            false};
  }
  const std::string idle =
      absl::StrCat(" (", c.fits_idle, " alive node", c.fits_idle == 1 ? "" : "s", among,
                   " could fit it when idle)");
  if (c.fits_now > 0) {
    return {absl::StrCat(need, "; the ", c.fits_now, " node(s) with room are ruled out by ",
                         "the placement strategy or affinity", idle),
            true};
  }
  if (const int worst = FurthestFromFitting(demand, c); worst >= 0) {
    return {absl::StrCat(need, "; the largest free is ",
                         LargestOf(*this, demand, c, worst, /*free=*/true), idle),
            true};
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
  const std::vector<const Demand*> shapes = DistinctShapes(g);
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
  switch (req.strategy) {
    case Strategy::kStrictSpread:
      return spread_domains.size() >= g.demands.size();
    case Strategy::kStrictPack:
      if (key == kNodeDomain) return pack_node;
      for (const auto& [domain, totals] : domain_total) {
        if (Covers(totals, sum)) return true;
      }
      return false;
    default:
      return Covers(cluster_total, sum);
  }
}

}  // namespace troupe::scheduler::internal
