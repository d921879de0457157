// The coordinator actor "troupe.coordinator" (see training.h; the class: coordinator_actor.h): a
// thin CAF shell around CoordinatorCore, which makes every decision. The shell turns messages into
// the core's events and carries out the actions the core returns, in order: messages to ranks and
// to the driver, timers, the committed-step record (<work_dir>/coordinator.state, through
// FileSystem), checkpoint manifests, chaos, and the job's event log (job_events.h): every decision
// is an event there and, as a line made from that event, on the driver's terminal. It runs in a
// worker process under the driver's job supervisor; a restarted one resumes from the record.
//
// No split brain: what outlives this incarnation (the record, a rank's configure and commit, a
// checkpoint named in LATEST, the step log, the report) is done only under the head's lease on
// this actor's name (lease_atom in troupe/runtime/cluster.h). LeaseGate (lease_gate.h) decides
// when the core's actions may run, when to ask for the lease and when to give up on it; this
// shell carries out what it returns. The lease's epoch claims the checkpoint store
// (CheckpointStore::Claim) and travels in each plan, so the store refuses a write of an
// incarnation that an epoch after it has replaced.
#include <unistd.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "coordinator_actor.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/status.h"
#include "troupe/train/coordinator_record.h"

namespace troupe::actors {
namespace internal {
namespace {

// Every rank computes a microbatch of a stage; [lowcomm]: the microbatches are each group's, and
// cap each group alone (CoordinatorCore::NextGroup).
int32_t MaxWorld(const train::JobSpec& spec) {
  if (spec.lowcomm_groups > 0) return spec.max_workers;
  return static_cast<int32_t>(
      std::min<int64_t>(spec.max_workers, int64_t{spec.model.microbatches} * spec.pipeline_stages));
}

}  // namespace

absl::Status Coordinator::Init(const std::string& spec_text) {
  TROUPE_ASSIGN_OR_RETURN(train::JobSpec spec,
                          train::ParseJobSpec(spec_text, "job spec from the driver"));
  spec_ = spec;
  // The model's shape, from a host instance: the coordinator's node need not have the ranks'
  // GPUs.
  TROUPE_ASSIGN_OR_RETURN(
      std::unique_ptr<train::Trainable> probe,
      train::TrainableRegistry::Global().Create(train::HostLayoutSpec(spec_.model)));
  num_params_ = probe->num_params();
  tokens_per_microbatch_ = probe->tokens_per_microbatch();
  gpt_config_ = probe->gpt_config();
  int32_t pipeline_units = 1;
  if (spec_.pipeline_stages > 1) {
    train::StagedTrainable* staged = probe->staged();
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
  disk_ = std::make_unique<train::ChaosFileSystem>(train::PosixFileSystem(), spec_.CheckpointDir(),
                                                   train::DiskFaultsOf(spec_));
  absl::StatusOr<std::unique_ptr<train::CheckpointStore>> store = train::CheckpointStore::Open(
      {.dir = spec_.CheckpointDir(),
       .keep_last = spec_.keep_last,
       .fs = disk_.get(),
       .warning = [this](const std::string& w) { Print("warning: " + w); }});
  if (!store.ok()) return store.status();
  store_ = std::move(*store);

  train::CoordinatorCore::Options o;
  o.steps = spec_.steps;
  o.min_workers = spec_.min_workers;
  o.max_world = MaxWorld(spec_);
  o.pipeline_stages = spec_.pipeline_stages;
  o.pipeline_units = pipeline_units;
  o.microbatches = spec_.model.microbatches;
  o.checkpoint_every = spec_.checkpoint_every;
  o.lowcomm_round = spec_.lowcomm_groups > 0 ? spec_.lowcomm.inner_steps : 0;
  o.replicated_state = spec_.replicate_optimizer;
  o.num_params = num_params_;
  o.faults = spec_.faults;
  o.retry_delay = absl::ToChronoMilliseconds(spec_.timeouts.retry);
  o.join_wait = absl::ToChronoMilliseconds(spec_.timeouts.join_wait);
  o.notice_window = absl::ToChronoMilliseconds(spec_.timeouts.notice_window);
  o.watchdog = absl::ToChronoMilliseconds(spec_.timeouts.watchdog);
  o.straggler = absl::ToChronoMilliseconds(spec_.timeouts.collective);
  o.latest_checkpoint = [this]() -> std::optional<int64_t> {
    absl::StatusOr<train::Checkpoint> c = store_->LoadLatestValid();
    if (!c.ok() || c->manifest().num_params != num_params_) return std::nullopt;
    return c->step();
  };
  core_ = std::make_unique<train::CoordinatorCore>(std::move(o));
  events_ = std::make_unique<train::EventLog>(train::EventLogPath(spec_.work_dir));

  commits_.open(spec_.work_dir + "/commits.log", std::ios::app);
  TROUPE_ASSIGN_OR_RETURN(std::optional<train::CoordinatorRecord> record,
                          train::LoadCoordinatorRecord(train::PosixFileSystem(), StatePath()));
  if (record) {
    Execute(core_->Restore(*record, Now()));
    absl::StatusOr<train::Checkpoint> latest = store_->LoadLatestValid();
    base::SupervisionEvent e = train::JobEvent("coordinator_restarted", "coordinator");
    e.generation = record->generation;
    e.pid = getpid();
    e.Set("step", record->committed);
    e.Set("checkpoint", latest.ok() ? latest->dir() : "");
    e.Set("checkpoint_step", latest.ok() ? latest->step() : int64_t{-1});
    if (!latest.ok()) e.reason = std::string(latest.status().message());
    LogEvent(std::move(e));
  }
  return absl::OkStatus();
}

void Coordinator::Execute(std::vector<train::CoordinatorAction> actions) {
  Carry(gate_.Enqueue(std::move(actions), depth_ > 0));
}

void Coordinator::Carry(const std::vector<LeaseAction>& actions) {
  for (const LeaseAction& a : actions) Carry(a);
}

void Coordinator::Carry(const LeaseAction& a) {
  using LeaseKind = LeaseAction::Kind;
  switch (a.kind) {
    case LeaseKind::kRun:
      ++depth_;
      Do(*a.action);
      --depth_;
      return;
    case LeaseKind::kRunQueue:
      while (std::optional<LeaseAction> next = gate_.Next(Now())) Carry(*next);
      return;
    case LeaseKind::kAskLease:
      return AskLease();
    case LeaseKind::kClaim:
      return Carry(gate_.OnClaimed(store_->Claim(a.epoch)));
    case LeaseKind::kAnnounceEpoch:
      for (const auto& [w, r] : ranks_)
        Send(w, caf::make_message(RankEpoch{core_->generation(), a.epoch}));
      return;
    case LeaseKind::kLoseLease:
      return LoseLease(a);
    case LeaseKind::kTick:
      self_->delayed_send(self_, std::chrono::duration_cast<std::chrono::milliseconds>(a.delay),
                          lease_tick_atom::value);
      return;
    case LeaseKind::kHeadLost:
      return LogHeadEvent("head_lost", a);
    case LeaseKind::kCheckHead:
      if (a.delay == train::CoreDuration::zero()) return HeadTick();
      self_->delayed_send(self_, std::chrono::duration_cast<std::chrono::milliseconds>(a.delay),
                          head_tick_atom::value);
      return;
    case LeaseKind::kHeadBack:
      return LogHeadEvent("head_back", a);
    case LeaseKind::kFollowHead:
      return FollowHead(found_head_);
  }
}

void Coordinator::AskLease() {
  const train::CoreTime sent = Now();
  self_->request(head_, Rpc(), runtime::lease_atom::value, name_)
      .then(
          [this, sent](uint64_t epoch, int64_t ms) {
            Carry(gate_.OnGranted(epoch, std::chrono::milliseconds(ms), sent));
          },
          [this](caf::error& e) { Carry(gate_.OnRefused(runtime::ErrorToStatus(e, "head"))); });
}

void Coordinator::FollowHead(const caf::actor& head) {
  head_ = head;
  self_->monitor(head_);
  self_->send(head_, runtime::membership_subscribe_atom::value, caf::actor_cast<caf::actor>(self_));
}

void Coordinator::HeadLost(const caf::error& reason) {
  Carry(gate_.OnHeadLost(self_->system().render(reason), Now()));
}

// While the head is lost: this process's own rejoin (its worker's) names the head that took over.
void Coordinator::HeadTick() {
  found_head_ = self_->cluster_head();
  Carry(gate_.OnHeadTick(found_head_ && found_head_ != head_, Now()));
}

void Coordinator::LogHeadEvent(const std::string& event, const LeaseAction& a) {
  base::SupervisionEvent e = train::JobEvent(event, "coordinator");
  e.generation = core_->generation();
  e.Set("step", core_->committed());
  if (a.kind == LeaseAction::Kind::kHeadBack) {
    e.Set("after_ms", std::chrono::duration_cast<std::chrono::milliseconds>(a.delay).count());
  }
  e.reason = a.reason;
  LogEvent(std::move(e));
}

void Coordinator::LoseLease(const LeaseAction& a) {
  base::SupervisionEvent e = train::JobEvent("lease_lost", "coordinator");
  e.generation = core_->generation();
  e.pid = getpid();
  e.Set("epoch", static_cast<int64_t>(a.epoch)).Set("held", a.held);
  e.reason = a.reason;
  LogEvent(std::move(e));
  // An error exit: a supervisor that can still see this incarnation starts another.
  self_->quit(
      runtime::StatusToError(absl::AbortedError("coordinator lost its lease: " + a.reason)));
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

void Coordinator::HandleJoin(const RankJoined& j) {
  if (ranks_.count(j.worker) || gate_.stopped() || !head_) return;
  self_->request(head_, Rpc(), runtime::directory_lookup_atom::value, j.rank_name)
      .then(
          [this, j](const caf::actor& rank, uint64_t, const std::string& worker,
                    const std::string&) {
            if (ranks_.count(j.worker)) return;
            self_->ConnectTo(worker);  // its messages, both ways, then skip the head
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

void Coordinator::HandleDown(const caf::down_msg& m) {
  if (head_ && m.source == head_.address()) return HeadLost(m.reason);
  if (m.source == driver_.address()) {
    base::SupervisionEvent e = train::JobEvent("driver_lost");
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
}

void Coordinator::HandleKnownRanks(const KnownRanks& k) {
  found_head_ = k.head;
  Carry(gate_.OnHeadNamed());  // follows the head, and asks it for the lease
  // Subscribe (FollowHead), then read the table, both from this actor: CAF keeps their order, so
  // no membership event falls between the two (a restarted coordinator misses no death).
  const size_t expected = static_cast<size_t>(k.count);
  self_->request(head_, Rpc(), runtime::members_table_atom::value)
      .then(
          [this, expected](const std::vector<runtime::MemberInfo>& table) {
            std::vector<std::string> dead;
            for (const runtime::MemberInfo& m : table) {
              if (m.kind == runtime::MemberKind::kWorker && m.state == runtime::MemberState::kDead)
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
            Stop(caf::make_message(JobFailed{WireStatus::From(
                absl::UnavailableError(absl::StrCat("cannot read the membership table from the "
                                                    "head: ",
                                                    self_->system().render(e))))}));
          });
}

namespace {
// Losses as the core takes them: by microbatch (a malformed message's extra entries dropped).
std::map<int32_t, double> ByMicrobatch(const std::vector<int32_t>& ks,
                                       const std::vector<double>& losses) {
  std::map<int32_t, double> out;
  for (size_t i = 0; i < ks.size() && i < losses.size(); ++i) out[ks[i]] = losses[i];
  return out;
}
}  // namespace

void Coordinator::HandleStepDone(const StepDone& m) {
  if (m.step > 0 && m.status.ToStatus().ok()) {
    rank_compute_seconds_ += m.compute_seconds;
    rank_schedule_seconds_ += m.schedule_seconds;
    rank_exchange_seconds_ += m.exchange_seconds;
    rank_exposed_seconds_ += m.exposed_seconds;
    rank_step_seconds_ += m.step_seconds;
    rank_update_seconds_ += m.update_seconds;
    rank_delta_steps_ += m.param_delta ? 1 : 0;
    ++rank_steps_;
  }
  if (m.status.ToStatus().ok()) {
    NoteRankStep(m);
    if (m.step != norm_.step || m.generation != norm_.generation) {
      norm_ = {m.generation, m.step, m.grad_norm, true};
    } else if (m.grad_norm != norm_.value &&
               !(std::isnan(m.grad_norm) && std::isnan(norm_.value))) {
      norm_.agree = false;
    }
    eval_seconds_ = std::max(eval_seconds_, m.eval_seconds);
    NoteOuter(m);
  }
  Execute(core_->OnStepped(m.generation, m.step, m.worker, m.status.ToStatus(),
                           ByMicrobatch(m.microbatches, m.losses), Now(), m.blamed,
                           ByMicrobatch(m.eval_microbatches, m.eval_losses)));
}

caf::behavior Coordinator::Behavior() {
  self_->send(driver_, CoordinatorHello{caf::actor_cast<caf::actor>(self_)});
  // The driver is the job's owner (its supervisor, its report's reader): without it the job
  // would run on, unseen, holding its workers.
  self_->monitor(driver_);
  // Asks the head for the lease once the driver has named it (KnownRanks).
  Carry(gate_.OnTick(Now()));
  self_->set_down_handler([this](caf::down_msg& m) { HandleDown(m); });
  return {
      [this](const KnownRanks& k) { HandleKnownRanks(k); },
      [this](const RankJoined& j) { HandleJoin(j); },
      // `troupe job stop` (through the head and the driver): every rank stopped, the record kept.
      [this](runtime::job_stop_atom, const std::string& id) {
        Stop(caf::make_message(JobFailed{WireStatus::From(absl::CancelledError(absl::StrCat(
            "job ", id, " stopped by `troupe job stop` at step ", core_->committed())))}));
      },
      [this](runtime::membership_atom, const runtime::MembershipEvent& e) { HandleMembership(e); },
      [this](give_up_atom, int32_t n) {
        Execute(core_->OnGiveUp(n, "given up for a queued job of higher priority", Now()));
      },
      [this](const RankConfigured& m) {
        Execute(core_->OnConfigured(m.generation, m.worker, m.status.ToStatus(), Now(), m.blamed));
      },
      [this](const StepDone& m) { HandleStepDone(m); },
      [this](const ShardWritten& m) {
        Execute(core_->OnShardWritten(m.generation, m.step, m.index, m.info, m.status.ToStatus(),
                                      Now()));
      },
      [this](const FinalParams& m) {
        Execute(core_->OnFinal(m.generation, m.crc, m.num_params, m.steps, Now(),
                               ByMicrobatch(m.eval_microbatches, m.eval_losses)));
      },
      [this](timer_atom, uint64_t timer) { Execute(core_->OnTimer(timer, Now())); },
      [this](lease_tick_atom) { Carry(gate_.OnTick(Now())); },
      [this](head_tick_atom) { HeadTick(); },
      [this](put_atom, const std::string& key, const std::string& value) {
        kv_[key] = value;
        return true;
      },
      [this](get_atom, const KvKeys& k) {
        KvValues v;
        v.values.resize(k.keys.size());
        for (size_t i = 0; i < k.keys.size(); ++i) {
          auto it = kv_.find(k.keys[i]);
          if (it == kv_.end()) {
            v.missing.push_back(static_cast<int32_t>(i));
          } else {
            v.values[i] = it->second;
          }
        }
        return v;
      },
  };
}

}  // namespace internal

namespace {

caf::behavior CoordinatorActor(runtime::Actor* self, const std::string& spec_text,
                               const caf::actor& driver) {
  auto c = std::make_shared<internal::Coordinator>(self, self->actor_name(), driver);
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
  r.AddMessageType<train::GenerationPlan>("troupe.GenerationPlan");
  r.AddMessageType<train::ShardFileInfo>("troupe.ShardFileInfo");
  r.AddMessageType<JobReport>("troupe.JobReport");
  r.AddMessageType<ConfigureRank>("troupe.ConfigureRank");
  r.AddMessageType<RankConfigured>("troupe.RankConfigured");
  r.AddMessageType<KvKeys>("troupe.KvKeys");
  r.AddMessageType<KvValues>("troupe.KvValues");
  r.AddMessageType<RunStep>("troupe.RunStep");
  r.AddMessageType<StepDone>("troupe.StepDone");
  r.AddMessageType<CommitRank>("troupe.CommitRank");
  r.AddMessageType<AbortBelow>("troupe.AbortBelow");
  r.AddMessageType<RankEpoch>("troupe.RankEpoch");
  r.AddMessageType<ArmKill>("troupe.ArmKill");
  r.AddMessageType<Evict>("troupe.Evict");
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
