// The coordinator actor "troupe.coordinator" (see training.h): a thin CAF shell around
// CoordinatorCore, which makes every decision. The shell turns messages into the core's events
// and carries out the actions the core returns, in order: messages to ranks and to the driver,
// timers, the committed-step record (<work_dir>/coordinator.state, through FileSystem),
// checkpoint manifests, chaos, and the job's event log (job_events.h): every decision is an event
// there and, as a line made from that event, on the driver's terminal. It runs in a worker process
// under the driver's job supervisor; a restarted one resumes from the record.
//
// No split brain: what outlives this incarnation (the record, a rank's configure and commit, a
// checkpoint named in LATEST, the step log, the report) is done only under the head's lease on
// this actor's name (lease_atom in troupe/runtime/cluster.h). Such an action waits, with every
// action after it, until the lease is held; a coordinator that the head refuses, or cannot renew
// in kLeaseWait, logs lease_lost and quits having done none of them. The lease's epoch claims the
// checkpoint store (CheckpointStore::Claim) and travels in each plan, so the store refuses a
// write of an incarnation that an epoch after it has replaced.
#include <signal.h>
#include <unistd.h>

#include <deque>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "caf/all.hpp"
#include "coordinator_core.h"
#include "coordinator_record.h"
#include "job_events.h"
#include "protocol.h"
#include "troupe/actors/checkpoint_store.h"
#include "troupe/runtime/actor.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/faults.h"
#include "troupe/runtime/status.h"

namespace troupe::actors {
namespace {

using Kind = CoordinatorAction::Kind;
using timer_atom = caf::atom_constant<caf::atom("tr_timer")>;
using lease_tick_atom = caf::atom_constant<caf::atom("tr_leasetk")>;
using head_tick_atom = caf::atom_constant<caf::atom("tr_headtk")>;

// How long actions may wait for the lease before this incarnation gives up on it.
constexpr std::chrono::seconds kLeaseWait{3};

// Actions whose effects outlive this incarnation: carried out only under the lease.
bool NeedsLease(CoordinatorAction::Kind k) {
  switch (k) {
    case CoordinatorAction::Kind::kSaveRecord:
    case CoordinatorAction::Kind::kConfigure:
    case CoordinatorAction::Kind::kCommit:
    case CoordinatorAction::Kind::kCheckpoint:
    case CoordinatorAction::Kind::kCommitted:
    case CoordinatorAction::Kind::kFinish:
      return true;
    default:
      return false;
  }
}

struct Rank {
  caf::actor handle;
  std::string node;
  std::string name;  // the rank actor's cluster-wide name
};

class Coordinator {
 public:
  Coordinator(runtime::Actor* self, std::string name, caf::actor driver)
      : self_(self), name_(std::move(name)), driver_(driver) {}

  // Parses the job, opens the store, builds the core and loads the record.
  absl::Status Init(const std::string& spec_text);
  caf::behavior Behavior();

 private:
  CoreTime Now() const { return std::chrono::steady_clock::now(); }
  std::chrono::milliseconds Rpc() const { return absl::ToChronoMilliseconds(spec_.timeouts.rpc); }
  void Print(const std::string& line) { self_->send(driver_, ProgressLine{line}); }
  // Into the event log, then (made from the event) to the driver's terminal.
  void LogEvent(runtime::SupervisionEvent e) {
    events_->Write(e);
    Print(EventProgressLine(e));
  }
  // A rank's step, for the job's trace and metrics (the log only: no progress line).
  void NoteRankStep(const StepDone& m) {
    runtime::SupervisionEvent e = JobEvent("rank_step", m.worker);
    e.generation = m.generation;
    e.Set("step", m.step + 1)  // the step it computes, counted from 1 as progress lines do
        .Set("start_ns", m.start_ns)
        .Set("step_s", absl::StrFormat("%.6f", m.step_seconds))
        .Set("compute_s", absl::StrFormat("%.6f", m.compute_seconds))
        .Set("collective_s", absl::StrFormat("%.6f", m.collective_seconds))
        .Set("collective_bytes", static_cast<int64_t>(m.collective_bytes));
    const std::vector<std::string>& active = core_->record().active;
    if (auto r = std::find(active.begin(), active.end(), m.worker); r != active.end()) {
      e.Set("rank", static_cast<int64_t>(r - active.begin()));
    }
    events_->Write(e);
  }
  // A fault this process carries out, written down before it happens (the progress line to the
  // driver might not leave the process before SIGKILL does).
  void FaultFired(FaultKind kind, int64_t step, const std::string& node = "") {
    runtime::SupervisionEvent e = JobEvent("fault_fired", "coordinator");
    e.generation = core_->generation();
    e.pid = getpid();
    e.Set("kind", FaultKindName(kind))
        .Set("step", step)
        .Set("at_ns", absl::ToUnixNanos(absl::Now()));
    if (!node.empty()) e.Set("node", node);
    events_->Write(std::move(e));
  }
  std::string StatePath() const { return spec_.work_dir + "/coordinator.state"; }
  void Send(const std::string& worker, caf::message m) {
    auto it = ranks_.find(worker);
    if (it != ranks_.end()) self_->send(it->second.handle, std::move(m));
  }

