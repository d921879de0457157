// CoordinatorCore (coordinator_core.h): the actions' short forms, membership and generations.
// The step boundary, checkpoints, the end and the timers: coordinator_core_steps.cc.
#include "troupe/train/coordinator_core.h"

#include <signal.h>

#include <algorithm>
#include <cassert>
#include <iterator>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "troupe/train/job_events.h"
#include "troupe/train/preempted.h"

namespace troupe::train {

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
    case Kind::kReleaseRank:
      return absl::StrCat("release_rank(", a.worker, ")");
    case Kind::kEvict:
      return absl::StrCat("evict(", a.worker, ")");
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

void CoordinatorCore::Event(Actions* out, base::SupervisionEvent event) {
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
                           std::optional<base::SupervisionEvent> event) {
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
  // A checkpoint boundary passed without a durable checkpoint (the previous incarnation died
  // committing it: crash-in-checkpoint): the next commits past it write one until one is durable
  // (asked again after a generation change dropped it; given up if its write fails), so that a
  // shard's owner and its buddy dying together later lose at most an interval, not two.
  const int64_t every = options_.checkpoint_every;
  const int64_t boundary = every > 0 ? record.committed / every * every : 0;
  const std::optional<int64_t> latest =
      options_.latest_checkpoint ? options_.latest_checkpoint() : std::nullopt;
  owed_boundary_ = boundary > 0 && (!latest || *latest < boundary) ? boundary : -1;
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
  base::SupervisionEvent e = JobEvent("join_failed", worker);
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
    base::SupervisionEvent e = JobEvent("drain", w);
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

std::vector<CoordinatorAction> CoordinatorCore::OnGiveUp(int32_t n, const std::string& why,
                                                         CoreTime) {
  Actions out;
  if (phase_ == CoordinatorPhase::kDone) return out;
  // The highest ranks of the group leave; never below min_workers.
  int32_t can = static_cast<int32_t>(UsableCount()) - options_.min_workers;
  for (auto w = group_.rbegin(); w != group_.rend() && n > 0 && can > 0; ++w) {
    Member& m = members_[*w];
    if (!m.alive || m.draining) continue;
    m.draining = true;
    given_up_.insert(*w);
    --n;
    --can;
    base::SupervisionEvent e = JobEvent("drain", *w);
    e.Set("node", m.node).reason = why;
    Event(&out, std::move(e));
  }
  if (phase_ == CoordinatorPhase::kAwaitingJoin) StartStep(&out);
  return out;
}

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
    base::SupervisionEvent e = JobEvent("worker_down");
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
  if (StartableCount() < options_.min_workers) return;
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

namespace {
int64_t Distinct(const std::vector<std::string>& v) {
  return static_cast<int64_t>(std::set<std::string>(v.begin(), v.end()).size());
}
}  // namespace

// The committed configuration's usable workers first (their memory holds the state), then the
// others in name order, up to the largest world a grid fits (GridWorld) and, under [lowcomm], up to
// `microbatches` workers a group (failure domain); with_draining: also the committed
// configuration's workers whose nodes are draining but alive.
std::vector<std::string> CoordinatorCore::NextGroup(bool with_draining) const {
  auto staying = [&](const std::string& w) {
    auto it = members_.find(w);
    return with_draining && it != members_.end() && it->second.alive && it->second.draining &&
           !record_.dead.count(w);
  };
  int usable = UsableCount();
  for (const std::string& w : record_.active) usable += staying(w) ? 1 : 0;
  std::vector<std::string> next;
  std::set<std::string> in_next;  // a lookup per member: O(W log W) at 8,192 ranks, not O(W²)
  const size_t cap = static_cast<size_t>(GridWorld(usable));
  std::map<std::string, int> per_group;  // [lowcomm]: at most `microbatches` a group
  auto admit = [&](const std::string& w) {
    const bool full =
        options_.lowcomm_round > 0 && per_group[members_.at(w).domain]++ >= options_.microbatches;
    if (next.size() < cap && !full) next.push_back(w), in_next.insert(w);
  };
  for (const std::string& w : record_.active) {
    if (Usable(w) || staying(w)) admit(w);
  }
  // [lowcomm]: a worker new to the job comes in where a round ends (as StartStep folds joiners
  // in), unless the job cannot go on without it.
  if (options_.lowcomm_round > 0 && !next.empty() &&
      record_.committed % options_.lowcomm_round != 0 &&
      static_cast<int>(next.size()) >= options_.min_workers) {
    return next;
  }
  for (const auto& [w, m] : members_) {
    if (Usable(w) && !in_next.count(w)) admit(w);
  }
  return next;
}

// NextGroup puts the committed configuration's kept workers first, in their order: that is the
// rule NewRank reads, so the gone ranks alone say where every old rank went.
std::vector<int> CoordinatorCore::Gone(const std::vector<std::string>& next) const {
  std::vector<int> gone;
  size_t kept = 0;
  for (size_t o = 0; o < record_.active.size(); ++o) {
    if (kept < next.size() && next[kept] == record_.active[o]) {
      ++kept;
    } else {
      gone.push_back(static_cast<int>(o));
    }
  }
#ifndef NDEBUG
  // The rule holds: no worker of the committed configuration comes after the kept prefix.
  const std::set<std::string> active(record_.active.begin(), record_.active.end());
  for (size_t i = kept; i < next.size(); ++i) assert(!active.count(next[i]));
#endif
  return gone;
}

std::string CoordinatorCore::PlanSource(const std::vector<std::string>& next,
                                        GenerationPlan* plan) {
  std::vector<int> gone = Gone(next);
  const int old_world = static_cast<int>(record_.active.size());
  if (MemoryRestorePossibleTo(next)) {
    plan->source = RestoreSource::kMemory;
    plan->old_world = old_world;
    plan->old_buddy = record_.buddy;
    if (options_.lowcomm_round > 0) plan->old_groups = Domains(record_.active);
    const bool owners = gone.empty();
    plan->gone = std::move(gone);
    return owners ? "owners" : options_.replicated_state ? "replicas" : "mirrors";
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
                                    const std::map<std::string, std::string>& extra,
                                    bool hand_over) {
  if (phase_ == CoordinatorPhase::kDone) return;
  if (++failed_generations_ > options_.max_failed_generations) {
    return Fail(
        out, absl::UnavailableError(absl::StrCat("gave up after ", options_.max_failed_generations,
                                                 " generations without progress; last: ", why)));
  }
  // Draining ranks not yet handed over (a failure inside their notice window, a coordinator
  // restarted meanwhile): where the state survives in memory only with them, they stay for this
  // generation — alive until their notice ends — and hand their ranges over at the next step
  // boundary (HandOver: a checkpoint first where memory cannot), instead of the job rolling back
  // to a checkpoint now.
  std::vector<std::string> next = NextGroup(false);
  if (!hand_over && !record_.active.empty() && !MemoryRestorePossibleTo(next)) {
    std::vector<std::string> with = NextGroup(true);
    if (MemoryRestorePossibleTo(with)) next = std::move(with);
  }
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
  eval_losses_.clear();
  checkpoints_.Clear();  // a checkpoint of an older generation can no longer complete
  group_.clear();
  if (static_cast<int>(next.size()) < options_.min_workers) {
    phase_ = CoordinatorPhase::kWaiting;
    base::SupervisionEvent e = JobEvent("waiting");
    e.fields = extra;
    e.Set("usable", static_cast<int64_t>(next.size())).Set("min_workers", options_.min_workers);
    e.Set("trigger", trigger).reason = why;
    Event(out, std::move(e));
    Save(out);
    return;
  }
  GenerationPlan plan;
  plan.world = static_cast<int>(next.size());
  plan.stages = StagesOf(plan.world);
  const std::string source = PlanSource(next, &plan);
  plan.committed_steps = record_.committed;
  std::vector<std::string> domains;
  for (const std::string& w : next) domains.push_back(members_.at(w).domain);
  plan.buddy = BuddyOffset(domains);
  if (options_.lowcomm_round > 0) plan.groups = domains;
  group_ = next;
  group_buddy_ = plan.buddy;
  base::SupervisionEvent e = JobEvent("generation");
  e.fields = extra;
  e.Set("world", plan.world).Set("workers", absl::StrJoin(group_, " "));
  if (options_.lowcomm_round > 0) e.Set("groups", Distinct(domains));  // [lowcomm]: its groups
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
void CoordinatorCore::Recover(Actions* out, base::SupervisionEvent event, const std::string& why) {
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
  reporters_.insert(reporter);
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
  if (suspects_.empty()) {  // failures with nobody in common: count afresh from this one
    suspects_ = pair;
    blamed_failures_ = 1;
  }
}

std::optional<std::string> CoordinatorCore::Unreachable() const {
  // A suspect that never reported a failure itself is the one: its peers reported, it did not
  // (stuck, or cut off). Else the later rank of those left, so rank 0 keeps its state.
  std::set<std::string> silent;
  for (const std::string& w : suspects_) {
    if (!reporters_.count(w)) silent.insert(w);
  }
  const std::set<std::string>& pick = silent.size() == 1 ? silent : suspects_;
  if (blamed_failures_ < 2 || pick.size() > 2 || (pick.size() == 2 && blamed_failures_ < 3)) {
    return std::nullopt;
  }
  std::string unreachable = *pick.begin();
  for (const std::string& w : group_) {
    if (pick.count(w)) unreachable = w;
  }
  return unreachable;
}

std::vector<CoordinatorAction> CoordinatorCore::OnTable(uint64_t generation,
                                                        const std::vector<std::string>& dead,
                                                        CoreTime) {
  Actions out;
  MarkDown(&out, dead, "dead in the head's table");
  if (generation != record_.generation || phase_ != CoordinatorPhase::kRecovering) return out;
  // One worker in common, or still the same two after three failures (a link between two hosts
  // that are each fine otherwise: either may go; the later rank does, so rank 0 keeps its state).
  if (std::optional<std::string> found = Unreachable()) {
    const std::string unreachable = *found;
    const int n = blamed_failures_;
    suspects_.clear();
    reporters_.clear();
    blamed_failures_ = 0;
    blamed_generation_ = 0;
    const std::string why =
        absl::StrCat("unreachable: its peers' collectives failed on it in ", n,
                     " generations in a row, while the head still hears from it");
    MarkDown(&out, {unreachable}, why);
    // MarkDown planned the next generation, or it is planned below; either saves the record.
    if (generation == record_.generation) NewGeneration(&out, "failure", recover_why_);
    // Alive and out of the job for good (recorded dead and saved first): a process whose step is
    // stuck (only its own end stops its thread) or that no peer can reach holds nothing of the
    // job's any more.
    CoordinatorAction evict{Kind::kEvict};
    evict.worker = unreachable;
    evict.generation = record_.generation;
    evict.text = why;
    Emit(&out, std::move(evict));
    return out;
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
    base::SupervisionEvent e = JobEvent("job_failed", worker);
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
    base::SupervisionEvent e = JobEvent("recovering", worker);
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
  for (auto w = given_up_.begin(); w != given_up_.end();) {
    if (std::find(group_.begin(), group_.end(), *w) != group_.end()) {
      ++w;
      continue;
    }
    CoordinatorAction a{Kind::kReleaseRank};
    a.worker = *w;
    Emit(&out, std::move(a));
    members_.erase(*w);  // a rank spawned there again joins as a new member
    w = given_up_.erase(w);
  }
  StartStep(&out);
  return out;
}

}  // namespace troupe::train
