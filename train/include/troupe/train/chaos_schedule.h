// chaos_schedule.h — the random fault schedules of `troupe chaos run`: drawn from a seed, judged
// against what the faults allow, and shrunk when a trial fails. Pure (no process, no clock).
//
//   ChaosDraw draw{.kinds = OneHostFaultKinds(), .max_faults = 3, .steps = 60, .workers = 4};
//   std::vector<Fault> schedule = DrawSchedule(/*seed=*/1, /*trial=*/7, draw);
//   // run it; if an invariant failed, try ShrinkCandidates(schedule) in order, keep the first
//   // that still fails, and repeat.
//
// The same (seed, trial, draw) gives the same schedule on every machine: the generator and the
// arithmetic that maps its words to choices are troupe's own, not the standard library's
// distributions (whose results differ between implementations).
#ifndef TROUPE_TRAIN_CHAOS_SCHEDULE_H_
#define TROUPE_TRAIN_CHAOS_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "troupe/train/job_spec.h"

namespace troupe::train {

// What a trial may draw.
struct ChaosDraw {
  std::vector<FaultKind> kinds;  // the vocabulary (non-empty)
  int max_faults = 3;            // each trial draws 1..max_faults faults
  int64_t steps = 0;             // the job's steps: faults fall on steps 1..steps-1
  int64_t checkpoint_every = 0;  // crash-in-checkpoint falls on or before the last checkpoint
  int32_t workers = 4;           // the job's first world: ranks are drawn in [0, workers)
  int32_t min_workers = 1;       // the faults never take the world below this
  // The coordinator's process is one of the job's workers (a cluster the driver did not start,
  // as on the lab): killing it takes that worker too.
  bool coordinator_on_a_worker = false;
};

// The faults that act on one machine (the network kinds need hosts of their own: --lab).
std::vector<FaultKind> OneHostFaultKinds();
// The faults of a run on the lab's hosts: the one-machine kinds but join-worker (the driver of a
// job on a cluster it did not start starts no worker, so the step would wait out join_wait) and
// clock-step (one process's: the same on any host),
// every network kind (partition-node, oneway-node, flap-node, drop-node, delay-node), and the
// head's (kill-head, stop-head: the runner's to carry out, not the job's).
std::vector<FaultKind> LabFaultKinds();
// "kill-worker,stop-worker" -> kinds; an unknown name is InvalidArgument naming it and the list.
absl::StatusOr<std::vector<FaultKind>> ParseFaultKinds(const std::string& list);

// Trial `trial`'s schedule under `seed`: faults in step order. The workers removed (kill, stop,
// sigterm: one; kill-shard-and-buddy: two; a joiner is not counted on) never exceed
// workers - min_workers, so the job can always finish.
std::vector<Fault> DrawSchedule(uint64_t seed, int64_t trial, const ChaosDraw& draw);

// Smaller schedules to try after `schedule` failed, most reduced first: each fault removed, then
// each fault moved earlier (halfway to step 1; a mid-checkpoint kill to the checkpoint at or
// before that, a multiple of `checkpoint_every`).
std::vector<std::vector<Fault>> ShrinkCandidates(const std::vector<Fault>& schedule,
                                                 int64_t checkpoint_every = 0);

// "kill-worker@5:1 stop-worker@9" ("(none)" when empty).
std::string FormatSchedule(const std::vector<Fault>& schedule);

// The committed steps the schedule may lose: 0, unless a shard's owner and its buddy may die
// together (kill-shard-and-buddy, or two workers killed, stopped or cut off at one step), which
// rolls back to the newest durable checkpoint: at most checkpoint_every steps per such event,
// and one interval more for each checkpoint the schedule may leave undurable (covered by a full
// or failing disk, written by a slow one, or cut short by a kill mid-checkpoint).
int64_t StepsLostAllowed(const std::vector<Fault>& schedule, int64_t checkpoint_every,
                         bool coordinator_on_a_worker = false);

// The longest a fault of `kind` may take from firing to the next commit on one host (the
// `recovered` event's seconds): a kill is found at once (the liveness connection closes): 1 s;
// a stopped process only when silent for the liveness timeout: that + 1 s; a killed coordinator
// restarts from its record: 5 s; a stuck step when its peers' exchange and then bootstrap time
// out: collective + bootstrap + 2 retries + 1 s. Zero: the kind is not a failure (join, drain,
// stall) and has no bound.
absl::Duration RecoveryBound(FaultKind kind, const Timeouts& timeouts);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_CHAOS_SCHEDULE_H_
