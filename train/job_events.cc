#include "troupe/train/job_events.h"

#include <fstream>
#include <initializer_list>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace troupe::train {

using base::SupervisionEvent;

std::string EventLogPath(const std::string& work_dir) { return work_dir + "/logs/events.log"; }

SupervisionEvent JobEvent(const std::string& name, const std::string& child,
                          const std::string& supervisor) {
  SupervisionEvent e;
  e.supervisor = supervisor;
  e.child = child;
  e.event = name;
  return e;
}

bool FaultAwaitsRecovery(FaultKind kind) {
  // A drain and a join are planned; a network fault may heal before anyone notices it.
  return kind != FaultKind::kSigtermNode && kind != FaultKind::kJoinWorker &&
         kind != FaultKind::kPartitionNode && kind != FaultKind::kDropNode &&
         kind != FaultKind::kStallCoordinator && kind != FaultKind::kDelayNode &&
         kind != FaultKind::kOneWayNode && kind != FaultKind::kFlapNode && !IsDiskFault(kind) &&
         kind != FaultKind::kSpotNotice && kind != FaultKind::kClockStep &&
         kind != FaultKind::kCorruptUpdate;
}

namespace {

// By the name a fault_fired event carries; the job spec's table of kinds is the only one.
bool FaultAwaitsRecovery(const std::string& kind_name) {
  absl::StatusOr<Fault> f = ParseFault(absl::StrCat(kind_name, "@0"));
  return f.ok() && FaultAwaitsRecovery(f->kind);
}

// " — why" when the event has a reason.
std::string Why(const SupervisionEvent& e) { return e.reason.empty() ? "" : " — " + e.reason; }

std::string DescribeSource(const SupervisionEvent& e) {
  const std::string source = e.Field("source");
  if (source == "owners") return "memory (owners)";
  if (source == "mirrors") return "memory (owners + buddy mirrors)";
  if (source == "replicas") return "memory (the survivors' replicated optimizer state)";
  if (source == "checkpoint") return absl::StrCat("checkpoint step-", e.Field("step"));
  if (source == "seed") return "initialisation (seed)";
  return source;
}

std::string DescribeFaultArmed(const SupervisionEvent& e) {
  const std::string kind = e.Field("kind");
  const std::string step = e.Field("step");
  const std::string point = e.Field("point");
  const std::string when =
      point == "mid-checkpoint"
          ? absl::StrCat("while it writes its shard of checkpoint step-", step)
      : point == "mid-gather"
          ? absl::StrCat("in the middle of step ", step, "'s parameter gather")
          : absl::StrCat("in the middle of step ", step, "'s gradient exchange");
  if (kind == "kill-worker" || kind == "stop-worker" || kind == "hang-worker") {
    const char* what = kind == "stop-worker"   ? "SIGSTOP of"
                       : kind == "hang-worker" ? "the step stuck (the process alive) on"
                                               : "kill -9 of";
    return absl::StrCat("chaos: ", what, " rank ", e.Field("rank"), " (", e.Field("worker"), ") ",
                        when);
  }
  if (kind == "disk-full" || kind == "disk-fail" || kind == "disk-slow") {
    return absl::StrCat("chaos: the checkpoint disk ",
                        kind == "disk-full"   ? "full (writes fail with ENOSPC)"
                        : kind == "disk-fail" ? "failing (fsync fails with EIO)"
                                              : "slow (writes wait [chaos] disk_delay)",
                        " for the checkpoints from step ", step);
  }
  if (kind == "kill-shard-and-buddy") {
    return absl::StrCat("chaos: kill -9 of shard owner rank ", e.Field("rank"),
                        " and its buddy rank ", e.Field("buddy_rank"), " ", when);
  }
  if (kind == "sigterm-node") {
    return absl::StrCat("chaos: SIGTERM to node ", e.Field("node"), " before step ", step);
  }
  if (kind == "spot-notice") {
    return absl::StrCat("chaos: the cloud's spot notice to node ", e.Field("node"),
                        " through its metadata endpoint, before step ", step);
  }
  if (kind == "clock-step") {
    return absl::StrCat("chaos: the wall clock of rank ", e.Field("rank"), " (", e.Field("worker"),
                        ") steps ([chaos] clock_step) ", when);
  }
  if (kind == "partition-node" || kind == "drop-node") {
    return absl::StrCat("chaos: node ", e.Field("node"), "'s host ",
                        kind == "partition-node" ? "cut off from the other hosts"
                                                 : "dropping packets to and from the others",
                        " for a while ([chaos] network_fault), before step ", step);
  }
  if (kind == "oneway-node" || kind == "flap-node") {
    return absl::StrCat("chaos: node ", e.Field("node"), "'s host ",
                        kind == "oneway-node"
                            ? "sending into the void (what it sends is dropped, not what it gets)"
                            : "cut off from the other hosts and restored in turn ([chaos] "
                              "flap_period)",
                        " for a while ([chaos] network_fault), before step ", step);
  }
  if (kind == "delay-node") {
    return absl::StrCat("chaos: node ", e.Field("node"),
                        "'s host holding every packet to and from the others ([chaos] delay) for a "
                        "while ([chaos] network_fault), before step ",
                        step);
  }
  if (kind == "join-worker") {
    return absl::StrCat("chaos: a node with one worker joins before step ", step,
                        "; the step waits for it");
  }
  if (kind == "stall-coordinator") {
    return absl::StrCat("chaos: the coordinator stalls for a while ([chaos] stall) before step ",
                        step);
  }
  if (kind == "kill-coordinator") {
    return absl::StrCat("chaos: kill -9 of the coordinator's process before step ", step);
  }
  if (kind == "crash-in-checkpoint") {
    return absl::StrCat(
        "chaos: kill -9 of the coordinator's process in the middle of committing checkpoint "
        "step-",
        step, " (manifest written, LATEST not yet moved)");
  }
  return absl::StrCat("chaos: ", kind, " at step ", step);
}

// Who is in the job, who leaves and who joins: the generations and what forms them.
std::optional<std::string> DescribeMembership(const SupervisionEvent& e) {
  const std::string& n = e.event;
  if (n == "generation") {
    return absl::StrCat("generation ", e.generation, ": world ", e.Field("world"), " [",
                        e.Field("workers"), "] at step ", e.Field("step"), ", state from ",
                        DescribeSource(e), Why(e));
  }
  if (n == "waiting") {
    return absl::StrCat("waiting for workers: ", e.Field("usable"), " usable, min_workers ",
                        e.Field("min_workers"), " (", e.reason, ")");
  }
  if (n == "worker_down") {
    const std::string workers = e.Field("workers");
    return absl::StrCat(workers.find(' ') == std::string::npos ? "worker " : "workers ", workers,
                        " down (", e.reason, ")");
  }
  if (n == "join_folded") {
    return absl::StrCat("worker ", e.child, " joined; folded in at the next step boundary");
  }
  if (n == "join_failed") {
    return absl::StrCat("worker ", e.child, ": its rank actor is gone", Why(e));
  }
  if (n == "drain") {
    return absl::StrCat("node ", e.Field("node"), " draining (", e.reason, "): worker ", e.child,
                        " leaves at the next step boundary");
  }
  if (n == "join_timeout") return "the joining worker did not arrive in time; going on without it";
  return std::nullopt;
}

// Preemption notices, failures (a step's, a process's) and the recovery that follows.
std::optional<std::string> DescribeRecovery(const SupervisionEvent& e) {
  const std::string& n = e.event;
  if (n == "handover_checkpoint") {
    return absl::StrCat("nodes ", e.Field("node"), " leave (", e.reason, "): checkpointing step ",
                        e.Field("step"), " first, while their ranks are alive");
  }
  if (n == "coordinator_moving") {
    return absl::StrCat("the coordinator's node ", e.Field("node"),
                        " got a preemption notice: the coordinator moves first, at step ",
                        e.Field("step"));
  }
  if (n == "preempted") {
    return absl::StrCat("preempted at step ", e.Field("step"), ": ", e.reason);
  }
  if (n == "recovering") {
    const std::string what =
        e.Field("during") == "step" ? absl::StrCat("step ", e.Field("step")) : "configure";
    return absl::StrCat(what, " failed on ", e.child, ": ", e.reason);
  }
  if (n == "recovered") {
    return absl::StrCat("recovered: ", e.Field("seconds"), " s from the fault (", e.Field("fault"),
                        ") to the commit of step ", e.Field("step"));
  }
  if (n == "eval") {
    return absl::StrCat("validation loss ", e.Field("val_loss"), " after step ", e.Field("step"),
                        " (", e.Field("eval_s"), " s)");
  }
  if (n == "process_exit") {
    const bool node = e.reason.rfind("node_dead", 0) == 0;
    return absl::StrCat(node ? "node agent " : "worker ", e.child,
                        e.pid ? absl::StrCat(" (pid ", e.pid, ")") : "",
                        " down: ", base::ExitCauseName(e.cause), " — ", e.reason);
  }
  return std::nullopt;
}

// The chaos faults ([chaos]) and the checkpoints.
std::optional<std::string> DescribeFaultOrCheckpoint(const SupervisionEvent& e) {
  const std::string& n = e.event;
  if (n == "fault_armed") return DescribeFaultArmed(e);
  if (n == "fault_fired") {
    return absl::StrCat("chaos: ", e.Field("kind"), " carried out by ", e.child, " (pid ", e.pid,
                        ") at step ", e.Field("step"));
  }
  if (n == "fault_failed") return absl::StrCat("chaos: ", e.Field("kind"), " failed", Why(e));
  if (n == "evicted") {
    return absl::StrCat("worker ", e.child, " (pid ", e.pid, ") evicted: its process ends", Why(e));
  }
  if (n == "checkpoint_committed")
    return absl::StrCat("checkpoint ", e.Field("path"), " committed");
  if (n == "checkpoint_dropped") {
    const std::string shard = e.Field("shard");
    return absl::StrCat("warning: checkpoint step-", e.Field("step"),
                        shard.empty() ? "" : absl::StrCat(": shard ", shard), ": ", e.reason,
                        " (dropped; training goes on)");
  }
  if (n == "final_checkpoint_failed") {
    return absl::StrCat("the final checkpoint step-", e.Field("step"), " (", e.Field("path"),
                        ") cannot be written: ", e.reason);
  }
  return std::nullopt;
}

// The coordinator's own life: its exits and restarts (the job supervisor's events), its lease,
// the head it answers to, the job's end.
std::optional<std::string> DescribeCoordinator(const SupervisionEvent& e) {
  const std::string& n = e.event;
  if (n == "job_failed") return absl::StrCat("the job cannot go on: ", e.reason);
  if (n == "exit") {
    return absl::StrCat(e.child, " (incarnation ", e.generation, ") exited: ", e.reason,
                        e.decision.empty() ? "" : absl::StrCat("; ", e.decision));
  }
  if (n == "escalate") return absl::StrCat(e.supervisor, " gives up: ", e.reason);
  if (n == "coordinator_restarted") {
    const std::string ckpt = e.Field("checkpoint");
    return absl::StrCat("coordinator restarted (pid ", e.pid,
                        "): resuming from the committed-step record (step ", e.Field("step"),
                        ", generation ", e.generation,
                        "); newest valid checkpoint: ", ckpt.empty() ? e.reason : ckpt);
  }
  if (n == "lease_lost") {
    return absl::StrCat("coordinator (pid ", e.pid, ") lost its lease (epoch ", e.Field("epoch"),
                        "): ", e.reason, "; it stops, ", e.Field("held"),
                        " actions undone (no record, commit or checkpoint from it)");
  }
  if (n == "head_lost") {
    return absl::StrCat("the cluster's head is lost (", e.reason, ") at step ", e.Field("step"),
                        ": training goes on while the lease runs, then waits at a step boundary "
                        "for the head that takes over");
  }
  if (n == "head_back") {
    return absl::StrCat("a head took over after ", e.Field("after_ms"), " ms (at step ",
                        e.Field("step"), "): the job goes on under its lease");
  }
  return std::nullopt;
}

}  // namespace