  // Queues the core's actions (ahead of the rest when called from inside an action) and carries
  // out as many as the lease allows.
  void Execute(std::vector<CoordinatorAction> actions);
  void RunQueued();
  void Do(const CoordinatorAction& a);
  // Held for at least `margin` more.
  bool LeaseHeld(CoreDuration margin = CoreDuration::zero()) const {
    return epoch_ != 0 && Now() + margin < lease_until_;
  }
  void RenewLease();
  void OnLease(uint64_t epoch, std::chrono::milliseconds length, CoreTime sent);
  void LeaseTick();
  void LoseLease(const std::string& why);
  // The head is gone (its connection lost): actions under the lease wait, the ranks finish their
  // step and wait for its commit, until this process has rejoined the head that takes over
  // (HeadTick); its worker exits once head_grace has passed without one.
  void HeadLost(const caf::error& reason);
  void HeadTick();
  void FollowHead(const caf::actor& head);
  void CommitCheckpoint(const CoordinatorAction& a);
  void InjectNodeFault(const std::string& worker, FaultKind kind);
  void Committed(const CoordinatorAction& a);
  void Finish(const CoordinatorAction& a);
  void Stop(caf::message to_driver);
  void ReadTable(uint64_t generation);
  void HandleJoin(const RankJoined& j);
  void HandleMembership(const runtime::MembershipEvent& e);
  // The node this incarnation runs on (through the head's directory entry of its name): a
  // notice there moves the coordinator first.
  void FindOwnNode(const std::vector<runtime::MemberInfo>& table);

