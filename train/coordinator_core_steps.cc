// CoordinatorCore (coordinator_core.h), its step boundary: a step started (faults fired first,
// noticed ranks handed over, joiners folded in), its replies, its commit, the checkpoints it
// asks for, the job's end, and the timers. Membership and generations: coordinator_core.cc.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fault_schedule.h"
#include "troupe/kernels/norm.h"
#include "troupe/train/coordinator_core.h"
#include "troupe/train/job_events.h"
#include "troupe/train/preempted.h"

namespace troupe::train {

using Kind = CoordinatorAction::Kind;

// ---- steps ---------------------------------------------------------------------------------

void CoordinatorCore::StartStep(Actions* out) {
  if (record_.committed >= options_.steps) return Finish(out);
  // The coordinator moves first, where the job can go on without its node (else it stays, and
  // the hand-over below checkpoints and stops the job as preempted).
  if (!own_node_.empty() && draining_nodes_.count(own_node_) && !notice_window_open_ &&
      StartableCount() >= options_.min_workers) {
    Save(out);
    Event(out,
          JobEvent("coordinator_moving").Set("node", own_node_).Set("step", record_.committed));
    phase_ = CoordinatorPhase::kDone;
    Emit(out, CoordinatorAction{Kind::kMoveSelf});
    return;
  }
  if (!notice_window_open_) {
    for (const std::string& w : group_) {
      if (members_[w].draining) return HandOver(out);
    }
  }
  int joiners = 0;
  const std::set<std::string> in_group(group_.begin(), group_.end());
  for (const auto& [w, m] : members_) {
    if (Usable(w) && !in_group.count(w)) ++joiners;
  }
  // [lowcomm]: where a round ends, so a new group starts from θ_global as the others do.
  const bool round_end =
      options_.lowcomm_round == 0 || record_.committed % options_.lowcomm_round == 0;
  const int grown = options_.lowcomm_round > 0
                        ? static_cast<int>(NextGroup(false).size())  // its groups' caps
                        : GridWorld(static_cast<int>(group_.size()) + joiners);
  if (joiners > 0 && round_end && grown > static_cast<int>(group_.size())) {
    return NewGeneration(out, "join", "folding in workers that joined, at this step boundary");
  }
  if (FireFaults(out)) return;
  phase_ = CoordinatorPhase::kStepping;
  losses_.clear();
  eval_losses_.clear();
  for (const std::string& w : group_) {
    pending_.insert(w);
    CoordinatorAction a{Kind::kStep};
    a.worker = w;
    a.generation = record_.generation;
    a.step = record_.committed;
    Emit(out, std::move(a));
  }
}

FaultTargets CoordinatorCore::Targets() const {
  FaultTargets targets;
  targets.workers = group_;
  for (const std::string& w : group_) {
    auto m = members_.find(w);
    targets.nodes.push_back(m == members_.end() ? "" : m->second.node);
  }
  targets.buddy = group_buddy_;
  targets.generation = record_.generation;
  return targets;
}

// The faults due before step `committed` (fault_schedule.h): recorded as fired and saved first,
// then carried out. True when the step must not start now (this process dies, or a joiner is
// awaited).
bool CoordinatorCore::FireFaults(Actions* out) {
  const std::vector<size_t> due = TakeDueFaults(options_.faults, record_.committed, &record_);
  if (due.empty()) return false;
  Save(out);
  const FaultTargets targets = Targets();
  bool hold = false;
  for (size_t i : due) {
    FiredFault fired = FireFault(options_.faults[i], targets);
    for (CoordinatorAction& a : fired.actions) Emit(out, std::move(a));
    if (fired.await_join) {
      phase_ = CoordinatorPhase::kAwaitingJoin;
      ArmTimer(out, TimerKind::kJoinWait, options_.join_wait);
    }
    hold |= fired.hold;
  }
  return hold;
}

std::vector<std::string> CoordinatorCore::Domains(const std::vector<std::string>& workers) const {
  std::vector<std::string> out;
  for (const std::string& w : workers) {
    auto it = members_.find(w);
    out.push_back(it == members_.end() ? "" : it->second.domain);
  }
  return out;
}

bool CoordinatorCore::MemoryRestorePossibleTo(const std::vector<std::string>& next) const {
  const std::vector<int> gone = Gone(next);
  if (options_.lowcomm_round == 0 || options_.replicated_state) {
    return MemoryRestorePossible(static_cast<int>(record_.active.size()), gone, record_.buddy,
                                 options_.replicated_state);
  }
  // Group by group (buddies inside a group: the next rank): a group with survivors restores from
  // them; one without any goes (or, on newcomers of its domain, starts from θ_global). The outer
  // state needs one survivor somewhere.
  const std::vector<std::string> old = Domains(record_.active);
  if (gone.size() >= old.size()) return false;
  // A restarted coordinator knows the domains of the workers that joined it again only: with a
  // group of the record unknown, no group plan can be cut (GroupPlanOf) — a checkpoint instead.
  if (std::find(old.begin(), old.end(), "") != old.end()) return false;
  for (const std::string& domain : std::set<std::string>(old.begin(), old.end())) {
    int members = 0;
    std::vector<int> lost;
    for (size_t o = 0; o < old.size(); ++o) {
      if (old[o] != domain) continue;
      if (std::binary_search(gone.begin(), gone.end(), static_cast<int>(o)))
        lost.push_back(members);
      ++members;
    }
    if (static_cast<int>(lost.size()) < members && !MemoryRestorePossible(members, lost, 1)) {
      return false;
    }
  }
  return true;
}

double CanonicalMean(const std::map<int32_t, double>& by_microbatch) {
  std::vector<double> l;
  for (const auto& [k, v] : by_microbatch) l.push_back(v);
  return l.empty() ? 0
                   : kernels::TreeSum(l.data(), static_cast<int64_t>(l.size())) /
                         static_cast<double>(l.size());
}

std::vector<CoordinatorAction> CoordinatorCore::OnStepped(uint64_t generation, int64_t step,
                                                          const std::string& worker,
                                                          const absl::Status& status,
                                                          const std::map<int32_t, double>& losses,
                                                          CoreTime, int32_t blamed,
                                                          const std::map<int32_t, double>& eval) {
  Actions out;
  if (generation == record_.generation && !status.ok()) Blame(worker, blamed);
  if (generation != record_.generation || step != record_.committed ||
      phase_ != CoordinatorPhase::kStepping || !pending_.count(worker)) {
    return out;
  }
  if (!status.ok()) {
    base::SupervisionEvent e = JobEvent("recovering", worker);
    e.Set("during", "step").Set("step", step).reason = status.ToString();
    Recover(&out, std::move(e),
            absl::StrCat("step ", step, " failed on ", worker, ": ", status.ToString()));
    return out;
  }
  for (const auto& [k, v] : losses) losses_[k] = v;
  for (const auto& [k, v] : eval) eval_losses_[k] = v;
  pending_.erase(worker);
  if (pending_.empty()) {
    CommitStep(&out);
  } else if (pending_.size() == 1 && options_.straggler > CoreDuration::zero()) {
    // All but one finished: the last one gets a deadline.
    ArmTimer(&out, TimerKind::kStraggler, options_.straggler);
  }
  return out;
}

void CoordinatorCore::CommitStep(Actions* out) {
  ++record_.committed;
  failed_generations_ = 0;
  suspects_.clear();
  reporters_.clear();
  blamed_failures_ = 0;
  blamed_generation_ = 0;
  int64_t ckpt = CheckpointAt(record_.committed);
  if (ckpt < 0 && CheckpointOwed()) ckpt = record_.committed;
  if (ckpt >= 0) {
    if (owed_boundary_ >= 0) owed_asked_ = ckpt;
    ExpectCheckpoint(ckpt);
  }
  CoordinatorAction done{Kind::kCommitted};
  done.step = record_.committed;
  done.generation = record_.generation;
  done.world = static_cast<int>(group_.size());
  done.loss = CanonicalMean(losses_);
  if (!eval_losses_.empty()) {
    done.eval_step = record_.committed - 1;  // evaluated before the step just committed
    done.eval_loss = CanonicalMean(eval_losses_);
  }
  done.recovered = record_.awaiting_recovery;
  record_.awaiting_recovery = false;
  losses_.clear();
  eval_losses_.clear();
  // Kills in the middle of this step's checkpoint: armed before the ranks are told to write it
  // (a rank hears of both in order), measured from the commit after the one just made.
  if (ckpt == record_.committed) {
    const std::vector<size_t> due =
        TakeDueFaults(options_.faults, record_.committed, &record_, /*mid_checkpoint=*/true);
    Save(out);
    for (size_t i : due) {
      for (CoordinatorAction& a : FireFault(options_.faults[i], Targets()).actions) {
        Emit(out, std::move(a));
      }
    }
  } else {
    Save(out);
  }
  CommitGroup(out, ckpt);
  Emit(out, std::move(done));
  StartStep(out);
}

// Ranks of noticed nodes leave at this step boundary, their state handed to the survivors:
// from memory (their owners' and buddies' — the generation's plan moves each range to its new
// owner) where that holds every range and enough workers stay; else, while the leaving ranks are
// still alive, every rank first writes a checkpoint of the committed step, and the generation
// after it reads that (nothing lost, though read back from disk). Every worker noticed: that
// checkpoint, then the job stops as preempted, to be resumed by running it again.
void CoordinatorCore::HandOver(Actions* out) {
  std::set<std::string> nodes;
  std::vector<std::string> leaving;
  for (const std::string& w : group_) {
    if (!members_[w].draining) continue;
    nodes.insert(members_[w].node);
    leaving.push_back(w);
  }
  const std::string node_list = absl::StrJoin(nodes, " ");
  const std::vector<std::string> next = NextGroup(false);
  const bool enough = !next.empty() && static_cast<int>(next.size()) >= options_.min_workers;
  const bool memory = enough && MemoryRestorePossibleTo(next);
  if (!memory && !CheckpointHolds(record_.committed) &&
      handover_asked_generation_ != record_.generation) {
    handover_asked_generation_ = record_.generation;
    phase_ = CoordinatorPhase::kHandingOver;
    // The step's own checkpoint may be on its way already (checkpoint.every): it serves.
    const bool asked = !checkpoints_.Contains(record_.committed);
    base::SupervisionEvent e = JobEvent("handover_checkpoint");
    e.Set("step", record_.committed)
        .Set("node", node_list)
        .Set("leaving", absl::StrJoin(leaving, " "))
        .Set("staying", static_cast<int64_t>(next.size()))
        .Set("asked", asked ? "true" : "false");
    e.reason = next.empty() ? "every worker got a preemption notice"
               : !enough    ? "fewer than min_workers would stay"
                            : "a leaving rank's buddy mirror leaves too";
    Event(out, std::move(e));
    if (asked) {
      ExpectCheckpoint(record_.committed);
      CommitGroup(out, record_.committed);
    }
    return;
  }
  if (next.empty()) {
    const bool saved = CheckpointHolds(record_.committed);
    base::SupervisionEvent e = JobEvent("preempted");
    e.Set("step", record_.committed)
        .Set("node", node_list)
        .Set("checkpoint_saved", saved ? "true" : "false");
    return Fail(out,
                PreemptedError(absl::StrCat(
                    "every worker got a preemption notice at step ", record_.committed,
                    saved ? absl::StrCat("; checkpoint step-", record_.committed,
                                         " holds every committed step")
                          : "; the checkpoint of the committed step could not be written",
                    ": run the same job again to resume")),
                std::move(e));
  }
  const bool given_up = std::all_of(leaving.begin(), leaving.end(),
                                    [&](const std::string& w) { return given_up_.count(w) > 0; });
  NewGeneration(
      out, "drain",
      given_up ? absl::StrCat(
                     leaving.size() == 1 ? "rank on " : "ranks on ", absl::StrJoin(leaving, " "),
                     " given up for a queued job of higher priority: ",
                     leaving.size() == 1 ? "it leaves" : "they leave", " at this step boundary")
               : absl::StrCat(nodes.size() == 1 ? "node " : "nodes ", node_list,
                              nodes.size() == 1 ? " is draining: its" : " are draining: their",
                              " ranks leave at this step boundary"),
      {{"node", node_list}}, /*hand_over=*/true);
}

void CoordinatorCore::OnStraggler(Actions* out) {
  const std::string late = *pending_.begin();
  const auto at = std::find(group_.begin(), group_.end(), late);
  if (at == group_.end()) return;
  const int32_t rank = static_cast<int32_t>(at - group_.begin());
  for (const std::string& w : group_) {
    if (w != late) Blame(w, rank);
  }
  const std::string why =
      absl::StrCat("step ", record_.committed, ": ", late, " (rank ", rank, ") still in it ",
                   std::chrono::duration_cast<std::chrono::seconds>(options_.straggler).count(),
                   " s after every peer finished it");
  base::SupervisionEvent e = JobEvent("recovering", late);
  e.Set("during", "step").Set("step", record_.committed).reason = why;
  Recover(out, std::move(e), why);
}

// ---- checkpoints ---------------------------------------------------------------------------

bool CoordinatorCore::CheckpointOwed() const {
  return owed_boundary_ >= 0 && record_.committed > owed_boundary_ &&
         last_checkpoint_ < owed_boundary_ && !checkpoints_.Contains(owed_asked_);
}

bool CoordinatorCore::CheckpointHolds(int64_t step) const {
  if (last_checkpoint_ >= step) return true;
  std::optional<int64_t> latest =
      options_.latest_checkpoint ? options_.latest_checkpoint() : std::nullopt;
  return latest && *latest >= step;
}

// Every rank of the group applies its staged state; and writes checkpoint `step` unless -1.
void CoordinatorCore::CommitGroup(Actions* out, int64_t checkpoint_step) {
  for (const std::string& w : group_) {
    CoordinatorAction a{Kind::kCommit};
    a.worker = w;
    a.generation = record_.generation;
    a.step = checkpoint_step;
    Emit(out, std::move(a));
  }
}

int64_t CoordinatorCore::CheckpointAt(int64_t step) const {
  if (step >= options_.steps) return step;
  return options_.checkpoint_every > 0 && step % options_.checkpoint_every == 0 ? step : -1;
}

// [lowcomm]: the first group's ranks write (shard i: its rank i), the others nothing.
void CoordinatorCore::ExpectCheckpoint(int64_t step) {
  int world = static_cast<int>(group_.size());
  if (options_.lowcomm_round > 0) {
    const std::vector<std::string> d = Domains(group_);
    world = static_cast<int>(std::count(d.begin(), d.end(), *std::min_element(d.begin(), d.end())));
  }
  checkpoints_.Expect(step, record_.generation, options_.num_params, world);
}

std::vector<CoordinatorAction> CoordinatorCore::OnShardWritten(uint64_t generation, int64_t step,
                                                               int32_t index,
                                                               const ShardFileInfo& info,
                                                               const absl::Status& status,
                                                               CoreTime) {
  Actions out;
  if (!checkpoints_.Accepts(step, generation) || phase_ == CoordinatorPhase::kDone) return out;
  if (!status.ok()) {
    checkpoints_.Erase(step);
    if (step == owed_asked_) owed_boundary_ = -1;  // not retried at every step on a failing disk
    const std::string what =
        absl::StrCat("checkpoint step-", step, ": shard ", index, ": ", status.ToString());
    // Training goes on without it; the last step's checkpoint is the job's result.
    if (step >= options_.steps) {
      base::SupervisionEvent e = JobEvent("final_checkpoint_failed");
      e.Set("step", step).Set("shard", index).reason = status.ToString();
      Fail(&out, absl::Status(status.code(), absl::StrCat("the final ", what)), std::move(e));
      return out;
    }
    base::SupervisionEvent e = JobEvent("checkpoint_dropped");
    e.Set("step", step).Set("shard", index).reason = status.ToString();
    Event(&out, std::move(e));
  } else if (checkpoints_.AddShard(step, index, info)) {
    CompleteCheckpoint(&out, step);
  }
  if (phase_ == CoordinatorPhase::kFinishing) Finish(&out);
  // The hand-over's checkpoint failed: the noticed ranks leave without it.
  if (HandOverCheckpointEnded()) StartStep(&out);
  return out;
}

// Every shard of `step` is on disk: the manifest and LATEST (crash-in-checkpoint dies between).
void CoordinatorCore::CompleteCheckpoint(Actions* out, int64_t step) {
  // Committing until OnCheckpointCommitted: Finish waits for it.
  PendingCheckpoints::Ready ready = checkpoints_.StartCommit(step);
  if (TakeCheckpointCrash(options_.faults, step, &record_)) {
    Save(out);
    for (CoordinatorAction& a : ArmCheckpointCrash(step, record_.generation).actions) {
      Emit(out, std::move(a));
    }
  }
  CoordinatorAction a{Kind::kCheckpoint};
  a.step = step;
  a.generation = ready.generation;
  a.world = ready.world;
  a.shards = std::move(ready.shards);
  Emit(out, std::move(a));
}

std::vector<CoordinatorAction> CoordinatorCore::OnCheckpointCommitted(int64_t step,
                                                                      const absl::Status& status,
                                                                      CoreTime) {
  Actions out;
  checkpoints_.Erase(step);
  if (phase_ == CoordinatorPhase::kDone) return out;
  if (status.ok()) {
    last_checkpoint_ = std::max(last_checkpoint_, step);
  } else if (step >= options_.steps) {
    base::SupervisionEvent e = JobEvent("final_checkpoint_failed");
    e.Set("step", step).reason = status.ToString();
    Fail(&out,
         absl::Status(status.code(), absl::StrCat("the final checkpoint step-", step,
                                                  " could not be committed: ", status.ToString())),
         std::move(e));
    return out;
  } else {
    if (step == owed_asked_) owed_boundary_ = -1;
    base::SupervisionEvent e = JobEvent("checkpoint_dropped");
    e.Set("step", step).reason = status.ToString();
    Event(&out, std::move(e));
  }
  if (phase_ == CoordinatorPhase::kFinishing) Finish(&out);
  if (HandOverCheckpointEnded()) StartStep(&out);
  return out;
}

// A hand-over waits for the committed step's checkpoint only: an earlier step's, still in flight
// when the notice's step committed (checkpoint.every), does not hold that step.
bool CoordinatorCore::HandOverCheckpointEnded() const {
  return phase_ == CoordinatorPhase::kHandingOver && !checkpoints_.Contains(record_.committed);
}

// ---- the end -------------------------------------------------------------------------------

// The last step is always checkpointed. Its write is asked again only if a generation change
// lost it (once per generation: a write that fails is reported by its rank and fails the job).
void CoordinatorCore::Finish(Actions* out) {
  phase_ = CoordinatorPhase::kFinishing;
  if (!checkpoints_.empty()) return;
  const int64_t steps = record_.committed;
  bool written = last_checkpoint_ >= steps;
  if (!written && options_.latest_checkpoint) {
    std::optional<int64_t> latest = options_.latest_checkpoint();
    written = latest && *latest >= steps;
  }
  if (!written) {
    if (final_asked_generation_ == record_.generation) {
      base::SupervisionEvent e = JobEvent("final_checkpoint_failed");
      e.Set("step", steps).reason = "asked for and never completed in this generation";
      return Fail(out,
                  absl::InternalError(absl::StrCat(
                      "the final checkpoint step-", steps,
                      " was asked for and never completed in generation ", record_.generation)),
                  std::move(e));
    }
    final_asked_generation_ = record_.generation;
    ExpectCheckpoint(steps);
    CommitGroup(out, steps);
    return;
  }
  // On a pipeline grid no rank keeps every parameter: all of them gather (ElasticRank::
  // ParamsOnHost), and the first answer finishes the job.
  const int stages = StagesOf(static_cast<int>(group_.size()));
  for (const std::string& w : stages > 1 ? group_ : std::vector<std::string>{group_.front()}) {
    CoordinatorAction a{Kind::kFinal};
    a.worker = w;
    a.generation = record_.generation;
    Emit(out, std::move(a));
  }
}

std::vector<CoordinatorAction> CoordinatorCore::OnFinal(uint64_t generation, int64_t crc,
                                                        int64_t num_params, int64_t steps, CoreTime,
                                                        const std::map<int32_t, double>& eval) {
  Actions out;
  if (generation != record_.generation || phase_ != CoordinatorPhase::kFinishing) return out;
  phase_ = CoordinatorPhase::kDone;
  CoordinatorAction a{Kind::kFinish};
  a.generation = record_.generation;
  a.crc = crc;
  a.num_params = num_params;
  a.step = steps;
  if (!eval.empty()) {
    a.eval_step = steps;
    a.eval_loss = CanonicalMean(eval);
  }
  Emit(&out, std::move(a));
  return out;
}

// ---- timers --------------------------------------------------------------------------------

std::vector<CoordinatorAction> CoordinatorCore::OnTimer(uint64_t timer, CoreTime) {
  Actions out;
  auto it = timers_.find(timer);
  if (it == timers_.end()) return out;
  const Timer t = it->second;
  timers_.erase(it);
  if (phase_ == CoordinatorPhase::kDone) return out;
  switch (t.kind) {
    case TimerKind::kRetry:
      if (t.generation == record_.generation && phase_ == CoordinatorPhase::kRecovering) {
        CoordinatorAction a{Kind::kReadTable};
        a.generation = record_.generation;
        Emit(&out, std::move(a));
      }
      break;
    case TimerKind::kStraggler:
      if (t.generation == record_.generation && t.step == record_.committed &&
          phase_ == CoordinatorPhase::kStepping && pending_.size() == 1) {
        OnStraggler(&out);
      }
      break;
    case TimerKind::kNoticeWindow:
      notice_window_open_ = false;
      // A step boundary already passed while it ran: hand over now rather than after a step.
      if (phase_ == CoordinatorPhase::kAwaitingJoin) StartStep(&out);
      break;
    case TimerKind::kJoinWait:
      if (t.generation == record_.generation && phase_ == CoordinatorPhase::kAwaitingJoin) {
        Event(&out, JobEvent("join_timeout"));
        StartStep(&out);
      }
      break;
    case TimerKind::kWatchdog:
      // No commit for a whole period with work to do: report rather than hang.
      if (watchdog_seen_ == record_.committed && phase_ != CoordinatorPhase::kWaiting) {
        Fail(&out, absl::DeadlineExceededError(absl::StrCat(
                       "no step committed for ",
                       std::chrono::duration_cast<std::chrono::seconds>(options_.watchdog).count(),
                       " s (stuck at step ", record_.committed, ", generation ", record_.generation,
                       ", ", PhaseName(phase_), ")")));
        break;
      }
      watchdog_seen_ = record_.committed;
      ArmTimer(&out, TimerKind::kWatchdog, options_.watchdog);
      break;
  }
  return out;
}

int CoordinatorCore::StagesOf(int world) const {
  // [lowcomm]: no pipeline, and the microbatches are each group's (NextGroup caps the groups).
  if (options_.lowcomm_round > 0) return 1;
  return ChooseStages(world, options_.pipeline_stages, options_.pipeline_units,
                      options_.microbatches);
}

int CoordinatorCore::GridWorld(int usable) const {
  for (int w = std::min(usable, options_.max_world); w > 0; --w) {
    if (StagesOf(w) > 0) return w;
  }
  return 0;
}

int CoordinatorCore::StartableCount() const {
  return options_.lowcomm_round > 0 ? static_cast<int>(NextGroup(false).size()) : UsableCount();
}

}  // namespace troupe::train
