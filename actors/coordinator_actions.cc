// The coordinator actor's hands (coordinator_actor.h): each action of CoordinatorCore carried out
// once LeaseGate lets it out — a message to a rank or to the driver, a timer, the record saved,
// a checkpoint's manifest committed, a chaos fault, a committed step's line and the job's report.
#include <signal.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator_actor.h"
#include "troupe/base/clock.h"
#include "troupe/base/crash_point.h"
#include "troupe/runtime/faults.h"
#include "troupe/runtime/status.h"
#include "troupe/train/coordinator_record.h"

namespace troupe::actors::internal {

using Kind = train::CoordinatorAction::Kind;

void Coordinator::Do(const train::CoordinatorAction& a) {
  switch (a.kind) {
    case Kind::kSaveRecord:
      if (absl::Status s =
              train::SaveCoordinatorRecord(train::PosixFileSystem(), StatePath(), a.record);
          !s.ok()) {
        Stop(caf::make_message(JobFailed{WireStatus::From(s)}));
      }
      return;
    case Kind::kAbort:
      return Send(a.worker, caf::make_message(AbortBelow{a.generation}));
    case Kind::kConfigure: {
      stepping_ = false;
      if (a.plan.rank == 0) kv_.clear();  // keys name their generation; older ones are dead
      train::GenerationPlan plan = a.plan;
      plan.epoch = gate_.epoch();
      return Send(a.worker, caf::make_message(ConfigureRank{a.generation, plan,
                                                            caf::actor_cast<caf::actor>(self_)}));
    }
    case Kind::kStep:
      if (!stepping_) step_start_ = base::MonotonicNow();
      stepping_ = true;
      return Send(a.worker, caf::make_message(RunStep{a.generation, a.step}));
    case Kind::kCommit:
      if (a.step >= 0) checkpoint_asked_.emplace(a.step, base::MonotonicNow());
      return Send(a.worker, caf::make_message(CommitRank{a.generation, a.step}));
    case Kind::kCheckpoint:
      return CommitCheckpoint(a);
    case Kind::kFinal:
      return Send(a.worker, caf::make_message(AskFinal{a.generation}));
    case Kind::kReadTable:
      return ReadTable(a.generation);
    case Kind::kTimer:
      self_->delayed_send(self_, std::chrono::duration_cast<std::chrono::microseconds>(a.delay),
                          timer_atom::value, a.timer);
      return;
    case Kind::kKillWorker:
    case Kind::kNodeFault:
    case Kind::kAddNode:
    case Kind::kCrashSelf:
    case Kind::kStallSelf:
    case Kind::kArmCrash:
      return DoChaos(a);
    case Kind::kReleaseNode:
      if (head_) self_->send(head_, runtime::release_node_atom::value, a.text);
      return;
    case Kind::kReleaseRank:
      return ReleaseRank(a.worker);
    case Kind::kEvict:
      return Send(a.worker, caf::make_message(Evict{a.generation, a.text}));
    case Kind::kMoveSelf:
      // An error exit: the job supervisor restarts this child where the scheduler places it now
      // (never on a draining node); the next incarnation resumes from the record just saved.
      gate_.Stop();
      self_->quit(runtime::StatusToError(absl::UnavailableError(
          "coordinator moving off its node, which got a preemption notice")));
      return;
    case Kind::kCommitted:
      return Committed(a);
    case Kind::kEvent: {
      base::SupervisionEvent e = a.event;
      // The core knows steps; the store knows where they are.
      if (e.event.rfind("checkpoint_", 0) == 0 || e.event == "final_checkpoint_failed") {
        e.Set("path", store_->StepDir(e.IntField("step")));
      }
      if (e.event == "fault_armed") armed_at_ns_ = absl::ToUnixNanos(absl::Now());
      return LogEvent(std::move(e));
    }
    case Kind::kFinish:
      return Finish(a);
    case Kind::kFail: {
      base::SupervisionEvent e = a.event;
      if (e.event == "final_checkpoint_failed") e.Set("path", store_->StepDir(e.IntField("step")));
      events_->Write(std::move(e));  // the driver reports the Status itself
      return Stop(caf::make_message(JobFailed{WireStatus::From(a.status)}));
    }
  }
}

// The job's chaos faults, carried out where the core armed them.
// A rank given up for another job, out of the generation: stopped, out of this job's watch first
// (its exit is no worker's death); the driver hears which.
void Coordinator::ReleaseRank(const std::string& worker) {
  if (auto r = ranks_.find(worker); r != ranks_.end()) {
    self_->demonitor(r->second.handle);
    self_->send_exit(r->second.handle, caf::exit_reason::user_shutdown);
    ranks_.erase(r);
  }
  self_->send(driver_, give_up_atom::value, worker);
}

void Coordinator::DoChaos(const train::CoordinatorAction& a) {
  switch (a.kind) {
    case Kind::kKillWorker:
      return Send(a.worker,
                  caf::make_message(ArmKill{a.step, a.signal, static_cast<int32_t>(a.fault),
                                            static_cast<int32_t>(a.point)}));
    case Kind::kNodeFault:
      return InjectNodeFault(a.worker, a.fault);
    case Kind::kAddNode:
      FaultFired(train::FaultKind::kJoinWorker, core_->committed(), a.text);
      return self_->send(driver_, AddNode{a.text});
    case Kind::kCrashSelf:
      FaultFired(train::FaultKind::kKillCoordinator, core_->committed());
      raise(SIGKILL);
      return;
    case Kind::kStallSelf:
      FaultFired(train::FaultKind::kStallCoordinator, core_->committed());
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(spec_.stall));
      return;
    case Kind::kArmCrash:
      FaultFired(train::FaultKind::kCrashInCheckpoint, a.step);
      base::ArmCrashPoint(a.text);
      return;
    default:
      return;
  }
}