  runtime::Actor* self_;
  const std::string name_;  // in the head's directory: what the lease is on
  caf::actor driver_;       // prints our lines, receives the report, relays joins and membership
  caf::actor head_;         // rank handles are looked up here (see runtime::directory_lookup_atom)
  JobSpec spec_;
  int64_t num_params_ = 0;
  int64_t tokens_per_microbatch_ = 0;
  std::optional<model::GptConfig> gpt_config_;
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<CoordinatorCore> core_;
  std::unique_ptr<EventLog> events_;  // <work_dir>/logs/events.log
  std::map<std::string, Rank> ranks_;
  std::ofstream commits_;
  absl::Time step_start_;
  std::map<int64_t, absl::Time> checkpoint_asked_;  // checkpoint step -> when ranks were told
  bool stepping_ = false;
  double compute_seconds_ = 0;
  int64_t tokens_ = 0;
  // The ranks' step-1 times of every step after the first (JobReport::bubble).
  double rank_compute_seconds_ = 0, rank_schedule_seconds_ = 0;
  JobReport report_;
  std::map<std::string, std::string> kv_;  // the collectives bootstrap of this generation
  bool stopped_ = false;
  // The core's actions not yet carried out, in order, each with the batch (the one core call)
  // it came from: a batch whose first action needing the lease found it held runs to its end.
  std::deque<std::pair<uint64_t, CoordinatorAction>> queue_;
  uint64_t next_batch_ = 1;
  uint64_t leased_batch_ = 0;
  int depth_ = 0;           // > 0 while an action is being carried out
  uint64_t epoch_ = 0;      // the lease's; 0 until the first grant
  CoreTime lease_until_{};  // from when the granting request was sent
  std::chrono::milliseconds lease_length_{0};
  bool lease_asked_ = false;
  std::optional<CoreTime> waiting_since_;  // queue_'s head has waited for the lease since
  std::optional<CoreTime> asking_since_;   // the lease is needed and asked for, unanswered, since
  std::optional<CoreTime> head_lost_;      // the head's connection was lost at, until one is back
};

absl::Status Coordinator::Init(const std::string& spec_text) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(spec_text, "job spec from the driver");
  if (!spec.ok()) return spec.status();
  spec_ = *spec;
  // The model's shape, from a host instance: the coordinator's node need not have the ranks'
  // GPUs, and a model on any device has the same flat layout.
  ModelSpec probe_spec = spec_.model;
  probe_spec.device = "cpu";
  absl::StatusOr<std::unique_ptr<Trainable>> probe = TrainableRegistry::Global().Create(probe_spec);
  if (!probe.ok()) return probe.status();
  num_params_ = (*probe)->num_params();
  tokens_per_microbatch_ = (*probe)->tokens_per_microbatch();
  gpt_config_ = (*probe)->gpt_config();
  int32_t pipeline_units = 1;
  if (spec_.pipeline_stages > 1) {
    StagedTrainable* staged = (*probe)->staged();
    if (staged == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline.stages: expected 1 for model.type '", spec_.model.type,
                       "', which cannot be cut into stages, got ", spec_.pipeline_stages));
    }
    pipeline_units = staged->num_units();
    if (spec_.pipeline_stages > pipeline_units) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline.stages: expected at most ", pipeline_units, " (the blocks of ",
          spec_.model.type, " size ", spec_.model.size, "), got ", spec_.pipeline_stages));
    }
  }
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store =
      CheckpointStore::Open({.dir = spec_.CheckpointDir(),
                             .keep_last = spec_.keep_last,
                             .warning = [this](const std::string& w) { Print("warning: " + w); }});
  if (!store.ok()) return store.status();
  store_ = std::move(*store);

  CoordinatorCore::Options o;
  o.steps = spec_.steps;
  o.min_workers = spec_.min_workers;
  o.max_world = static_cast<int32_t>(std::min<int64_t>(
      spec_.max_workers, int64_t{spec_.model.microbatches} * spec_.pipeline_stages));
  o.pipeline_stages = spec_.pipeline_stages;
  o.pipeline_units = pipeline_units;
  o.microbatches = spec_.model.microbatches;
  o.checkpoint_every = spec_.checkpoint_every;
  o.num_params = num_params_;
  o.faults = spec_.faults;
  o.retry_delay = absl::ToChronoMilliseconds(spec_.timeouts.retry);
  o.join_wait = absl::ToChronoMilliseconds(spec_.timeouts.join_wait);
  o.notice_window = absl::ToChronoMilliseconds(spec_.timeouts.notice_window);
  o.watchdog = absl::ToChronoMilliseconds(spec_.timeouts.watchdog);
  o.latest_checkpoint = [this]() -> std::optional<int64_t> {
    absl::StatusOr<Checkpoint> c = store_->LoadLatestValid();
    if (!c.ok() || c->manifest().num_params != num_params_) return std::nullopt;
    return c->step();
  };
  core_ = std::make_unique<CoordinatorCore>(std::move(o));
  events_ = std::make_unique<EventLog>(EventLogPath(spec_.work_dir));

  commits_.open(spec_.work_dir + "/commits.log", std::ios::app);
  absl::StatusOr<std::optional<CoordinatorRecord>> record =
      LoadCoordinatorRecord(PosixFileSystem(), StatePath());
  if (!record.ok()) return record.status();
  if (*record) {
    Execute(core_->Restore(**record, Now()));
    absl::StatusOr<Checkpoint> latest = store_->LoadLatestValid();
    runtime::SupervisionEvent e = JobEvent("coordinator_restarted", "coordinator");
    e.generation = (*record)->generation;
    e.pid = getpid();
    e.Set("step", (*record)->committed);
    e.Set("checkpoint", latest.ok() ? latest->dir() : "");
    e.Set("checkpoint_step", latest.ok() ? latest->step() : int64_t{-1});
    if (!latest.ok()) e.reason = std::string(latest.status().message());
    LogEvent(std::move(e));
  }
  return absl::OkStatus();
}

void Coordinator::Execute(std::vector<CoordinatorAction> actions) {
  const uint64_t batch = next_batch_++;
  std::vector<std::pair<uint64_t, CoordinatorAction>> tagged;
  for (CoordinatorAction& a : actions) tagged.emplace_back(batch, std::move(a));
  // From inside an action (a checkpoint's outcome), its consequences come before what followed it.
  queue_.insert(depth_ > 0 ? queue_.begin() : queue_.end(), std::make_move_iterator(tagged.begin()),
                std::make_move_iterator(tagged.end()));
  RunQueued();
}

// A batch is all or nothing under the lease: a step's record save, its commits and its line in
// the step log must not be split by a lease lost in between (the record would count a step the
// log never names). So the lease is checked once per batch, with a margin of a quarter lease for
// the batch to run in.
void Coordinator::RunQueued() {
  while (!queue_.empty() && !stopped_) {
    const uint64_t batch = queue_.front().first;
    if (NeedsLease(queue_.front().second.kind) && batch != leased_batch_) {
      if (!LeaseHeld(lease_length_ / 4)) {
        if (!waiting_since_) waiting_since_ = Now();
        return RenewLease();
      }
      leased_batch_ = batch;
    }
    waiting_since_.reset();
    CoordinatorAction a = std::move(queue_.front().second);
    queue_.pop_front();
    ++depth_;
    Do(a);
    --depth_;
  }
}

