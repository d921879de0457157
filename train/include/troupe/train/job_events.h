// job_events.h — a training job's decisions and faults as structured events, in the job's one
// event log, <work_dir>/logs/events.log (the key=value lines of troupe/base/events.h), and the
// one place those events become the progress lines a person reads. Used by the coordinator, the
// rank actor and the driver.
//
// The coordinator (CoordinatorCore decides, the shell writes), a rank that carries out a fault
// and the driver all append to the same file, each line with one write(2). Tests and tools read
// it back with ParseEvent and assert fields, never wording:
//
//   ts=... supervisor=coordinator child="" gen=3 event=generation source=checkpoint step=10
//     steps_lost=2 trigger=worker_down workers="n0/w0 n1/w0 n3/w0" world=3 reason="..."
//
// Events (event=NAME, then the fields beyond supervisor/child/gen/reason):
//   generation             a generation is planned: world, workers, step (it starts from),
//                          source (owners|mirrors|replicas|checkpoint|seed), steps_lost (so far),
//                          trigger
//                          (start|workers|worker_down|drain|join|failure), down (trigger
//                          worker_down: the workers that left) or node (trigger drain)
//   waiting                too few usable workers: usable, min_workers, trigger, down / node
//   worker_down            workers (not in the running generation) are down: workers
//   join_folded            child joined; it is folded in at the next step boundary: node
//   join_failed            child's rank actor cannot be reached
//   drain                  child's node (node) drains: it leaves at the next step boundary
//   handover_checkpoint    noticed nodes (node: space-separated) leave and the survivors'
//                          memory cannot take their state: every rank checkpoints step first;
//                          leaving (workers), staying (how many), asked (false: the step's own
//                          checkpoint was being written already)
//   coordinator_moving     the coordinator's own node (node) got a notice: it stops at step (its
//                          record saved) and the job supervisor restarts it on another node
//   preempted              every worker was noticed: the job stops (step; checkpoint_saved:
//                          whether step is on disk) — run again to resume
//   recovering             a rank (child) reported a failure: during (configure|step), step
//   join_timeout           the joining worker of a join-worker fault did not arrive in time
//   fault_armed            the coordinator decided a chaos fault: kind, step, and rank/worker,
//                          buddy_rank/buddy, node as the kind needs
//   fault_fired            the process that carries a fault out, as it does (supervisor=rank:
//                          the rank that kills or stops itself, child its worker, with rank and
//                          signal; supervisor=coordinator otherwise): kind, step, at_ns (wall
//                          clock, ns since the epoch), pid
//   fault_failed           a fault could not be carried out: kind
//   checkpoint_committed   step, path, world
//   eval                   [eval]: the validation loss of the parameters after `step` steps:
//                          val_loss, eval_s (the slowest rank's share of it; 0 for the final one)
//   checkpoint_dropped     a checkpoint is given up, training goes on: step, path, shard (if one
//                          shard's write failed)
//   final_checkpoint_failed  the last step's checkpoint cannot be written: step, path, shard,
//                          code (the job then fails with a Status naming the file)
//   job_failed             the job cannot go on: code (the Status's), reason (its message)
//   coordinator_restarted  a new coordinator incarnation resumes: pid, step, checkpoint,
//                          checkpoint_step (the newest valid one; -1 if none)
//   lease_lost             the coordinator (pid) lost its lease (the head refused it or did not
//                          renew it in time): epoch, held (actions left undone: nothing more is
//                          recorded, committed or checkpointed by that incarnation)
//   head_lost              the coordinator lost its connection to the cluster's head: step (the
//                          committed one), reason; the job waits at a step boundary once its
//                          lease runs out
//   driver_lost            the job's driver (its process, or the connection to it) is gone: the
//                          coordinator stops every rank and quits (step: the committed one)
//   head_back              this process rejoined the head that took over: after_ms (since
//                          head_lost), step
//   recovered              the first commit after a fault: step, seconds (from the newest
//                          fault_fired's at_ns to the commit), fault (its kind)
//   process_exit           (base/events.h) a process died, as the head saw it
#ifndef TROUPE_TRAIN_JOB_EVENTS_H_
#define TROUPE_TRAIN_JOB_EVENTS_H_

#include <optional>
#include <string>
#include <vector>

#include "troupe/base/events.h"
#include "troupe/train/job_spec.h"
#include "troupe/train/line_log.h"

namespace troupe::train {

// <work_dir>/logs/events.log
std::string EventLogPath(const std::string& work_dir);

// An event of the job (supervisor=`supervisor`, child=`child`, event=`name`), fields to be set.
base::SupervisionEvent JobEvent(const std::string& name, const std::string& child = "",
                                const std::string& supervisor = "coordinator");

// A fault that kills or stops a process: the next commit measures the recovery from it.
bool FaultAwaitsRecovery(FaultKind kind);

// The human text of an event (without time): "generation 3: world 3 [a b c] at step 10, state
// from checkpoint step-10 — ...". Every progress line about an event is made here.
std::string DescribeEvent(const base::SupervisionEvent& e);
// "HH:MM:SS.mmm event: " + DescribeEvent(e), in local time, for the driver's terminal.
std::string EventProgressLine(const base::SupervisionEvent& e);

// Appends events to a job's event log, one write(2) per line; stamps wall_time if unset.
class EventLog {
 public:
  explicit EventLog(const std::string& path) : log_(path) {}
  void Write(base::SupervisionEvent e);

 private:
  LineLog log_;
};

// Every event in the log at `path`, in order (lines that do not parse are skipped).
std::vector<base::SupervisionEvent> ReadEventLog(const std::string& path);

// The newest fault_fired event of a kind that awaits recovery, from `events`.
std::optional<base::SupervisionEvent> NewestRecoveryFault(
    const std::vector<base::SupervisionEvent>& events);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_JOB_EVENTS_H_