// Chaos by name, through the head: the node agent carries it out on its own host (a preemption
// notice to itself, or a network fault on its host's links).
void Coordinator::InjectNodeFault(const std::string& worker, train::FaultKind kind) {
  auto it = ranks_.find(worker);
  if (it == ranks_.end() || !head_) return;
  runtime::NodeFault f;
  f.kind = kind == train::FaultKind::kSigtermNode     ? runtime::NodeFaultKind::kPreempt
           : kind == train::FaultKind::kSpotNotice    ? runtime::NodeFaultKind::kSpotNotice
           : kind == train::FaultKind::kPartitionNode ? runtime::NodeFaultKind::kPartition
           : kind == train::FaultKind::kOneWayNode    ? runtime::NodeFaultKind::kOneWay
           : kind == train::FaultKind::kFlapNode      ? runtime::NodeFaultKind::kFlap
           : kind == train::FaultKind::kDelayNode     ? runtime::NodeFaultKind::kDelay
                                                      : runtime::NodeFaultKind::kDrop;
  f.duration_ms = absl::ToInt64Milliseconds(spec_.network_fault);
  f.drop_percent = spec_.drop_percent;
  f.delay_us = absl::ToInt64Microseconds(spec_.delay);
  f.jitter_us = absl::ToInt64Microseconds(spec_.jitter);
  f.period_ms = absl::ToInt64Milliseconds(spec_.flap_period);
  FaultFired(kind, core_->committed(), it->second.node);
  self_->request(head_, Rpc(), runtime::node_fault_atom::value, it->second.node, f)
      .then([](bool) {},
            [this, kind](caf::error& e) {
              base::SupervisionEvent failed = train::JobEvent("fault_failed", "coordinator");
              failed.generation = core_->generation();
              failed.Set("kind", train::FaultKindName(kind)).reason = self_->system().render(e);
              LogEvent(std::move(failed));
            });
}

void Coordinator::CommitCheckpoint(const train::CoordinatorAction& a) {
  train::CheckpointManifest m;
  m.gpt_config = gpt_config_;
  m.num_params = num_params_;
  m.step = a.step;
  m.seed = spec_.seed;
  m.world_size = a.world;
  m.generation = static_cast<int64_t>(a.generation);
  m.optimizer_step = a.step;
  m.has_outer = spec_.lowcomm_groups > 0;  // the ranks' shards carry it (LowCommRank::AddOuter)
  m.shards = a.shards;
  absl::Status s = store_->Commit(m);
  if (s.ok()) {
    base::SupervisionEvent e = train::JobEvent("checkpoint_committed");
    e.generation = a.generation;
    e.Set("step", a.step).Set("path", store_->StepDir(a.step)).Set("world", a.world);
    uint64_t bytes = 0;
    for (const train::ShardFileInfo& f : a.shards) bytes += f.byte_size;
    e.Set("bytes", static_cast<int64_t>(bytes));
    if (auto asked = checkpoint_asked_.find(a.step); asked != checkpoint_asked_.end()) {
      e.Set("seconds",
            absl::StrFormat("%.6f", absl::ToDoubleSeconds(base::MonotonicNow() - asked->second)));
    }
    checkpoint_asked_.erase(checkpoint_asked_.begin(), checkpoint_asked_.upper_bound(a.step));
    LogEvent(std::move(e));
  }
  Execute(core_->OnCheckpointCommitted(a.step, s, Now()));
}