void Coordinator::RenewLease() {
  if (lease_asked_ || stopped_ || !head_ || head_lost_) return;
  lease_asked_ = true;
  const CoreTime sent = Now();
  self_->request(head_, Rpc(), runtime::lease_atom::value, name_)
      .then(
          [this, sent](uint64_t epoch, int64_t ms) {
            lease_asked_ = false;
            OnLease(epoch, std::chrono::milliseconds(ms), sent);
          },
          [this](caf::error& e) {
            lease_asked_ = false;
            const absl::Status s = runtime::ErrorToStatus(e, "head");
            // Another incarnation's lease still runs (Unavailable) or no answer: the tick asks
            // again. Refused for good: this incarnation has been replaced.
            if (s.code() == absl::StatusCode::kFailedPrecondition) LoseLease(s.ToString());
          });
}

void Coordinator::OnLease(uint64_t epoch, std::chrono::milliseconds length, CoreTime sent) {
  if (stopped_) return;
  if (epoch != epoch_) {
    if (absl::Status s = store_->Claim(epoch); !s.ok()) return LoseLease(s.ToString());
    // Granted again by a head that took over: the ranks write under the new epoch too (their
    // checkpoint writes come after this message).
    if (epoch_ != 0) {
      for (const auto& [w, r] : ranks_)
        Send(w, caf::make_message(RankEpoch{core_->generation(), epoch}));
    }
    epoch_ = epoch;
  }
  lease_length_ = length;
  lease_until_ = sent + length;
  asking_since_.reset();
  RunQueued();
}

// Renews the lease a few times per length, so actions rarely wait for it. When the lease is
// needed (actions wait for a first grant, or it ran out) and the head has not answered for
// kLeaseWait since this incarnation began asking, the head is out of reach: this incarnation
// stops, and whoever can still reach the head takes over. The wait counts from the first request
// after the need arose, not from when the lease ran out: a process stalled meanwhile (a handler
// blocked in a slow fsync on shared storage) asks once it runs again, and goes on if the head
// renews it (no other incarnation was granted it in between).
void Coordinator::LeaseTick() {
  if (stopped_) return;
  if (head_lost_) {
    asking_since_.reset();  // no head to ask: waited out (HeadLost), not counted
  } else {
    if (!waiting_since_ && (epoch_ == 0 || LeaseHeld())) {
      asking_since_.reset();
    } else if (!asking_since_) {
      asking_since_ = Now();
    }
    if (asking_since_ && Now() - *asking_since_ > kLeaseWait) {
      return LoseLease(absl::StrCat("the head did not grant or renew it within ",
                                    absl::FormatDuration(absl::FromChrono(kLeaseWait))));
    }
    RenewLease();
  }
  const auto every = std::max(lease_length_ / 4, std::chrono::milliseconds(20));
  self_->delayed_send(self_, lease_length_.count() > 0 ? every : std::chrono::milliseconds(50),
                      lease_tick_atom::value);
}

void Coordinator::FollowHead(const caf::actor& head) {
  head_ = head;
  self_->monitor(head_);
  self_->send(head_, runtime::membership_subscribe_atom::value, caf::actor_cast<caf::actor>(self_));
}

void Coordinator::HeadLost(const caf::error& reason) {
  if (stopped_ || head_lost_) return;
  head_lost_ = Now();
  runtime::SupervisionEvent e = JobEvent("head_lost", "coordinator");
  e.generation = core_->generation();
  e.Set("step", core_->committed());
  e.reason = self_->system().render(reason);
  LogEvent(std::move(e));
  HeadTick();
}

// While the head is lost: this process's own rejoin (its worker's) names the head that took over.
void Coordinator::HeadTick() {
  if (stopped_ || !head_lost_) return;
  caf::actor now = self_->cluster_head();
  if (!now || now == head_) {
    self_->delayed_send(self_, std::chrono::milliseconds(20), head_tick_atom::value);
    return;
  }
  runtime::SupervisionEvent e = JobEvent("head_back", "coordinator");
  e.generation = core_->generation();
  e.Set("step", core_->committed());
  e.Set("after_ms",
        std::chrono::duration_cast<std::chrono::milliseconds>(Now() - *head_lost_).count());
  LogEvent(std::move(e));
  head_lost_.reset();
  lease_asked_ = false;  // the old head's answer is an error at most
  FollowHead(now);
  RenewLease();
}

