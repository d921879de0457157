// spot_sim.h — what a spot/on-demand mix would give a job: a preemption trace replayed through
// troupe's own elastic policy (CoordinatorCore: generations, hand-overs, checkpoints, joins) and
// scheduler (where the coordinator lands, and where it goes when its machine does), in simulated
// time, with the step and re-plan times measured on real runs. `troupe sim spot` runs it.
//
// The trace (TOML; examples/spot/trace.toml):
//   [job]       steps, min_workers, max_workers
//   [cluster]   on_demand, spot: machines of one worker each (the mix the trace was taken on)
//   [timing]    step_s = [world 1, world 2, ...] (the last holds for larger worlds), replan_s (a
//               generation: configure until every rank is ready), detect_s (a machine lost
//               without notice: until its loss is seen), join_s (a new machine: until its worker
//               can be planned), checkpoint_s (a hand-over checkpoint: all shards written)
//   [[zone]]    name, spot_price_per_h, on_demand_price_per_h, preemptions_per_h (per spot
//               machine: drawn, seeded, when no [[preemption]] is listed), notice_s (0: none),
//               replace_s (a spot machine that leaves is replaced this long after, in its zone)
//   [[preemption]] at_s (from the first committed step), machine ("s1": spot machines s0, s1,
//               ... round-robin over the zones; replacements go on from s<spot>, in the zone of
//               the machine they replace)
// Machines: on-demand od0, od1, ... in the first zone; spot s0, s1, ...
#ifndef TROUPE_TRAIN_SPOT_SIM_H_
#define TROUPE_TRAIN_SPOT_SIM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::train {

struct SpotZone {
  std::string name;
  double spot_price_per_h = 0, on_demand_price_per_h = 0;
  double preemptions_per_h = 0;
  double notice_s = 0, replace_s = 0;
};

struct SpotPreemption {
  double at_s = 0;
  std::string machine;
};

struct SpotTrace {
  std::string file;
  int64_t steps = 100;
  int min_workers = 1, max_workers = 4;
  int on_demand = 1, spot = 3;
  std::vector<double> step_s = {0.05};
  double replan_s = 0.1, detect_s = 1.0, join_s = 1.0, checkpoint_s = 0.05;
  std::vector<SpotZone> zones;
  std::vector<SpotPreemption> preemptions;  // the replay; empty: drawn from the zones' rates
  uint64_t seed = 1;                        // for drawn preemptions
};

// Errors name the file, the field, what was expected and what was there.
[[nodiscard]] absl::StatusOr<SpotTrace> LoadSpotTrace(const std::string& path);
[[nodiscard]] absl::StatusOr<SpotTrace> ParseSpotTrace(const std::string& toml_text,
                                                       const std::string& file);

struct SpotOutcome {
  int on_demand = 0, spot = 0;  // the mix
  // From the first committed step to the last: the span goodput is measured over (a job's
  // start-up is the same for any mix).
  double seconds = 0;
  int64_t steps = 0;  // committed in that span (every step after the first)
  double goodput_steps_per_h = 0;
  double cost = 0;  // machine-hours × price, start to finish
  double cost_per_1k_steps = 0;
  int64_t steps_lost = 0;
  int generations = 0, preemptions = 0, handover_checkpoints = 0, coordinator_moves = 0;
  int ignored_preemptions = 0;  // [[preemption]]s of spot machines this mix does not have
  int final_world = 0;
  bool preempted = false;           // every worker was noticed: the job stopped (resumable)
  std::string coordinator_machine;  // where the scheduler first put the coordinator
};

// Runs `trace`'s job on `on_demand` + `spot` machines. A [[preemption]] of a spot machine the mix
// does not have (s5 of three) is ignored and counted; InvalidArgument for a mix without machines
// or one naming no spot machine at all ("od0").
[[nodiscard]] absl::StatusOr<SpotOutcome> SimulateSpot(const SpotTrace& trace, int on_demand,
                                                       int spot);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_SPOT_SIM_H_
