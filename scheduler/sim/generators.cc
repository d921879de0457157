#include "sim/generators.h"

#include "absl/strings/str_cat.h"

namespace troupe::scheduler::sim {

std::vector<NodeSpec> GenerateCluster(uint64_t seed, const ClusterShape& shape) {
  SplitMix64 rng(seed);
  std::vector<NodeSpec> nodes;
  nodes.reserve(shape.nodes);
  for (int i = 0; i < shape.nodes; ++i) {
    NodeSpec n;
    n.name = absl::StrCat("node-", i);
    const double kind = rng.Real();
    if (kind < 0.4) {
      n.resources = {{"cpu", 16}, {"memory", 64}};
      n.labels["instance"] = "cpu-16";
    } else if (kind < 0.7) {
      n.resources = {{"cpu", 64}, {"memory", 256}};
      n.labels["instance"] = "cpu-64";
    } else if (kind < 0.9) {
      n.resources = {{"cpu", 32}, {"gpu", 4}, {"memory", 256}};
      n.labels["instance"] = "gpu-4";
    } else {
      n.resources = {{"cpu", 96}, {"gpu", 8}, {"memory", 1024}};
      n.labels["instance"] = "gpu-8";
    }
    n.labels[kZoneLabel] = absl::StrCat("z", rng.Uniform(shape.zones));
    n.labels[kSpotLabel] = rng.Bernoulli(shape.spot_fraction) ? "true" : "false";
    nodes.push_back(std::move(n));
  }
  return nodes;
}

ActorRequest RandomActor(SplitMix64& rng, int i, const WorkloadShape& shape, int zones) {
  static constexpr double kCpu[] = {0.5, 1, 2, 4};
  ActorRequest a;
  a.actor = absl::StrCat("actor-", i);
  if (rng.Bernoulli(shape.gpu_fraction)) {
    a.demands = {{"gpu", rng.Bernoulli(0.8) ? 1.0 : 2.0}, {"cpu", 4}, {"memory", 16}};
    a.spot = SpotPreference::kPreferSpot;  // workers ride on spot
  } else {
    a.demands = {{"cpu", kCpu[rng.Uniform(4)]},
                 {"memory", static_cast<double>(1 + rng.Uniform(8))}};
    const double role = rng.Real();  // coordinators and checkpoint writers prefer on-demand
    a.spot = role < 0.2   ? SpotPreference::kPreferOnDemand
             : role < 0.5 ? SpotPreference::kPreferSpot
                          : SpotPreference::kNone;
  }
  if (rng.Bernoulli(shape.selector_fraction)) {
    a.selector.push_back({kZoneLabel, LabelTerm::Op::kIn, {absl::StrCat("z", rng.Uniform(zones))}});
  }
  if (i > 0 && rng.Bernoulli(shape.anti_affinity_fraction)) {
    a.affinity.push_back({absl::StrCat("actor-", i - 1), /*anti=*/true, kZoneLabel});
  }
  a.strategy = rng.Bernoulli(shape.spread_fraction) ? Strategy::kSpread : Strategy::kPack;
  return a;
}

PlacementGroupRequest RandomGroup(SplitMix64& rng, int i, int max_bundles, int zones) {
  static constexpr Strategy kStrategies[] = {Strategy::kPack, Strategy::kSpread,
                                             Strategy::kStrictPack, Strategy::kStrictSpread};
  PlacementGroupRequest g;
  g.group = absl::StrCat("group-", i);
  g.strategy = kStrategies[rng.Uniform(4)];
  int bundles = 1 + static_cast<int>(rng.Uniform(max_bundles));
  if (rng.Bernoulli(0.25)) {
    g.domain_key = kZoneLabel;
    if (g.strategy == Strategy::kStrictSpread) bundles = std::min(bundles, zones);
  }
  const bool gpu = rng.Bernoulli(0.3);
  for (int b = 0; b < bundles; ++b) {
    if (gpu) {
      g.bundles.push_back({{"gpu", 1}, {"cpu", 2}});
    } else {
      g.bundles.push_back({{"cpu", static_cast<double>(1 + rng.Uniform(4))}, {"memory", 4}});
    }
  }
  if (rng.Bernoulli(0.2)) g.spot = SpotPreference::kPreferOnDemand;
  return g;
}

std::vector<std::string> PreemptionWave(SplitMix64& rng, const Scheduler& scheduler,
                                        const std::vector<NodeSpec>& nodes, double fraction) {
  std::vector<std::string> spot;
  for (const NodeSpec& n : nodes) {
    auto view = scheduler.Node(n.name);
    if (view && view->state == NodeState::kAlive && view->labels.count(kSpotLabel) &&
        view->labels.at(kSpotLabel) == "true") {
      spot.push_back(n.name);
    }
  }
  // Partial Fisher-Yates with our own generator.
  const size_t k = static_cast<size_t>(static_cast<double>(spot.size()) * fraction);
  for (size_t i = 0; i < k; ++i) {
    std::swap(spot[i], spot[i + rng.Uniform(spot.size() - i)]);
  }
  spot.resize(k);
  return spot;
}

std::vector<std::string> ZoneLoss(const Scheduler& scheduler, const std::vector<NodeSpec>& nodes,
                                  const std::string& zone) {
  std::vector<std::string> out;
  for (const NodeSpec& n : nodes) {
    auto view = scheduler.Node(n.name);
    if (view && view->labels.count(kZoneLabel) && view->labels.at(kZoneLabel) == zone) {
      out.push_back(n.name);
    }
  }
  return out;
}

}  // namespace troupe::scheduler::sim