void Coordinator::LoseLease(const std::string& why) {
  if (stopped_) return;
  runtime::SupervisionEvent e = JobEvent("lease_lost", "coordinator");
  e.generation = core_->generation();
  e.pid = getpid();
  e.Set("epoch", static_cast<int64_t>(epoch_)).Set("held", static_cast<int64_t>(queue_.size()));
  e.reason = why;
  LogEvent(std::move(e));
  stopped_ = true;
  queue_.clear();
  // An error exit: a supervisor that can still see this incarnation starts another.
  self_->quit(runtime::StatusToError(absl::AbortedError("coordinator lost its lease: " + why)));
}

void Coordinator::Do(const CoordinatorAction& a) {
  switch (a.kind) {
    case Kind::kSaveRecord:
      if (absl::Status s = SaveCoordinatorRecord(PosixFileSystem(), StatePath(), a.record);
          !s.ok()) {
        Stop(caf::make_message(JobFailed{WireStatus::From(s)}));
      }
      return;
    case Kind::kAbort:
      return Send(a.worker, caf::make_message(AbortBelow{a.generation}));
    case Kind::kConfigure: {
      stepping_ = false;
      if (a.plan.rank == 0) kv_.clear();  // keys name their generation; older ones are dead
      GenerationPlan plan = a.plan;
      plan.epoch = epoch_;
      return Send(a.worker, caf::make_message(ConfigureRank{a.generation, plan,
                                                            caf::actor_cast<caf::actor>(self_)}));
    }
    case Kind::kStep:
      if (!stepping_) step_start_ = absl::Now();
      stepping_ = true;
      return Send(a.worker, caf::make_message(RunStep{a.generation, a.step}));
    case Kind::kCommit:
      if (a.step >= 0) checkpoint_asked_.emplace(a.step, absl::Now());
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
      return Send(a.worker,
                  caf::make_message(ArmKill{a.step, a.signal, static_cast<int32_t>(a.fault)}));
    case Kind::kNodeFault:
      return InjectNodeFault(a.worker, a.fault);
    case Kind::kAddNode:
      FaultFired(FaultKind::kJoinWorker, core_->committed(), a.text);
      return self_->send(driver_, AddNode{a.text});
    case Kind::kCrashSelf:
      FaultFired(FaultKind::kKillCoordinator, core_->committed());
      raise(SIGKILL);
      return;
    case Kind::kReleaseNode:
      if (head_) self_->send(head_, runtime::release_node_atom::value, a.text);
      return;
    case Kind::kMoveSelf:
      // An error exit: the job supervisor restarts this child where the scheduler places it now
      // (never on a draining node); the next incarnation resumes from the record just saved.
      stopped_ = true;
      queue_.clear();
      self_->quit(runtime::StatusToError(absl::UnavailableError(
          "coordinator moving off its node, which got a preemption notice")));
      return;
    case Kind::kStallSelf:
      FaultFired(FaultKind::kStallCoordinator, core_->committed());
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(spec_.stall));
      return;
    case Kind::kArmCrash:
      FaultFired(FaultKind::kCrashInCheckpoint, a.step);
      runtime::ArmCrashPoint(a.text);
      return;
    case Kind::kCommitted:
      return Committed(a);
    case Kind::kEvent: {
      runtime::SupervisionEvent e = a.event;
      // The core knows steps; the store knows where they are.
      if (e.event.rfind("checkpoint_", 0) == 0 || e.event == "final_checkpoint_failed") {
        e.Set("path", store_->StepDir(e.IntField("step")));
      }
      return LogEvent(std::move(e));
    }
    case Kind::kFinish:
      return Finish(a);
    case Kind::kFail: {
      runtime::SupervisionEvent e = a.event;
      if (e.event == "final_checkpoint_failed") e.Set("path", store_->StepDir(e.IntField("step")));
      events_->Write(std::move(e));  // the driver reports the Status itself
      return Stop(caf::make_message(JobFailed{WireStatus::From(a.status)}));
    }
  }
}

// Chaos by name, through the head: the node agent carries it out on its own host (a preemption
// notice to itself, or a network fault on its host's links).
void Coordinator::InjectNodeFault(const std::string& worker, FaultKind kind) {
  auto it = ranks_.find(worker);
  if (it == ranks_.end() || !head_) return;
  runtime::NodeFault f;
  f.kind = kind == FaultKind::kSigtermNode     ? runtime::NodeFaultKind::kPreempt
           : kind == FaultKind::kPartitionNode ? runtime::NodeFaultKind::kPartition
           : kind == FaultKind::kDelayNode     ? runtime::NodeFaultKind::kDelay
                                               : runtime::NodeFaultKind::kDrop;
  f.duration_ms = absl::ToInt64Milliseconds(spec_.network_fault);
  f.drop_percent = spec_.drop_percent;
  f.delay_us = absl::ToInt64Microseconds(spec_.delay);
  f.jitter_us = absl::ToInt64Microseconds(spec_.jitter);
  FaultFired(kind, core_->committed(), it->second.node);
  self_->request(head_, Rpc(), runtime::node_fault_atom::value, it->second.node, f)
      .then([](bool) {},
            [this, kind](caf::error& e) {
              runtime::SupervisionEvent failed = JobEvent("fault_failed", "coordinator");
              failed.generation = core_->generation();
              failed.Set("kind", FaultKindName(kind)).reason = self_->system().render(e);
              LogEvent(std::move(failed));
            });
}

