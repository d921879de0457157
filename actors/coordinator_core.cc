#include "coordinator_core.h"

#include <signal.h>

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "job_events.h"
#include "troupe/actors/training.h"
#include "troupe/kernels/norm.h"

namespace troupe::actors {

using Kind = CoordinatorAction::Kind;

const char* PhaseName(CoordinatorPhase p) {
  switch (p) {
    case CoordinatorPhase::kWaiting:
      return "waiting";
    case CoordinatorPhase::kConfiguring:
      return "configuring";
    case CoordinatorPhase::kStepping:
      return "stepping";
    case CoordinatorPhase::kAwaitingJoin:
      return "awaiting_join";
    case CoordinatorPhase::kRecovering:
      return "recovering";
    case CoordinatorPhase::kHandingOver:
      return "handing_over";
    case CoordinatorPhase::kFinishing:
      return "finishing";
    case CoordinatorPhase::kDone:
      return "done";
  }
  return "?";
}

bool CoordinatorRecord::operator==(const CoordinatorRecord& o) const {
  return committed == o.committed && generation == o.generation && steps_lost == o.steps_lost &&
         awaiting_recovery == o.awaiting_recovery && fired == o.fired && active == o.active &&
         buddy == o.buddy && dead == o.dead;
}

std::string DebugString(const CoordinatorAction& a) {
  const std::string g = absl::StrCat("g", a.generation);
  switch (a.kind) {
    case Kind::kSaveRecord:
      return "save";
    case Kind::kAbort:
      return absl::StrCat("abort(", a.worker, ",", g, ")");
    case Kind::kConfigure: {
      static const char* kSource[] = {"init", "memory", "checkpoint"};
      std::string source = kSource[static_cast<int>(a.plan.source)];
      if (a.plan.source == RestoreSource::kCheckpoint) {
        absl::StrAppend(&source, a.plan.checkpoint_step);
      }
      // The buddy offset only where it is not 1.
      const std::string buddy = a.plan.buddy == 1 ? "" : absl::StrCat(",b", a.plan.buddy);
      // The pipeline stages only where there are several.
      const std::string stages = a.plan.stages == 1 ? "" : absl::StrCat(",p", a.plan.stages);
      return absl::StrCat("configure(", a.worker, ",", g, ",r", a.plan.rank, "/", a.plan.world,
                          stages, buddy, ",s", a.plan.committed_steps, ",", source, ")");
    }
    case Kind::kStep:
      return absl::StrCat("step(", a.worker, ",", g, ",s", a.step, ")");
    case Kind::kCommit:
      return absl::StrCat("commit(", a.worker, ",", g, ",ck", a.step, ")");
    case Kind::kCheckpoint:
      return absl::StrCat("checkpoint(s", a.step, ",", g, ",w", a.world, ",", a.shards.size(),
                          " shards)");
    case Kind::kFinal:
      return absl::StrCat("final(", a.worker, ",", g, ")");
    case Kind::kReadTable:
      return absl::StrCat("read_table(", g, ")");
    case Kind::kTimer:
      return absl::StrCat("timer(t", a.timer, ",",
                          std::chrono::duration_cast<std::chrono::milliseconds>(a.delay).count(),
                          "ms)");
    case Kind::kKillWorker:
      return absl::StrCat(a.signal == SIGSTOP ? "stop(" : "kill(", a.worker, ",s", a.step, ")");
    case Kind::kNodeFault:
      return a.fault == FaultKind::kSigtermNode
                 ? absl::StrCat("drain_node(", a.worker, ")")
                 : absl::StrCat(FaultKindName(a.fault), "(", a.worker, ")");
    case Kind::kAddNode:
      return absl::StrCat("add_node(", a.text, ")");
    case Kind::kCrashSelf:
      return "crash_self";
    case Kind::kMoveSelf:
      return "move_self";
    case Kind::kReleaseNode:
      return absl::StrCat("release_node(", a.text, ")");
    case Kind::kStallSelf:
      return "stall_self";
    case Kind::kArmCrash:
      return absl::StrCat("arm_crash(", a.text, ")");
    case Kind::kCommitted:
      return absl::StrCat("committed(s", a.step, ",", g, ",w", a.world,
                          a.recovered ? ",recovered)" : ")");
    case Kind::kEvent:
      return "event";  // which one: a.event (tests of the vocabulary look at it)
    case Kind::kFinish:
      return absl::StrCat("finish(s", a.step, ")");
    case Kind::kFail:
      return absl::StrCat("fail(", absl::StatusCodeToString(a.status.code()), ")");
  }
  return "?";
}

CoordinatorCore::CoordinatorCore(Options options) : options_(std::move(options)) {}

std::string CoordinatorCore::DebugString() const {
  return absl::StrCat("CoordinatorCore{phase=", PhaseName(phase_), " gen=", record_.generation,
                      " committed=", record_.committed, " group=[", absl::StrJoin(group_, " "),
                      "] pending=", pending_.size(), " members=", members_.size(),
                      " dead=", record_.dead.size(), "}");
}

// ---- helpers -------------------------------------------------------------------------------

bool CoordinatorCore::Usable(const std::string& worker) const {
  auto it = members_.find(worker);
  return it != members_.end() && it->second.alive && !it->second.draining &&
         !record_.dead.count(worker);
}

int CoordinatorCore::UsableCount() const {
  int n = 0;
  for (const auto& [w, m] : members_) n += Usable(w) ? 1 : 0;
  return n;
}

void CoordinatorCore::Emit(Actions* out, CoordinatorAction a) { out->push_back(std::move(a)); }

// The record as it is now (not as it will be when the shell gets to the action).
void CoordinatorCore::Save(Actions* out) {
  CoordinatorAction a{Kind::kSaveRecord};
  a.record = record_;
  Emit(out, std::move(a));
}

void CoordinatorCore::Event(Actions* out, runtime::SupervisionEvent event) {
  CoordinatorAction a{Kind::kEvent};
  a.event = std::move(event);
  a.event.generation = record_.generation;
  Emit(out, std::move(a));
}

void CoordinatorCore::ArmTimer(Actions* out, TimerKind kind, CoreDuration delay) {
  const uint64_t id = next_timer_++;
  timers_[id] = Timer{kind, record_.generation, record_.committed};
  CoordinatorAction a{Kind::kTimer};
  a.timer = id;
  a.delay = delay;
  Emit(out, std::move(a));
}

void CoordinatorCore::Fail(Actions* out, absl::Status status,
                           std::optional<runtime::SupervisionEvent> event) {
  if (phase_ == CoordinatorPhase::kDone) return;
  phase_ = CoordinatorPhase::kDone;
  CoordinatorAction a{Kind::kFail};
  a.event = event ? std::move(*event) : JobEvent("job_failed");
  a.event.generation = record_.generation;
  a.event.Set("code", absl::StatusCodeToString(status.code()));
  if (a.event.reason.empty()) a.event.reason = std::string(status.message());
  a.status = std::move(status);
  Emit(out, std::move(a));
}

// ---- membership ----------------------------------------------------------------------------

std::vector<CoordinatorAction> CoordinatorCore::Restore(const CoordinatorRecord& record, CoreTime) {
  record_ = record;
  return {};
}

std::vector<CoordinatorAction> CoordinatorCore::OnMembershipKnown(
    size_t expected_joins, const std::vector<std::string>& dead, CoreTime) {
  Actions out;
  if (membership_known_ || phase_ == CoordinatorPhase::kDone) return out;
  expected_joins_ = expected_joins;
  MarkDown(&out, dead, "dead in the head's table");
  membership_known_ = true;
  ArmTimer(&out, TimerKind::kWatchdog, options_.watchdog);
  MaybeStart(&out);
  return out;
}

std::vector<CoordinatorAction> CoordinatorCore::OnJoin(const std::string& worker,
                                                       const std::string& node, CoreTime,
                                                       const std::string& domain) {
  Actions out;
  if (members_.count(worker) || phase_ == CoordinatorPhase::kDone) return out;
  if (dead_nodes_.count(node)) record_.dead.insert(worker);  // its join was under way
  if (record_.dead.count(worker)) {
    if (expected_joins_ > 0) --expected_joins_;
    MaybeStart(&out);
    return out;
  }
  members_[worker] = Member{node, domain.empty() ? node : domain};
  members_[worker].draining = draining_nodes_.count(node) > 0;
  if (phase_ != CoordinatorPhase::kWaiting) {
    Event(&out, JobEvent("join_folded", worker).Set("node", node));
  }
  if (phase_ == CoordinatorPhase::kAwaitingJoin) {
    StartStep(&out);
  } else {
    MaybeStart(&out);
  }
  return out;
}

std::vector<CoordinatorAction> CoordinatorCore::OnJoinFailed(const std::string& worker,
                                                             const std::string& why, CoreTime) {
  Actions out;
  if (phase_ == CoordinatorPhase::kDone) return out;
  runtime::SupervisionEvent e = JobEvent("join_failed", worker);
  e.reason = why;
  Event(&out, std::move(e));
  if (expected_joins_ > 0) --expected_joins_;
  MaybeStart(&out);
  return out;
}

std::vector<CoordinatorAction> CoordinatorCore::OnWorkerDown(const std::string& worker,
                                                             const std::string& why, CoreTime) {
  Actions out;
  MarkDown(&out, {worker}, why);
  return out;
}

std::vector<CoordinatorAction> CoordinatorCore::OnNodeDraining(const std::string& node,
                                                               const std::string& why, CoreTime) {
  Actions out;
  draining_nodes_.insert(node);
  bool noticed = node == own_node_;
  for (auto& [w, m] : members_) {
    if (m.node != node || !m.alive || m.draining) continue;
    m.draining = true;
    noticed = true;
    runtime::SupervisionEvent e = JobEvent("drain", w);
    e.Set("node", node).reason = why;
    Event(&out, std::move(e));
  }
  // The first notice opens a window for others of the same batch; training goes on meanwhile.
  if (noticed && !notice_window_open_ && options_.notice_window > CoreDuration::zero()) {
    notice_window_open_ = true;
    ArmTimer(&out, TimerKind::kNoticeWindow, options_.notice_window);
  }
  // Nothing waits for a step boundary while a joiner is awaited: act at once.
  if (phase_ == CoordinatorPhase::kAwaitingJoin && !notice_window_open_) StartStep(&out);
  return out;
}

void CoordinatorCore::SetOwnNode(const std::string& node) { own_node_ = node; }

std::vector<CoordinatorAction> CoordinatorCore::OnNodeDead(const std::string& node, CoreTime) {
  Actions out;
  dead_nodes_.insert(node);
  std::vector<std::string> on_node;
  for (const auto& [w, m] : members_) {
    if (m.node == node) on_node.push_back(w);
  }
  MarkDown(&out, on_node, absl::StrCat("its node ", node, " is dead"));
  return out;
}

std::vector<CoordinatorAction> CoordinatorCore::OnNodeAlive(const std::string& node, CoreTime) {
  dead_nodes_.erase(node);
  return {};
}

// Every worker of `workers` is down: remembered as dead (never planned again), and one new
// generation if any was in the group.
void CoordinatorCore::MarkDown(Actions* out, const std::vector<std::string>& workers,
                               const std::string& why) {
  std::vector<std::string> newly;
  bool in_group = false;
  for (const std::string& w : workers) {
    record_.dead.insert(w);
    auto it = members_.find(w);
    if (it == members_.end() || !it->second.alive) continue;
    it->second.alive = false;
    newly.push_back(w);
    in_group |= std::find(group_.begin(), group_.end(), w) != group_.end();
  }
  if (newly.empty() || phase_ == CoordinatorPhase::kDone) return;
  const std::string what = absl::StrCat(newly.size() == 1 ? "worker " : "workers ",
                                        absl::StrJoin(newly, ", "), " down (", why, ")");
  if (in_group && phase_ != CoordinatorPhase::kWaiting && phase_ != CoordinatorPhase::kDone) {
    NewGeneration(out, "worker_down", what, {{"down", absl::StrJoin(newly, " ")}});
  } else {
    runtime::SupervisionEvent e = JobEvent("worker_down");
    e.Set("workers", absl::StrJoin(newly, " ")).reason = why;
    Event(out, std::move(e));
  }
}

// Starts a generation once the ranks the driver announced are in and the head's membership
// table has been read (a restarted coordinator must not count workers that died meanwhile).
void CoordinatorCore::MaybeStart(Actions* out) {
  if (phase_ != CoordinatorPhase::kWaiting || !membership_known_ ||
      members_.size() < expected_joins_) {
    return;
  }
  if (UsableCount() < options_.min_workers) return;
  // A coordinator restarted off a noticed node (kMoveSelf): its first generation is that node's
  // hand-over, and says so.
  std::set<std::string> noticed;
  for (const std::string& w : record_.active) {
    auto m = members_.find(w);
    if (m != members_.end() && m->second.alive && m->second.draining)
      noticed.insert(m->second.node);
  }
  if (!noticed.empty()) {
    const std::string nodes = absl::StrJoin(noticed, " ");
    return NewGeneration(out, "drain",
                         absl::StrCat(noticed.size() == 1 ? "node " : "nodes ", nodes,
                                      noticed.size() == 1 ? " is" : " are",
                                      " draining: the coordinator moved off first"),
                         {{"node", nodes}});
  }
  const bool start = record_.active.empty();
  NewGeneration(out, start ? "start" : "workers", start ? "job start" : "enough workers");
}

// ---- generations ---------------------------------------------------------------------------

int CoordinatorCore::GridWorld(int usable) const {
  for (int w = std::min(usable, options_.max_world); w > 0; --w) {
    if (ChooseStages(w, options_.pipeline_stages, options_.pipeline_units, options_.microbatches) >
        0) {
      return w;
    }
  }
  return 0;
}

// The committed configuration's usable workers first (their memory holds the state), then the
// others in name order, up to the largest world a grid fits (GridWorld).
std::vector<std::string> CoordinatorCore::NextGroup() const {
  std::vector<std::string> next;
  const size_t cap = static_cast<size_t>(GridWorld(UsableCount()));
  for (const std::string& w : record_.active) {
    if (Usable(w) && next.size() < cap) next.push_back(w);
  }
  for (const auto& [w, m] : members_) {
    if (Usable(w) && next.size() < cap && std::find(next.begin(), next.end(), w) == next.end()) {
      next.push_back(w);
    }
  }
  return next;
}

std::vector<int> CoordinatorCore::OldToNew(const std::vector<std::string>& next) const {
  std::vector<int> old_to_new;
  for (const std::string& w : record_.active) {
    auto it = std::find(next.begin(), next.end(), w);
    old_to_new.push_back(it == next.end() ? -1 : static_cast<int>(it - next.begin()));
  }
  return old_to_new;
}

std::string CoordinatorCore::PlanSource(const std::vector<std::string>& next,
                                        GenerationPlan* plan) {
  const std::vector<int> old_to_new = OldToNew(next);
  if (!record_.active.empty() && MemoryRestorePossible(old_to_new, record_.buddy)) {
    plan->source = RestoreSource::kMemory;
    plan->old_to_new = old_to_new;
    plan->old_buddy = record_.buddy;
    const bool owners = std::find(old_to_new.begin(), old_to_new.end(), -1) == old_to_new.end();
    return owners ? "owners" : "mirrors";
  }
  // From disk or from the seed: the memory of the old configuration no longer holds the state
  // this generation starts from.
  const bool had_state = !record_.active.empty() || record_.committed > 0;
  std::optional<int64_t> ckpt =
      options_.latest_checkpoint ? options_.latest_checkpoint() : std::nullopt;
  if (ckpt) {
    plan->source = RestoreSource::kCheckpoint;
    plan->checkpoint_step = *ckpt;
    if (had_state) record_.steps_lost += std::max<int64_t>(0, record_.committed - *ckpt);
    record_.committed = *ckpt;
  } else {
    plan->source = RestoreSource::kInit;
    if (had_state) record_.steps_lost += record_.committed;
    record_.committed = 0;
  }
  record_.active.clear();
  record_.buddy = 1;
  return ckpt ? "checkpoint" : "seed";
}

void CoordinatorCore::NewGeneration(Actions* out, const std::string& trigger,
                                    const std::string& why,
                                    const std::map<std::string, std::string>& extra) {
  if (phase_ == CoordinatorPhase::kDone) return;
  if (++failed_generations_ > options_.max_failed_generations) {
    return Fail(
        out, absl::UnavailableError(absl::StrCat("gave up after ", options_.max_failed_generations,
                                                 " generations without progress; last: ", why)));
  }
  const std::vector<std::string> next = NextGroup();
  ++record_.generation;
  for (const auto& [w, m] : members_) {
    if (!m.alive) continue;
    CoordinatorAction a{Kind::kAbort};
    a.worker = w;
    a.generation = record_.generation;
    Emit(out, std::move(a));
  }
  pending_.clear();
  losses_.clear();
  checkpoints_.clear();  // a checkpoint of an older generation can no longer complete
  group_.clear();
  if (static_cast<int>(next.size()) < options_.min_workers) {
    phase_ = CoordinatorPhase::kWaiting;
    runtime::SupervisionEvent e = JobEvent("waiting");
    e.fields = extra;
    e.Set("usable", static_cast<int64_t>(next.size())).Set("min_workers", options_.min_workers);
    e.Set("trigger", trigger).reason = why;
    Event(out, std::move(e));
    Save(out);
    return;
  }
  GenerationPlan plan;
  plan.world = static_cast<int>(next.size());
  plan.stages = ChooseStages(plan.world, options_.pipeline_stages, options_.pipeline_units,
                             options_.microbatches);
  const std::string source = PlanSource(next, &plan);
  plan.committed_steps = record_.committed;
  std::vector<std::string> domains;
  for (const std::string& w : next) domains.push_back(members_.at(w).domain);
  plan.buddy = BuddyOffset(domains);
  group_ = next;
  group_buddy_ = plan.buddy;
  runtime::SupervisionEvent e = JobEvent("generation");
  e.fields = extra;
  e.Set("world", plan.world).Set("workers", absl::StrJoin(group_, " "));
  if (options_.pipeline_stages > 1) e.Set("stages", plan.stages);
  // Where a mirror shares its owner's failure domain (one host, or too few domains), a loss of
  // that domain restores from a checkpoint.
  e.Set("buddy", plan.buddy)
      .Set("buddies_in_owner_domain", BuddiesSharingADomain(domains, plan.buddy));
  e.Set("step", record_.committed).Set("source", source).Set("steps_lost", record_.steps_lost);
  e.Set("trigger", trigger).reason = why;
  Event(out, std::move(e));
  phase_ = CoordinatorPhase::kConfiguring;
  Save(out);
  for (int r = 0; r < plan.world; ++r) {
    plan.rank = r;
    pending_.insert(group_[r]);
    CoordinatorAction a{Kind::kConfigure};
    a.worker = group_[r];
    a.generation = record_.generation;
    a.plan = plan;
    Emit(out, std::move(a));
  }
}

// A failure seen by a rank (not yet by membership): regenerate after a short delay (a down event
// may explain it first), having asked the head who is dead.
void CoordinatorCore::Recover(Actions* out, runtime::SupervisionEvent event,
                              const std::string& why) {
  if (phase_ != CoordinatorPhase::kConfiguring && phase_ != CoordinatorPhase::kStepping &&
      phase_ != CoordinatorPhase::kFinishing) {
    return;
  }
  phase_ = CoordinatorPhase::kRecovering;
  recover_why_ = why;
  Event(out, std::move(event));
  ArmTimer(out, TimerKind::kRetry, options_.retry_delay);
}

void CoordinatorCore::Blame(const std::string& reporter, int32_t blamed) {
  if (blamed < 0 || blamed >= static_cast<int32_t>(group_.size()) || group_[blamed] == reporter) {
    return;
  }
  const std::set<std::string> pair = {reporter, group_[blamed]};
  if (blamed_generation_ != record_.generation) {  // the first blame of this generation
    blamed_generation_ = record_.generation;
    if (blamed_failures_++ == 0) {
      suspects_ = pair;
      return;
    }
  }
  std::set<std::string> both;
  std::set_intersection(suspects_.begin(), suspects_.end(), pair.begin(), pair.end(),
                        std::inserter(both, both.end()));
  suspects_ = std::move(both);
}

std::vector<CoordinatorAction> CoordinatorCore::OnTable(uint64_t generation,
                                                        const std::vector<std::string>& dead,
                                                        CoreTime) {
  Actions out;
  MarkDown(&out, dead, "dead in the head's table");
  if (generation != record_.generation || phase_ != CoordinatorPhase::kRecovering) return out;
  // One worker in common, or still the same two after three failures (a link between two hosts
  // that are each fine otherwise: either may go; the later rank does, so rank 0 keeps its state).
  if ((blamed_failures_ >= 2 && suspects_.size() == 1) ||
      (blamed_failures_ >= 3 && suspects_.size() == 2)) {
    std::string unreachable = *suspects_.begin();
    for (const std::string& w : group_) {
      if (suspects_.count(w)) unreachable = w;
    }
    const int n = blamed_failures_;
    suspects_.clear();
    blamed_failures_ = 0;
    blamed_generation_ = 0;
    MarkDown(&out, {unreachable},
             absl::StrCat("unreachable: its peers' collectives failed on it in ", n,
                          " generations in a row, while the head still hears from it"));
    if (generation != record_.generation) return out;  // MarkDown planned the next generation
  }
  NewGeneration(&out, "failure", recover_why_);
  return out;
}

std::vector<CoordinatorAction> CoordinatorCore::OnConfigured(uint64_t generation,
                                                             const std::string& worker,
                                                             const absl::Status& status, CoreTime,
                                                             int32_t blamed) {
  Actions out;
  // Every failure of this generation counts for the blame, also those after the first.
  if (generation == record_.generation && !status.ok()) Blame(worker, blamed);
  if (generation != record_.generation || phase_ != CoordinatorPhase::kConfiguring) return out;
  if (status.code() == absl::StatusCode::kInvalidArgument) {
    // The configuration itself cannot work — NCCL refusing two ranks on one GPU ("Duplicate GPU
    // detected", ncclInvalidUsage), a plan the model cannot be cut into: another generation of
    // the same job would fail alike, so the job ends here, naming the cause.
    runtime::SupervisionEvent e = JobEvent("job_failed", worker);
    e.Set("during", "configure");
    Fail(&out,
         absl::InvalidArgumentError(absl::StrCat("configure failed on ", worker,
                                                 " with a configuration error (retrying cannot "
                                                 "help): ",
                                                 status.message())),
         std::move(e));
    return out;
  }
  if (!status.ok()) {
    runtime::SupervisionEvent e = JobEvent("recovering", worker);
    e.Set("during", "configure").reason = status.ToString();
    Recover(&out, std::move(e),
            absl::StrCat("configure failed on ", worker, ": ", status.ToString()));
    return out;
  }
  pending_.erase(worker);
  if (!pending_.empty()) return out;
  record_.active = group_;
  record_.buddy = group_buddy_;
  Save(&out);
  CommitGroup(&out, -1);
  // The generation holds every committed range without the noticed nodes' ranks: those nodes
  // may go now rather than at the end of their notice (this coordinator's own excepted).
  for (const std::string& node : draining_nodes_) {
    bool holds = node == own_node_ || released_nodes_.count(node);
    for (const std::string& w : group_) holds |= members_[w].node == node;
    if (holds) continue;
    released_nodes_.insert(node);
    CoordinatorAction a{Kind::kReleaseNode};
    a.text = node;
    Emit(&out, std::move(a));
  }
  StartStep(&out);
  return out;
}

// ---- steps ---------------------------------------------------------------------------------

void CoordinatorCore::StartStep(Actions* out) {
  if (record_.committed >= options_.steps) return Finish(out);
  // The coordinator moves first, where the job can go on without its node (else it stays, and
  // the hand-over below checkpoints and stops the job as preempted).
  if (!own_node_.empty() && draining_nodes_.count(own_node_) && !notice_window_open_ &&
      UsableCount() >= options_.min_workers) {
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
  for (const auto& [w, m] : members_) {
    if (Usable(w) && std::find(group_.begin(), group_.end(), w) == group_.end()) ++joiners;
  }
  if (joiners > 0 &&
      GridWorld(static_cast<int>(group_.size()) + joiners) > static_cast<int>(group_.size())) {
    return NewGeneration(out, "join", "folding in workers that joined, at this step boundary");
  }
  if (FireFaults(out)) return;
  phase_ = CoordinatorPhase::kStepping;
  losses_.clear();
  for (const std::string& w : group_) {
    pending_.insert(w);
    CoordinatorAction a{Kind::kStep};
    a.worker = w;
    a.generation = record_.generation;
    a.step = record_.committed;
    Emit(out, std::move(a));
  }
}

int CoordinatorCore::ArmRank(int32_t requested) const {
  const int r = requested < 0 ? 1 : requested;
  return std::min<int>(r, static_cast<int>(group_.size()) - 1);
}

// The faults due before step `committed`: recorded as fired and saved first, then carried out.
// True when the step must not start now (this process dies, or a joiner is awaited).
bool CoordinatorCore::FireFaults(Actions* out) {
  std::vector<size_t> due;
  for (size_t i = 0; i < options_.faults.size(); ++i) {
    const Fault& f = options_.faults[i];
    if (record_.fired.count(static_cast<int32_t>(i)) || f.step != record_.committed ||
        f.kind == FaultKind::kCrashInCheckpoint) {
      continue;
    }
    due.push_back(i);
    record_.fired.insert(static_cast<int32_t>(i));
    if (FaultAwaitsRecovery(f.kind)) record_.awaiting_recovery = true;
  }
  if (due.empty()) return false;
  Save(out);
  bool hold = false;
  for (size_t i : due) {
    const Fault& f = options_.faults[i];
    runtime::SupervisionEvent armed = JobEvent("fault_armed");
    armed.Set("kind", FaultKindName(f.kind)).Set("step", f.step);
    auto kill = [&](int rank, int32_t signal) {
      CoordinatorAction a{Kind::kKillWorker};
      a.worker = group_[rank];
      a.step = f.step;
      a.signal = signal;
      a.fault = f.kind;
      Emit(out, std::move(a));
    };
    switch (f.kind) {
      case FaultKind::kKillWorker:
      case FaultKind::kStopWorker: {
        const int r = ArmRank(f.arg);
        const bool stop = f.kind == FaultKind::kStopWorker;
        Event(out, armed.Set("rank", r).Set("worker", group_[r]));
        kill(r, stop ? SIGSTOP : SIGKILL);
        break;
      }
      case FaultKind::kKillShardAndBuddy: {
        const int r = ArmRank(f.arg);
        const int buddy = (r + group_buddy_) % static_cast<int>(group_.size());
        armed.Set("rank", r).Set("worker", group_[r]);
        Event(out, armed.Set("buddy_rank", buddy).Set("buddy", group_[buddy]));
        kill(r, SIGKILL);
        kill(buddy, SIGKILL);
        break;
      }
      case FaultKind::kSigtermNode:
      case FaultKind::kPartitionNode:
      case FaultKind::kDropNode:
      case FaultKind::kDelayNode: {
        const std::string& w = group_[ArmRank(f.arg)];
        Event(out, armed.Set("worker", w).Set("node", members_[w].node));
        CoordinatorAction a{Kind::kNodeFault};
        a.worker = w;
        a.fault = f.kind;
        Emit(out, std::move(a));
        break;
      }
      case FaultKind::kJoinWorker: {
        CoordinatorAction a{Kind::kAddNode};
        a.text = absl::StrCat("join", f.step);
        Event(out, armed.Set("node", a.text));
        Emit(out, std::move(a));
        phase_ = CoordinatorPhase::kAwaitingJoin;
        ArmTimer(out, TimerKind::kJoinWait, options_.join_wait);
        hold = true;
        break;
      }
      case FaultKind::kKillCoordinator:
        Event(out, armed);
        Emit(out, CoordinatorAction{Kind::kCrashSelf});
        hold = true;
        break;
      case FaultKind::kStallCoordinator:
        Event(out, armed);
        Emit(out, CoordinatorAction{Kind::kStallSelf});
        break;
      case FaultKind::kCrashInCheckpoint:
        break;
    }
  }
  return hold;
}

std::vector<CoordinatorAction> CoordinatorCore::OnStepped(uint64_t generation, int64_t step,
                                                          const std::string& worker,
                                                          const absl::Status& status,
                                                          const std::map<int32_t, double>& losses,
                                                          CoreTime, int32_t blamed) {
  Actions out;
  if (generation == record_.generation && !status.ok()) Blame(worker, blamed);
  if (generation != record_.generation || step != record_.committed ||
      phase_ != CoordinatorPhase::kStepping || !pending_.count(worker)) {
    return out;
  }
  if (!status.ok()) {
    runtime::SupervisionEvent e = JobEvent("recovering", worker);
    e.Set("during", "step").Set("step", step).reason = status.ToString();
    Recover(&out, std::move(e),
            absl::StrCat("step ", step, " failed on ", worker, ": ", status.ToString()));
    return out;
  }
  for (const auto& [k, v] : losses) losses_[k] = v;
  pending_.erase(worker);
  if (pending_.empty()) CommitStep(&out);
  return out;
}

void CoordinatorCore::CommitStep(Actions* out) {
  ++record_.committed;
  failed_generations_ = 0;
  suspects_.clear();
  blamed_failures_ = 0;
  blamed_generation_ = 0;
  const int64_t ckpt = CheckpointAt(record_.committed);
  if (ckpt >= 0) ExpectCheckpoint(ckpt);
  CoordinatorAction done{Kind::kCommitted};
  done.step = record_.committed;
  done.generation = record_.generation;
  done.world = static_cast<int>(group_.size());
  std::vector<double> l;
  for (const auto& [k, v] : losses_) l.push_back(v);
  done.loss = l.empty() ? 0
                        : kernels::TreeSum(l.data(), static_cast<int64_t>(l.size())) /
                              static_cast<double>(l.size());
  done.recovered = record_.awaiting_recovery;
  record_.awaiting_recovery = false;
  losses_.clear();
  Save(out);
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
  const std::vector<std::string> next = NextGroup();
  const bool enough = !next.empty() && static_cast<int>(next.size()) >= options_.min_workers;
  const bool memory = enough && MemoryRestorePossible(OldToNew(next), record_.buddy);
  if (!memory && !CheckpointHolds(record_.committed) &&
      handover_asked_generation_ != record_.generation) {
    handover_asked_generation_ = record_.generation;
    phase_ = CoordinatorPhase::kHandingOver;
    // The step's own checkpoint may be on its way already (checkpoint.every): it serves.
    const bool asked = !checkpoints_.count(record_.committed);
    runtime::SupervisionEvent e = JobEvent("handover_checkpoint");
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
    runtime::SupervisionEvent e = JobEvent("preempted");
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
  NewGeneration(out, "drain",
                absl::StrCat(nodes.size() == 1 ? "node " : "nodes ", node_list,
                             nodes.size() == 1 ? " is draining: its" : " are draining: their",
                             " ranks leave at this step boundary"),
                {{"node", node_list}});
}

// ---- checkpoints ---------------------------------------------------------------------------

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

void CoordinatorCore::ExpectCheckpoint(int64_t step) {
  const ShardLayout l = ShardLayout::Make(options_.num_params, static_cast<int>(group_.size()));
  PendingCheckpoint& p = checkpoints_[step] = PendingCheckpoint();
  p.generation = record_.generation;
  p.world = l.world;
  for (int r = 0; r < l.world; ++r) p.expected += l.end(r) > l.begin(r) ? 1 : 0;
}

std::vector<CoordinatorAction> CoordinatorCore::OnShardWritten(uint64_t generation, int64_t step,
                                                               int32_t index,
                                                               const ShardFileInfo& info,
                                                               const absl::Status& status,
                                                               CoreTime) {
  Actions out;
  auto it = checkpoints_.find(step);
  if (it == checkpoints_.end() || it->second.generation != generation || it->second.committing ||
      phase_ == CoordinatorPhase::kDone) {
    return out;
  }
  if (!status.ok()) {
    checkpoints_.erase(it);
    const std::string what =
        absl::StrCat("checkpoint step-", step, ": shard ", index, ": ", status.ToString());
    // Training goes on without it; the last step's checkpoint is the job's result.
    if (step >= options_.steps) {
      runtime::SupervisionEvent e = JobEvent("final_checkpoint_failed");
      e.Set("step", step).Set("shard", index).reason = status.ToString();
      Fail(&out, absl::Status(status.code(), absl::StrCat("the final ", what)), std::move(e));
      return out;
    }
    runtime::SupervisionEvent e = JobEvent("checkpoint_dropped");
    e.Set("step", step).Set("shard", index).reason = status.ToString();
    Event(&out, std::move(e));
  } else {
    it->second.shards[index] = info;
    if (static_cast<int>(it->second.shards.size()) == it->second.expected) {
      CompleteCheckpoint(&out, step);
    }
  }
  if (phase_ == CoordinatorPhase::kFinishing) Finish(&out);
  // The hand-over's checkpoint failed: the noticed ranks leave without it.
  if (HandOverCheckpointEnded()) StartStep(&out);
  return out;
}

// Every shard of `step` is on disk: the manifest and LATEST (crash-in-checkpoint dies between).
void CoordinatorCore::CompleteCheckpoint(Actions* out, int64_t step) {
  PendingCheckpoint& p = checkpoints_[step];
  p.committing = true;  // until OnCheckpointCommitted: Finish waits for it
  for (size_t i = 0; i < options_.faults.size(); ++i) {
    const Fault& f = options_.faults[i];
    if (f.kind != FaultKind::kCrashInCheckpoint || record_.fired.count(static_cast<int32_t>(i)) ||
        f.step > step) {
      continue;
    }
    record_.fired.insert(static_cast<int32_t>(i));
    record_.awaiting_recovery = true;
    Save(out);
    Event(out, JobEvent("fault_armed").Set("kind", FaultKindName(f.kind)).Set("step", step));
    CoordinatorAction arm{Kind::kArmCrash};
    arm.text = "checkpoint.publish";
    arm.step = step;
    Emit(out, std::move(arm));
    break;
  }
  CoordinatorAction a{Kind::kCheckpoint};
  a.step = step;
  a.generation = p.generation;
  a.world = p.world;
  for (const auto& [i, s] : p.shards) a.shards.push_back(s);
  Emit(out, std::move(a));
}

std::vector<CoordinatorAction> CoordinatorCore::OnCheckpointCommitted(int64_t step,
                                                                      const absl::Status& status,
                                                                      CoreTime) {
  Actions out;
  checkpoints_.erase(step);
  if (phase_ == CoordinatorPhase::kDone) return out;
  if (status.ok()) {
    last_checkpoint_ = std::max(last_checkpoint_, step);
  } else if (step >= options_.steps) {
    runtime::SupervisionEvent e = JobEvent("final_checkpoint_failed");
    e.Set("step", step).reason = status.ToString();
    Fail(&out,
         absl::Status(status.code(), absl::StrCat("the final checkpoint step-", step,
                                                  " could not be committed: ", status.ToString())),
         std::move(e));
    return out;
  } else {
    runtime::SupervisionEvent e = JobEvent("checkpoint_dropped");
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
  return phase_ == CoordinatorPhase::kHandingOver && !checkpoints_.count(record_.committed);
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
      runtime::SupervisionEvent e = JobEvent("final_checkpoint_failed");
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
  const int stages = ChooseStages(static_cast<int>(group_.size()), options_.pipeline_stages,
                                  options_.pipeline_units, options_.microbatches);
  for (const std::string& w : stages > 1 ? group_ : std::vector<std::string>{group_.front()}) {
    CoordinatorAction a{Kind::kFinal};
    a.worker = w;
    a.generation = record_.generation;
    Emit(out, std::move(a));
  }
}

std::vector<CoordinatorAction> CoordinatorCore::OnFinal(uint64_t generation, int64_t crc,
                                                        int64_t num_params, int64_t steps,
                                                        CoreTime) {
  Actions out;
  if (generation != record_.generation || phase_ != CoordinatorPhase::kFinishing) return out;
  phase_ = CoordinatorPhase::kDone;
  CoordinatorAction a{Kind::kFinish};
  a.crc = crc;
  a.num_params = num_params;
  a.step = steps;
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

}  // namespace troupe::actors