std::string DescribeEvent(const SupervisionEvent& e) {
  // Each event name is described by exactly one of these; the rest keep their log form.
  for (auto describe :
       {DescribeMembership, DescribeRecovery, DescribeFaultOrCheckpoint, DescribeCoordinator}) {
    if (std::optional<std::string> text = describe(e)) return *std::move(text);
  }
  return base::FormatEvent(e);
}

std::string EventProgressLine(const SupervisionEvent& e) {
  return absl::StrCat(absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::LocalTimeZone()),
                      "event: ", DescribeEvent(e));
}

void EventLog::Write(SupervisionEvent e) {
  if (e.wall_time.time_since_epoch().count() == 0) e.wall_time = std::chrono::system_clock::now();
  log_.Write(base::FormatEvent(e));
}

std::vector<SupervisionEvent> ReadEventLog(const std::string& path) {
  std::vector<SupervisionEvent> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    SupervisionEvent e;
    if (base::ParseEvent(line, &e)) out.push_back(std::move(e));
  }
  return out;
}

std::optional<SupervisionEvent> NewestRecoveryFault(const std::vector<SupervisionEvent>& events) {
  std::optional<SupervisionEvent> newest;
  for (const SupervisionEvent& e : events) {
    if (e.event != "fault_fired" || !FaultAwaitsRecovery(e.Field("kind"))) continue;
    if (!newest || e.IntField("at_ns") >= newest->IntField("at_ns")) newest = e;
  }
  return newest;
}

}  // namespace troupe::train