void Coordinator::CommitCheckpoint(const CoordinatorAction& a) {
  CheckpointManifest m;
  m.gpt_config = gpt_config_;
  m.num_params = num_params_;
  m.step = a.step;
  m.seed = spec_.seed;
  m.world_size = a.world;
  m.generation = static_cast<int64_t>(a.generation);
  m.optimizer_step = a.step;
  m.shards = a.shards;
  absl::Status s = store_->Commit(m);
  if (s.ok()) {
    runtime::SupervisionEvent e = JobEvent("checkpoint_committed");
    e.generation = a.generation;
    e.Set("step", a.step).Set("path", store_->StepDir(a.step)).Set("world", a.world);
    uint64_t bytes = 0;
    for (const ShardFileInfo& f : a.shards) bytes += f.byte_size;
    e.Set("bytes", static_cast<int64_t>(bytes));
    if (auto asked = checkpoint_asked_.find(a.step); asked != checkpoint_asked_.end()) {
      e.Set("seconds", absl::StrFormat("%.6f", absl::ToDoubleSeconds(absl::Now() - asked->second)));
    }
    checkpoint_asked_.erase(checkpoint_asked_.begin(), checkpoint_asked_.upper_bound(a.step));
    LogEvent(std::move(e));
  }
  Execute(core_->OnCheckpointCommitted(a.step, s, Now()));
}

void Coordinator::Committed(const CoordinatorAction& a) {
  const absl::Time now = absl::Now();
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
  runtime::SupervisionEvent step = JobEvent("step");
  step.generation = a.generation;
  step.Set("step", a.step)
      .Set("loss", absl::StrFormat("%.6f", a.loss))
      .Set("tokens_per_s", absl::StrFormat("%.1f", tokens_per_s))
      .Set("step_s", absl::StrFormat("%.6f", secs))
      .Set("world", a.world);
  events_->Write(step);
  if (a.recovered) {
    // From the newest fault_fired event (the dying process wrote it, with its time) to now.
    std::optional<runtime::SupervisionEvent> fault =
        NewestRecoveryFault(ReadEventLog(EventLogPath(spec_.work_dir)));
    if (fault && fault->IntField("at_ns", 0) > 0) {
      const double r = absl::ToDoubleSeconds(now - absl::FromUnixNanos(fault->IntField("at_ns")));
      if (report_.recovery_seconds < 0) report_.recovery_seconds = r;
      runtime::SupervisionEvent e = JobEvent("recovered");
      e.generation = a.generation;
      e.Set("step", a.step).Set("seconds", absl::StrFormat("%.3f", r));
      e.Set("fault", fault->Field("kind"));
      events_->Write(e);
      absl::StrAppend(&line, "  | ", DescribeEvent(e));
    }
  }
  Print(line);
}

void Coordinator::Finish(const CoordinatorAction& a) {
  // Everything the core keeps comes from its record, once, here.
  const CoordinatorRecord& record = core_->record();
  JobReport r = report_;
  r.final_params_crc32c = static_cast<uint32_t>(a.crc);
  r.num_params = a.num_params;
  r.committed_steps = a.step;
  r.generations = static_cast<int>(record.generation);
  r.steps_lost = record.steps_lost;
  r.final_world = static_cast<int>(record.active.size());
  r.tokens_per_second = compute_seconds_ > 0 ? tokens_ / compute_seconds_ : 0.0;
  r.bubble = rank_schedule_seconds_ > 0 ? 1.0 - rank_compute_seconds_ / rank_schedule_seconds_ : 0;
  Stop(caf::make_message(std::move(r)));
}

// Tells the driver how the job ended, stops every rank and quits.
void Coordinator::Stop(caf::message to_driver) {
  if (stopped_) return;
  stopped_ = true;
  self_->send(driver_, std::move(to_driver));
  for (const auto& [w, r] : ranks_) self_->send_exit(r.handle, caf::exit_reason::user_shutdown);
  self_->quit();
}

