#include "fault_schedule.h"

#include <signal.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "troupe/train/job_events.h"

namespace troupe::train {

using Kind = CoordinatorAction::Kind;

namespace {

void MarkFired(const std::vector<Fault>& faults, size_t i, CoordinatorRecord* record) {
  record->fired.insert(static_cast<int32_t>(i));
  if (FaultAwaitsRecovery(faults[i].kind)) record->awaiting_recovery = true;
}

CoordinatorAction Armed(base::SupervisionEvent event, uint64_t generation) {
  CoordinatorAction a{Kind::kEvent};
  a.event = std::move(event);
  a.event.generation = generation;
  return a;
}

// A worker kills (or stops) itself with `signal` in the fault's step.
CoordinatorAction Kill(const Fault& f, const std::string& worker, int32_t signal) {
  CoordinatorAction a{Kind::kKillWorker};
  a.worker = worker;
  a.step = f.step;
  a.signal = signal;
  a.fault = f.kind;
  a.point = f.point;
  return a;
}

}  // namespace

std::vector<size_t> TakeDueFaults(const std::vector<Fault>& faults, int64_t step,
                                  CoordinatorRecord* record, bool mid_checkpoint) {
  std::vector<size_t> due;
  for (size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    if (record->fired.count(static_cast<int32_t>(i)) || f.step != step ||
        f.kind == FaultKind::kCrashInCheckpoint ||
        (f.point == StepPoint::kCheckpoint) != mid_checkpoint) {
      continue;
    }
    due.push_back(i);
    MarkFired(faults, i, record);
  }
  return due;
}

std::optional<size_t> TakeCheckpointCrash(const std::vector<Fault>& faults, int64_t step,
                                          CoordinatorRecord* record) {
  for (size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    if (f.kind != FaultKind::kCrashInCheckpoint || record->fired.count(static_cast<int32_t>(i)) ||
        f.step > step) {
      continue;
    }
    MarkFired(faults, i, record);
    return i;
  }
  return std::nullopt;
}

int FaultRank(int32_t requested, int world) {
  const int r = requested < 0 ? 1 : requested;
  return std::min<int>(r, world - 1);
}

FiredFault FireFault(const Fault& f, const FaultTargets& t) {
  FiredFault out;
  std::vector<CoordinatorAction>& actions = out.actions;
  base::SupervisionEvent armed = JobEvent("fault_armed");
  armed.Set("kind", FaultKindName(f.kind)).Set("step", f.step);
  const int world = static_cast<int>(t.workers.size());
  switch (f.kind) {
    case FaultKind::kKillWorker:
    case FaultKind::kStopWorker:
    case FaultKind::kHangWorker:
    case FaultKind::kClockStep:
    case FaultKind::kCorruptUpdate: {
      const int r = FaultRank(f.arg, world);
      armed.Set("rank", r).Set("worker", t.workers[r]).Set("point", StepPointName(f.point));
      actions.push_back(Armed(armed, t.generation));
      // Only kill-worker and stop-worker take the process down: the others leave it (signal 0).
      const int sig = f.kind == FaultKind::kKillWorker   ? SIGKILL
                      : f.kind == FaultKind::kStopWorker ? SIGSTOP
                                                         : 0;
      actions.push_back(Kill(f, t.workers[r], sig));
      break;
    }
    case FaultKind::kDiskFull:
    case FaultKind::kDiskFail:
    case FaultKind::kDiskSlow:
      actions.push_back(Armed(armed, t.generation));
      break;
    case FaultKind::kKillShardAndBuddy: {
      const int r = FaultRank(f.arg, world);
      const int buddy = (r + t.buddy) % world;
      armed.Set("rank", r).Set("worker", t.workers[r]);
      armed.Set("buddy_rank", buddy).Set("buddy", t.workers[buddy]);
      armed.Set("point", StepPointName(f.point));
      actions.push_back(Armed(armed, t.generation));
      actions.push_back(Kill(f, t.workers[r], SIGKILL));
      actions.push_back(Kill(f, t.workers[buddy], SIGKILL));
      break;
    }
    case FaultKind::kSigtermNode:
    case FaultKind::kSpotNotice:
    case FaultKind::kPartitionNode:
    case FaultKind::kDropNode:
    case FaultKind::kDelayNode:
    case FaultKind::kOneWayNode:
    case FaultKind::kFlapNode: {
      const int r = FaultRank(f.arg, world);
      actions.push_back(
          Armed(armed.Set("worker", t.workers[r]).Set("node", t.nodes[r]), t.generation));
      CoordinatorAction a{Kind::kNodeFault};
      a.worker = t.workers[r];
      a.fault = f.kind;
      actions.push_back(std::move(a));
      break;
    }
    case FaultKind::kJoinWorker: {
      CoordinatorAction a{Kind::kAddNode};
      // join-worker@S:Z: the node joins zone g<Z> ([lowcomm] groups on the embedded cluster).
      a.text = absl::StrCat("join", f.step, f.arg >= 0 ? absl::StrCat("-g", f.arg) : "");
      actions.push_back(Armed(armed.Set("node", a.text), t.generation));
      actions.push_back(std::move(a));
      out.await_join = true;
      out.hold = true;
      break;
    }
    case FaultKind::kKillCoordinator:
      actions.push_back(Armed(armed, t.generation));
      actions.emplace_back(Kind::kCrashSelf);
      out.hold = true;
      break;
    case FaultKind::kStallCoordinator:
      actions.push_back(Armed(armed, t.generation));
      actions.emplace_back(Kind::kStallSelf);
      break;
    case FaultKind::kCrashInCheckpoint:
    case FaultKind::kKillHead:  // the runner's (ParseJobSpec refuses them in a job)
    case FaultKind::kStopHead:
      break;
  }
  return out;
}

FiredFault ArmCheckpointCrash(int64_t step, uint64_t generation) {
  FiredFault out;
  out.actions.push_back(Armed(JobEvent("fault_armed")
                                  .Set("kind", FaultKindName(FaultKind::kCrashInCheckpoint))
                                  .Set("step", step),
                              generation));
  CoordinatorAction arm{Kind::kArmCrash};
  arm.text = "checkpoint.publish";
  arm.step = step;
  out.actions.push_back(std::move(arm));
  return out;
}

}  // namespace troupe::train
