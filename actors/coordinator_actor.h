// coordinator_actor.h — private to actors/: the coordinator actor "troupe.coordinator" (see
// training.h), a thin CAF shell around CoordinatorCore (coordinator_core.h), which makes every
// decision, and LeaseGate (lease_gate.h), which says when the core's actions may be carried out.
// Its methods live in two files:
//   coordinator.cc          start-up (Init), messages in (Behavior, Handle*), and the lease gate's
//                           actions carried out (Carry): the lease asked for, the store claimed,
//                           the head lost and found again;
//   coordinator_actions.cc  the core's actions carried out (Do): messages to ranks and to the
//                           driver, timers, the record, checkpoint manifests, chaos, the report.
//
// Touched by its actor's thread only.
#ifndef TROUPE_ACTORS_COORDINATOR_ACTOR_H_
#define TROUPE_ACTORS_COORDINATOR_ACTOR_H_

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "caf/all.hpp"
#include "lease_gate.h"
#include "protocol.h"
#include "troupe/runtime/actor.h"
#include "troupe/runtime/cluster.h"
#include "troupe/train/chaos_file_system.h"
#include "troupe/train/checkpoint_store.h"
#include "troupe/train/coordinator_core.h"
#include "troupe/train/job_events.h"

namespace troupe::actors::internal {

using timer_atom = caf::atom_constant<caf::atom("tr_timer")>;
using lease_tick_atom = caf::atom_constant<caf::atom("tr_leasetk")>;
using head_tick_atom = caf::atom_constant<caf::atom("tr_headtk")>;

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
  train::CoreTime Now() const { return std::chrono::steady_clock::now(); }
  std::chrono::milliseconds Rpc() const { return absl::ToChronoMilliseconds(spec_.timeouts.rpc); }
  void Print(const std::string& line) { self_->send(driver_, ProgressLine{line}); }
  // Into the event log, then (made from the event) to the driver's terminal.
  void LogEvent(base::SupervisionEvent e) {
    events_->Write(e);
    Print(train::EventProgressLine(e));
  }
  // A rank's step, for the job's trace and metrics (the log only: no progress line).
  void NoteRankStep(const StepDone& m) {
    base::SupervisionEvent e = train::JobEvent("rank_step", m.worker);
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
  void FaultFired(train::FaultKind kind, int64_t step, const std::string& node = "") {
    base::SupervisionEvent e = train::JobEvent("fault_fired", "coordinator");
    e.generation = core_->generation();
    e.pid = getpid();
    e.Set("kind", train::FaultKindName(kind))
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

  // Queues the core's actions in the lease gate (ahead of the rest when called from inside an
  // action) and carries out as many as the lease allows.
  void Execute(std::vector<train::CoordinatorAction> actions);
  // Carries out the lease gate's actions, in order.
  void Carry(const std::vector<LeaseAction>& actions);
  void Carry(const LeaseAction& a);
  void Do(const train::CoordinatorAction& a);
  void ReleaseRank(const std::string& worker);
  void DoChaos(const train::CoordinatorAction& a);
  void AskLease();
  void LoseLease(const LeaseAction& a);
  // The head is gone (its connection lost): the gate holds actions under the lease until this
  // process has rejoined the head that takes over (HeadTick); its worker exits once head_grace
  // has passed without one.
  void HeadLost(const caf::error& reason);
  void HeadTick();
  void LogHeadEvent(const std::string& event, const LeaseAction& a);
  void FollowHead(const caf::actor& head);
  void CommitCheckpoint(const train::CoordinatorAction& a);
  void InjectNodeFault(const std::string& worker, train::FaultKind kind);
  void Committed(const train::CoordinatorAction& a);
  std::string NoteEval(uint64_t generation, int64_t step, double loss);
  void Finish(const train::CoordinatorAction& a);
  void Stop(caf::message to_driver);
  void ReadTable(uint64_t generation);
  void HandleDown(const caf::down_msg& m);
  void HandleKnownRanks(const KnownRanks& k);
  void HandleStepDone(const StepDone& m);
  void HandleJoin(const RankJoined& j);
  void HandleMembership(const runtime::MembershipEvent& e);
  // The node this incarnation runs on (through the head's directory entry of its name): a
  // notice there moves the coordinator first.
  void FindOwnNode(const std::vector<runtime::MemberInfo>& table);

  runtime::Actor* self_;
  const std::string name_;  // in the head's directory: what the lease is on
  caf::actor driver_;       // prints our lines, receives the report, relays joins and membership
  caf::actor head_;         // rank handles are looked up here (see runtime::directory_lookup_atom)
  train::JobSpec spec_;
  int64_t num_params_ = 0;
  int64_t tokens_per_microbatch_ = 0;
  std::optional<model::GptConfig> gpt_config_;
  std::unique_ptr<train::ChaosFileSystem> disk_;  // under store_
  int64_t armed_at_ns_ = 0;  // wall time the newest fault was armed (recovery is measured after)
  std::unique_ptr<train::CheckpointStore> store_;
  std::unique_ptr<train::CoordinatorCore> core_;
  std::unique_ptr<train::EventLog> events_;  // <work_dir>/logs/events.log
  std::map<std::string, Rank> ranks_;
  std::ofstream commits_;
  // On base::MonotonicNow()'s clock (durations only).
  absl::Time step_start_;
  std::map<int64_t, absl::Time> checkpoint_asked_;  // checkpoint step -> when ranks were told
  bool stepping_ = false;
  double compute_seconds_ = 0;
  int64_t tokens_ = 0;
  // The ranks' step-1 times of every step after the first (JobReport::bubble).
  double rank_compute_seconds_ = 0, rank_schedule_seconds_ = 0;
  // Their overlapped exchanges' time in flight and exposed part (JobReport::overlap).
  double rank_exchange_seconds_ = 0, rank_exposed_seconds_ = 0;
  // Their steps' whole and optimizer times, and how many steps (JobReport's phases).
  double rank_step_seconds_ = 0, rank_update_seconds_ = 0;
  int64_t rank_steps_ = 0, rank_delta_steps_ = 0;  // of them, sending a parameter delta
  double eval_seconds_ = 0;  // the slowest rank's share of the evaluation in the current step
  // The global gradient norm of the step in flight, as its ranks report it (the step event's
  // grad_norm): one figure where they all agree, none where they differ ([lowcomm] groups).
  struct StepNorm {
    uint64_t generation = 0;
    int64_t step = -1;
    double value = 0;
    bool agree = true;
  };
  StepNorm norm_;
  // [lowcomm]: the outer synchronisation of the step in flight, as its ranks report it (logged as
  // "outer_round" when the step commits: which groups' Δ that round applied).
  struct OuterRound {
    uint64_t generation = 0;
    int64_t step = -1;
    std::vector<int32_t> fragments;
    std::vector<std::string> applied, clipped, rejected;
    uint64_t bytes = 0;
    double feedback_error = -1;  // the worst any rank checked (verify_feedback)
    double wait_seconds = 0;     // the slowest rank's (OuterSync::wait_seconds)
  };
  OuterRound outer_;
  void NoteOuter(const StepDone& m);
  std::string LogOuter(const train::CoordinatorAction& committed);
  JobReport report_;
  std::map<std::string, std::string> kv_;  // the collectives bootstrap of this generation
  // The core's actions not yet carried out, and the lease they wait for; stopped() once this
  // incarnation stops.
  LeaseGate gate_;
  int depth_ = 0;          // > 0 while an action is being carried out
  caf::actor found_head_;  // the head named or found, for the gate's kFollowHead
};

}  // namespace troupe::actors::internal

#endif  // TROUPE_ACTORS_COORDINATOR_ACTOR_H_