void Coordinator::FindOwnNode(const std::vector<runtime::MemberInfo>& table) {
  self_->request(head_, Rpc(), runtime::directory_lookup_atom::value, name_)
      .then(
          [this, table](const caf::actor&, uint64_t, const std::string& worker,
                        const std::string& /*direct*/) {
            for (const runtime::MemberInfo& m : table) {
              if (m.kind == runtime::MemberKind::kWorker && m.id == worker) {
                core_->SetOwnNode(m.node);
              }
            }
          },
          [](caf::error&) {});  // unknown: a notice there is handed over like any other
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

void Coordinator::HandleJoin(const RankJoined& j) {
  if (ranks_.count(j.worker) || stopped_ || !head_) return;
  self_->request(head_, Rpc(), runtime::directory_lookup_atom::value, j.rank_name)
      .then(
          [this, j](const caf::actor& rank, uint64_t, const std::string&, const std::string&) {
            if (ranks_.count(j.worker)) return;
            ranks_[j.worker] = Rank{rank, j.node, j.rank_name};
            self_->monitor(rank);
            Execute(core_->OnJoin(j.worker, j.node, Now(), j.domain));
          },
          [this, j](caf::error& e) {
            Execute(core_->OnJoinFailed(
                j.worker,
                absl::StrCat("cannot look up its rank actor: ", self_->system().render(e)), Now()));
          });
}

void Coordinator::HandleMembership(const runtime::MembershipEvent& e) {
  switch (e.kind) {
    case runtime::MembershipKind::kWorkerDown:
      Execute(core_->OnWorkerDown(e.subject, e.detail, Now()));
      break;
    case runtime::MembershipKind::kNodeDraining:
      Execute(core_->OnNodeDraining(e.subject, e.detail, Now()));
      break;
    case runtime::MembershipKind::kNodeDead:
      Execute(core_->OnNodeDead(e.subject, Now()));
      break;
    case runtime::MembershipKind::kNodeAlive:
      Execute(core_->OnNodeAlive(e.subject, Now()));
      break;
    case runtime::MembershipKind::kActorHung:
      // Only a hung rank actor takes its worker out; another actor of the worker's process (this
      // coordinator, stalled on a slow disk) says nothing about the rank.
      for (const auto& [w, r] : ranks_) {
        if (e.subject == r.name) {
          Execute(core_->OnWorkerDown(w, absl::StrCat("hung: ", e.detail), Now()));
        }
      }
      break;
    default:  // joins reach the coordinator as RankJoined; the rest changes nothing here
      break;
  }
}

caf::behavior Coordinator::Behavior() {
  self_->send(driver_, CoordinatorHello{caf::actor_cast<caf::actor>(self_)});
  // The driver is the job's owner (its supervisor, its report's reader): without it the job
  // would run on, unseen, holding its workers.
  self_->monitor(driver_);
  LeaseTick();  // asks the head for the lease once the driver has named it (KnownRanks)
  self_->set_down_handler([this](caf::down_msg& m) {
    if (head_ && m.source == head_.address()) return HeadLost(m.reason);
    if (m.source == driver_.address()) {
      runtime::SupervisionEvent e = JobEvent("driver_lost");
      e.generation = core_->generation();
      e.Set("step", core_->committed()).reason = self_->system().render(m.reason);
      LogEvent(e);
      return Stop(caf::make_message(JobFailed{WireStatus::From(absl::UnavailableError(
          absl::StrCat("the job's driver is gone (", e.reason, "): every rank stopped")))}));
    }
    for (const auto& [w, r] : ranks_) {
      if (r.handle.address() == m.source) {
        Execute(core_->OnWorkerDown(
            w, absl::StrCat("its actor is down: ", self_->system().render(m.reason)), Now()));
        return;
      }
    }
  });
  return {
      [this](const KnownRanks& k) {
        FollowHead(k.head);
        RenewLease();
        // Subscribe (FollowHead), then read the table, both from this actor: CAF keeps their
        // order, so no membership event falls between the two (a restarted coordinator misses no
        // death).
        const size_t expected = static_cast<size_t>(k.count);
        self_->request(head_, Rpc(), runtime::members_table_atom::value)
            .then(
                [this, expected](const std::vector<runtime::MemberInfo>& table) {
                  std::vector<std::string> dead;
                  for (const runtime::MemberInfo& m : table) {
                    if (m.kind == runtime::MemberKind::kWorker &&
                        m.state == runtime::MemberState::kDead)
                      dead.push_back(m.id);
                    // Noticed before this incarnation began (its predecessor moved off one).
                    if (m.kind == runtime::MemberKind::kNode &&
                        m.state == runtime::MemberState::kDraining)
                      Execute(core_->OnNodeDraining(m.id, "draining", Now()));
                  }
                  Execute(core_->OnMembershipKnown(expected, dead, Now()));
                  FindOwnNode(table);
                },
                [this](caf::error& e) {
                  Stop(caf::make_message(JobFailed{WireStatus::From(absl::UnavailableError(
                      absl::StrCat("cannot read the membership table from the head: ",
                                   self_->system().render(e))))}));
                });
      },
      [this](const RankJoined& j) { HandleJoin(j); },
      // `troupe job stop` (through the head and the driver): every rank stopped, the record kept.
      [this](runtime::job_stop_atom, const std::string& id) {
        Stop(caf::make_message(JobFailed{WireStatus::From(absl::CancelledError(absl::StrCat(
            "job ", id, " stopped by `troupe job stop` at step ", core_->committed())))}));
      },
      [this](runtime::membership_atom, const runtime::MembershipEvent& e) { HandleMembership(e); },
      [this](const RankConfigured& m) {
        Execute(core_->OnConfigured(m.generation, m.worker, m.status.ToStatus(), Now(), m.blamed));
      },
      [this](const StepDone& m) {
        if (m.step > 0 && m.status.ToStatus().ok()) {
          rank_compute_seconds_ += m.compute_seconds;
          rank_schedule_seconds_ += m.schedule_seconds;
        }
        if (m.status.ToStatus().ok()) NoteRankStep(m);
        std::map<int32_t, double> losses;
        for (size_t i = 0; i < m.microbatches.size() && i < m.losses.size(); ++i) {
          losses[m.microbatches[i]] = m.losses[i];
        }
        Execute(core_->OnStepped(m.generation, m.step, m.worker, m.status.ToStatus(), losses, Now(),
                                 m.blamed));
      },
      [this](const ShardWritten& m) {
        Execute(core_->OnShardWritten(m.generation, m.step, m.index, m.info, m.status.ToStatus(),
                                      Now()));
      },
      [this](const FinalParams& m) {
        Execute(core_->OnFinal(m.generation, m.crc, m.num_params, m.steps, Now()));
      },
      [this](timer_atom, uint64_t timer) { Execute(core_->OnTimer(timer, Now())); },
      [this](lease_tick_atom) { LeaseTick(); },
      [this](head_tick_atom) { HeadTick(); },
      [this](put_atom, const std::string& key, const std::string& value) {
        kv_[key] = value;
        return true;
      },
      [this](get_atom, const std::string& key) {
        auto it = kv_.find(key);
        return it == kv_.end() ? std::make_tuple(false, std::string())
                               : std::make_tuple(true, it->second);
      },
  };
}

caf::behavior CoordinatorActor(runtime::Actor* self, const std::string& spec_text,
                               const caf::actor& driver) {
  auto c = std::make_shared<Coordinator>(self, self->actor_name(), driver);
  if (absl::Status init = c->Init(spec_text); !init.ok()) {
    self->send(driver, JobFailed{WireStatus::From(init)});
    self->quit(runtime::StatusToError(init));
    return {};
  }
  caf::behavior b = c->Behavior();
  // The behavior captures `this`: tie the object's lifetime to the actor's state.
  self->attach_functor([c] {});
  return b;
}

}  // namespace

