// fault_schedule.h — the job's chaos faults (JobSpec::faults, "kill-worker@5" …) as a schedule:
// which are due when, and what firing one does. Pure: CoordinatorCore asks it at each step
// boundary (TakeDueFaults, FireFault) and when a checkpoint is complete (TakeCheckpointCrash,
// ArmCheckpointCrash), and carries the answer out as its own actions.
//
// A fault fires at most once, across coordinator restarts: firing marks it in the record
// (CoordinatorRecord::fired), which the core saves before any action that carries it out.
//
//   std::vector<size_t> due = TakeDueFaults(faults, record.committed, &record);
//   for (size_t i : due) FiredFault f = FireFault(faults[i], targets);  // f.actions, f.hold …
//
// Not thread-safe (no state of its own; the record is the caller's).
#ifndef TROUPE_TRAIN_FAULT_SCHEDULE_H_
#define TROUPE_TRAIN_FAULT_SCHEDULE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "troupe/train/coordinator_core.h"
#include "troupe/train/job_spec.h"

namespace troupe::train {

// The faults due before step `step` (Fault::step == step), not yet fired: marked fired in
// `record` (and awaiting_recovery where the fault's recovery is measured); their indices, in the
// job's order. crash-in-checkpoint is not among them: it is armed when a checkpoint completes.
// `mid_checkpoint`: only the kills at the point mid-checkpoint, which fire as step `step`
// commits (before the ranks are told to write its checkpoint); otherwise only the others.
std::vector<size_t> TakeDueFaults(const std::vector<Fault>& faults, int64_t step,
                                  CoordinatorRecord* record, bool mid_checkpoint = false);

// The first crash-in-checkpoint fault due by the checkpoint of `step` (Fault::step <= step), not
// yet fired: marked fired in `record` (and awaiting recovery); nullopt if none.
std::optional<size_t> TakeCheckpointCrash(const std::vector<Fault>& faults, int64_t step,
                                          CoordinatorRecord* record);

// Whom a fault hits: the generation's workers by rank, the node of each, its buddy offset, and
// the generation (the fault_armed event's).
struct FaultTargets {
  std::vector<std::string> workers;
  std::vector<std::string> nodes;
  int32_t buddy = 1;
  uint64_t generation = 0;
};

// What firing one fault takes.
struct FiredFault {
  // Its fault_armed event (kEvent) first, then what carries it out: kKillWorker (one, or a rank
  // and its buddy; signal 0: hang-worker or clock-step), kNodeFault, kAddNode, kCrashSelf,
  // kStallSelf, kArmCrash. A disk fault is its event alone (the checkpoint stores carry it out).
  std::vector<CoordinatorAction> actions;
  // The step must not start now: this process dies (kill-coordinator), or a joiner is awaited.
  bool hold = false;
  // join-worker: the step waits for the joiner, or for the join_wait deadline (kAwaitingJoin).
  bool await_join = false;
};

// The rank a fault's argument names (-1: rank 1), within a group of `world` ranks.
int FaultRank(int32_t requested, int world);

// `fault`, due at a step boundary, on `targets`. Not for crash-in-checkpoint (ArmCheckpointCrash).
FiredFault FireFault(const Fault& fault, const FaultTargets& targets);

// crash-in-checkpoint, due by the checkpoint of `step` (complete, its manifest not yet
// committed): this process dies between the manifest and LATEST.
FiredFault ArmCheckpointCrash(int64_t step, uint64_t generation);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_FAULT_SCHEDULE_H_