void Coordinator::NoteOuter(const StepDone& m) {
  if (m.outer_fragments.empty()) return;
  if (outer_.generation != m.generation || outer_.step != m.step) {
    outer_ =
        OuterRound{m.generation,     m.step, m.outer_fragments, m.outer_applied, m.outer_clipped,
                   m.outer_rejected, 0};
  }
  outer_.bytes += m.outer_bytes;
  outer_.feedback_error = std::max(outer_.feedback_error, m.outer_feedback_error);
  outer_.wait_seconds = std::max(outer_.wait_seconds, m.outer_wait_seconds);
}

// The committed step's outer round ([lowcomm]): into the event log ("outer_round": step,
// fragments, the groups applied, clipped and left out, bytes between groups, the slowest rank's
// wait for the exchange: wait_s) and the report;
// returns the progress line's part.
std::string Coordinator::LogOuter(const train::CoordinatorAction& a) {
  if (outer_.generation != a.generation || outer_.step != a.step - 1) return "";
  base::SupervisionEvent e = train::JobEvent("outer_round");
  e.generation = a.generation;
  e.Set("step", a.step)
      .Set("fragments", absl::StrJoin(outer_.fragments, ","))
      .Set("applied", absl::StrJoin(outer_.applied, ","))
      .Set("bytes", static_cast<int64_t>(outer_.bytes))
      .Set("wait_s", absl::StrFormat("%.4f", outer_.wait_seconds));
  if (!outer_.clipped.empty()) e.Set("clipped", absl::StrJoin(outer_.clipped, ","));
  if (!outer_.rejected.empty()) e.Set("rejected", absl::StrJoin(outer_.rejected, ","));
  if (outer_.feedback_error >= 0) {
    e.Set("feedback_error", absl::StrFormat("%.3g", outer_.feedback_error));
  }
  events_->Write(e);
  report_.outer_bytes += outer_.bytes;
  ++report_.outer_rounds;
  std::string line = absl::StrCat("  outer [", absl::StrJoin(outer_.applied, " "), "]");
  if (!outer_.rejected.empty()) {
    absl::StrAppend(&line, " rejected [", absl::StrJoin(outer_.rejected, " "), "]");
  }
  outer_ = OuterRound{};
  return line;
}

// An evaluation's result: into the event log ("eval": step, val_loss, the slowest rank's eval_s)
// and the report; returns the progress line's part.
std::string Coordinator::NoteEval(uint64_t generation, int64_t step, double loss) {
  base::SupervisionEvent e = train::JobEvent("eval");
  e.generation = generation;
  e.Set("step", step)
      .Set("val_loss", absl::StrFormat("%.6f", loss))
      .Set("eval_s", absl::StrFormat("%.6f", eval_seconds_));
  events_->Write(e);
  eval_seconds_ = 0;
  report_.val_losses.emplace_back(step, loss);
  return absl::StrFormat("val_loss@%d %.4f", step, loss);
}

