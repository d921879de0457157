// Seeded generators for the scheduler simulator: heterogeneous clusters, workloads (actors and
// placement groups) and failure traces (spot preemption waves, zone loss). Same seed, same
// output, on any platform (sim/rng.h).
//
//   ClusterShape shape;
//   shape.nodes = 1000;
//   std::vector<NodeSpec> nodes = GenerateCluster(7, shape);
//   SplitMix64 rng(7);
//   ActorRequest a = RandomActor(rng, 0, WorkloadShape{}, /*zones=*/4);
//   std::vector<std::string> wave = PreemptionWave(rng, scheduler, 0.3);
#ifndef TROUPE_SCHEDULER_SIM_GENERATORS_H_
#define TROUPE_SCHEDULER_SIM_GENERATORS_H_

#include <string>
#include <vector>

#include "sim/rng.h"
#include "troupe/scheduler/scheduler.h"
#include "troupe/scheduler/types.h"

namespace troupe::scheduler::sim {

struct ClusterShape {
  int nodes = 1000;
  double spot_fraction = 0.5;  // share of nodes labelled spot=true
  int zones = 4;               // labels zone=z0..z(zones-1)
};

// Node types: cpu-16 (40%), cpu-64 (30%), gpu-4 (20%), gpu-8 (10%); names "node-<i>".
std::vector<NodeSpec> GenerateCluster(uint64_t seed, const ClusterShape& shape);

struct WorkloadShape {
  double gpu_fraction = 0.08;            // actors asking for GPUs
  double selector_fraction = 0.05;       // actors pinned to a random zone
  double anti_affinity_fraction = 0.02;  // replicas: not in the zone of the previous actor
  double spread_fraction = 0.3;          // SPREAD instead of PACK
};

// Actor "actor-<i>" with a random mix of demands, selectors, spot preference and affinity.
ActorRequest RandomActor(SplitMix64& rng, int i, const WorkloadShape& shape, int zones);
// Group "group-<i>" of up to max_bundles bundles with a random strategy and domain key.
PlacementGroupRequest RandomGroup(SplitMix64& rng, int i, int max_bundles, int zones);

// A preemption wave: `fraction` of the scheduler's alive spot nodes, chosen at random.
std::vector<std::string> PreemptionWave(SplitMix64& rng, const Scheduler& scheduler,
                                        const std::vector<NodeSpec>& nodes, double fraction);
// Zone loss: every alive node of the zone.
std::vector<std::string> ZoneLoss(const Scheduler& scheduler, const std::vector<NodeSpec>& nodes,
                                  const std::string& zone);

}  // namespace troupe::scheduler::sim

#endif  // TROUPE_SCHEDULER_SIM_GENERATORS_H_