void AddTrainingMessageTypes(runtime::ActorRegistry& r) {
  r.AddMessageType<WireStatus>("troupe.WireStatus");
  r.AddMessageType<GenerationPlan>("troupe.GenerationPlan");
  r.AddMessageType<ShardFileInfo>("troupe.ShardFileInfo");
  r.AddMessageType<JobReport>("troupe.JobReport");
  r.AddMessageType<ConfigureRank>("troupe.ConfigureRank");
  r.AddMessageType<RankConfigured>("troupe.RankConfigured");
  r.AddMessageType<RunStep>("troupe.RunStep");
  r.AddMessageType<StepDone>("troupe.StepDone");
  r.AddMessageType<CommitRank>("troupe.CommitRank");
  r.AddMessageType<AbortBelow>("troupe.AbortBelow");
  r.AddMessageType<RankEpoch>("troupe.RankEpoch");
  r.AddMessageType<ArmKill>("troupe.ArmKill");
  r.AddMessageType<AskFinal>("troupe.AskFinal");
  r.AddMessageType<ShardWritten>("troupe.ShardWritten");
  r.AddMessageType<FinalParams>("troupe.FinalParams");
  r.AddMessageType<CoordinatorHello>("troupe.CoordinatorHello");
  r.AddMessageType<KnownRanks>("troupe.KnownRanks");
  r.AddMessageType<RankJoined>("troupe.RankJoined");
  r.AddMessageType<ProgressLine>("troupe.ProgressLine");
  r.AddMessageType<AddNode>("troupe.AddNode");
  r.AddMessageType<JobFailed>("troupe.JobFailed");
}

absl::Status RegisterCoordinator(runtime::ActorRegistry& registry) {
  return registry.Register<std::string, caf::actor>(kCoordinatorActorType, CoordinatorActor);
}

}  // namespace troupe::actors