void Coordinator::Committed(const train::CoordinatorAction& a) {
  const absl::Time now = base::MonotonicNow();
  commits_ << (a.step - 1) << " " << a.generation << std::endl;
  const double secs = absl::ToDoubleSeconds(now - step_start_);
  const int64_t step_tokens = int64_t{spec_.model.microbatches} * tokens_per_microbatch_;
  compute_seconds_ += secs;
  tokens_ += step_tokens;
  stepping_ = false;
  report_.losses.push_back(a.loss);
  const double tokens_per_s = step_tokens / std::max(secs, 1e-9);
  std::string line =
      absl::StrFormat("step %4d/%d  loss %.4f  tok/s %7.0f  world %d  gen %d", a.step, spec_.steps,
                      a.loss, tokens_per_s, a.world, a.generation);
  base::SupervisionEvent step = train::JobEvent("step");
  step.generation = a.generation;
  step.Set("step", a.step)
      .Set("loss", absl::StrFormat("%.6f", a.loss))
      .Set("tokens_per_s", absl::StrFormat("%.1f", tokens_per_s))
      .Set("step_s", absl::StrFormat("%.6f", secs))
      .Set("world", a.world);
  if (norm_.step == a.step - 1 && norm_.generation == a.generation && norm_.agree) {
    step.Set("grad_norm", absl::StrFormat("%.17g", norm_.value));  // every bit
  }
  events_->Write(step);
  if (a.eval_step >= 0) {
    absl::StrAppend(&line, "  ", NoteEval(a.generation, a.eval_step, a.eval_loss));
  }
  absl::StrAppend(&line, LogOuter(a));
  if (a.recovered) {
    // From the newest fault_fired event (the dying process wrote it, with its wall time) to now:
    // a time across processes, so the wall clock.
    std::optional<base::SupervisionEvent> fault =
        train::NewestRecoveryFault(train::ReadEventLog(train::EventLogPath(spec_.work_dir)));
    // Only a fault that struck since the newest was armed: a kill mid-checkpoint strikes on the
    // writer thread, which a commit may beat; an older fault's time would be no recovery's.
    if (fault && fault->IntField("at_ns", 0) > 0 && fault->IntField("at_ns") >= armed_at_ns_) {
      const double r =
          absl::ToDoubleSeconds(absl::Now() - absl::FromUnixNanos(fault->IntField("at_ns")));
      if (report_.recovery_seconds < 0) report_.recovery_seconds = r;
      base::SupervisionEvent e = train::JobEvent("recovered");
      e.generation = a.generation;
      e.Set("step", a.step).Set("seconds", absl::StrFormat("%.3f", r));
      e.Set("fault", fault->Field("kind"));
      events_->Write(e);
      absl::StrAppend(&line, "  | ", train::DescribeEvent(e));
    }
  }
  Print(line);
}

void Coordinator::Finish(const train::CoordinatorAction& a) {
  // Everything the core keeps comes from its record, once, here.
  const train::CoordinatorRecord& record = core_->record();
  JobReport r = report_;
  r.final_params_crc32c = static_cast<uint32_t>(a.crc);
  r.num_params = a.num_params;
  r.committed_steps = a.step;
  r.generations = static_cast<int>(record.generation);
  r.steps_lost = record.steps_lost;
  r.final_world = static_cast<int>(record.active.size());
  r.tokens_per_second = compute_seconds_ > 0 ? tokens_ / compute_seconds_ : 0.0;
  r.bubble = rank_schedule_seconds_ > 0 ? 1.0 - rank_compute_seconds_ / rank_schedule_seconds_ : 0;
  r.overlap = rank_exchange_seconds_ > 0 ? 1.0 - rank_exposed_seconds_ / rank_exchange_seconds_ : 0;
  if (rank_steps_ > 0) {
    const double n = static_cast<double>(rank_steps_);
    r.step_seconds = rank_step_seconds_ / n;
    r.compute_seconds = rank_compute_seconds_ / n;
    r.exposed_seconds = rank_exposed_seconds_ / n;
    r.update_seconds = rank_update_seconds_ / n;
    r.delta_share = static_cast<double>(rank_delta_steps_) / n;
  }
  if (a.eval_step >= 0) {
    Print(NoteEval(a.generation, a.eval_step, a.eval_loss) + " (the final parameters)");
    r.val_step = a.eval_step;
    r.val_loss = a.eval_loss;
  }
  Stop(caf::make_message(std::move(r)));
}

// Tells the driver how the job ended, stops every rank and quits.
void Coordinator::Stop(caf::message to_driver) {
  if (gate_.stopped()) return;
  gate_.Stop();
  self_->send(driver_, std::move(to_driver));
  for (const auto& [w, r] : ranks_) self_->send_exit(r.handle, caf::exit_reason::user_shutdown);
  self_->quit();
}

void Coordinator::ReadTable(uint64_t generation) {
  auto reply = [this, generation](std::vector<std::string> dead) {
    Execute(core_->OnTable(generation, dead, Now()));
  };
  if (!head_) return reply({});
  self_->request(head_, Rpc(), runtime::members_table_atom::value)
      .then(
          [reply](const std::vector<runtime::MemberInfo>& table) {
            std::vector<std::string> dead;
            for (const runtime::MemberInfo& m : table) {
              if (m.kind == runtime::MemberKind::kWorker && m.state == runtime::MemberState::kDead)
                dead.push_back(m.id);
            }
            reply(dead);
          },
          [reply](caf::error&) { reply({}); });
}

}  // namespace troupe::actors::internal
