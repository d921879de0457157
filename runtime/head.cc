// The head's membership: every message about a member goes to MembershipCore, whose actions are
// carried out here in order (head_actor.h lists the other parts of the actor).
#include "internal/head.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "head_actor.h"
#include "internal/resources.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime::internal {
namespace {

MembershipCore::Options CoreOptions(const ClusterOptions& o, std::string build_id) {
  MembershipCore::Options c;
  c.heartbeat_interval = o.heartbeat_interval;
  c.heartbeat_timeout = o.heartbeat_timeout;
  c.hung_timeout = o.hung_timeout;
  c.protocol_version = kClusterProtocolVersion;
  c.build_id = std::move(build_id);
  return c;
}

absl::StatusOr<scheduler::NodeSpec> ParseNodeSpec(const std::string& name,
                                                  const std::string& resources,
                                                  const std::string& labels) {
  scheduler::NodeSpec spec;
  spec.name = name;
  TROUPE_ASSIGN_OR_RETURN(auto r, ParseResources(resources, "--resources"));
  spec.resources = r;
  TROUPE_ASSIGN_OR_RETURN(auto l, ParseLabels(labels, "--labels"));
  spec.labels = l;
  spec.labels[kNodeLabel] = name;
  return spec;
}

}  // namespace

HeadActor::HeadActor(caf::actor_config& cfg, ClusterOptions options, std::string build_id,
                     std::shared_ptr<HeadStore> store)
    : caf::event_based_actor(cfg),
      options_(std::move(options)),
      store_(std::move(store)),
      core_(CoreOptions(options_, std::move(build_id))) {}

caf::behavior HeadActor::make_behavior() {
  if (store_) Restore();
  set_down_handler([this](caf::down_msg& dm) { HandleDown(dm); });
  // An error that is no answer to a request of the head's (a member that could not handle one of
  // its messages answers with unexpected_message) is logged: CAF's default ends the actor, and a
  // head that ended so took no further heartbeat or tick while its process lived on (found by
  // bench/scale: a node that ignored a fence).
  set_error_handler([this](caf::error& e) {
    aout(this) << "troupe-head: ignored an error message: " << system().render(e) << std::endl;
  });
  delayed_send(this, options_.heartbeat_interval / 4, tick_atom::value);
  return MembershipHandlers()
      .or_else(DirectoryHandlers())
      .or_else(JobHandlers())
      .or_else(GangHandlers())
      .or_else(ViewHandlers());
}

caf::message_handler HeadActor::MembershipHandlers() {
  return {
      [this](cluster_hello_atom, uint32_t version, const std::string& build_id,
             const std::string& kind, const std::string& name) -> caf::result<uint32_t> {
        return HandleHello(version, build_id, kind, name);
      },
      [this](reg_node_atom, const std::string& name, const std::string& resources,
             const std::string& labels, const std::string& address, const std::string& host,
             const caf::actor& agent) -> caf::result<uint64_t> {
        return HandleRegisterNode(name, resources, labels, address, host, agent);
      },
      [this](reg_worker_atom, const std::string& id, const std::string& node, int64_t pid,
             const caf::actor& worker, int32_t port, int32_t direct_port) -> caf::result<uint64_t> {
        return HandleRegisterWorker(id, node, pid, worker, port, direct_port);
      },
      [this](heartbeat_atom, const std::string& id, uint64_t base, uint64_t version,
             const std::vector<ActorStat>& changes) {
        HandleHeartbeat(id, base, version, changes);
      },
      // The status text is for older agents' logs; the wait status says it all.
      [this](wexit_atom, const std::string& id, int64_t /*pid*/, const std::string& /*status*/,
             const std::string& tail, int32_t wait_status,
             bool fenced) { Execute(core_.OnWorkerExit(id, tail, wait_status, fenced)); },
      [this](flush_atom, const std::string& id) { Execute(core_.OnFlush(id)); },
      [this](release_node_atom, const std::string& node) { Execute(core_.OnRelease(node)); },
      [this](drain_atom, const std::string& node, int64_t grace_ms, const std::string& notice) {
        Execute(core_.OnDrain(node, grace_ms, notice));
        ReleaseIfIdle(node);
      },
      [this](leave_atom, const std::string& node) { Execute(core_.OnLeave(node)); },
      [this](members_atom) { return core_.Members(); },
      // Only a generation the store holds is told (a successor head goes on from it).
      [this](generation_atom) { return AnswerStored(core_.generation()); },
      [this](subscribe_atom, const caf::actor& who) {
        subscribers_.push_back(who);
        monitor(who);
      },
      [this](node_fault_atom, const std::string& node, const NodeFault& f) -> caf::result<bool> {
        return HandleNodeFault(node, f);
      },
      [this](store_flush_atom) { FlushStoreBatch(); },
      // A head stopping on a signal: the pending batch written before it exits (roles.cc).
      [this](store_flush_atom, bool) {
        FlushStoreBatch();
        return true;
      },
      [this](tick_atom) {
        Execute(core_.OnTick(Clock::now()));
        delayed_send(this, options_.heartbeat_interval / 4, tick_atom::value);
      },
  };
}

// The first message of every join: a member of another protocol version or build is refused
// (and the refusal published) before it can send anything else.
caf::result<uint32_t> HeadActor::HandleHello(uint32_t version, const std::string& build_id,
                                             const std::string& kind, const std::string& name) {
  const std::vector<MembershipAction> actions = core_.OnHello(version, build_id, kind, name);
  Execute(actions);
  if (absl::Status s = Refusal(actions); !s.ok()) return StatusToError(s);
  return kClusterProtocolVersion;
}

caf::result<uint64_t> HeadActor::HandleRegisterNode(
    const std::string& name, const std::string& resources, const std::string& labels,
    const std::string& address, const std::string& host, const caf::actor& agent) {
  if (absl::Status s = core_.CheckNodeJoin(name); !s.ok()) return StatusToError(s);
  auto spec = ParseNodeSpec(name, resources, labels);
  if (!spec.ok()) {
    return StatusToError(absl::InvalidArgumentError(
        absl::StrCat("node '", name, "' refused: ", spec.status().message())));
  }
  if (absl::Status s = sched_.AddNode(*spec); !s.ok()) {
    return StatusToError(
        absl::Status(s.code(), absl::StrCat("node '", name, "' refused: ", s.message())));
  }
  handles_[name] = agent;
  monitor(agent);
  MemberInfo node;
  node.id = name;
  node.resources = resources;
  node.labels = labels;
  node.address = address;
  node.host = host;
  Execute(core_.OnNodeJoined(node, Clock::now()));
  return AnswerStored(core_.generation());
}

caf::result<uint64_t> HeadActor::HandleRegisterWorker(const std::string& id,
                                                      const std::string& node, int64_t pid,
                                                      const caf::actor& worker, int32_t port,
                                                      int32_t direct_port) {
  MemberInfo w;
  w.id = id;
  w.node = node;
  w.pid = pid;
  w.port = port;
  w.direct_port = direct_port;
  const std::vector<MembershipAction> actions = core_.OnRegisterWorker(w, Clock::now());
  if (absl::Status s = Refusal(actions); !s.ok()) return StatusToError(s);
  handles_[id] = worker;
  hosted_[id] = 0;
  monitor(worker);
  Execute(actions);
  return AnswerStored(core_.generation());
}

// A worker's or node's heartbeat, with what changed in its actors' handler times: a handler
// running longer than hung_timeout is reported once as actor_hung.
void HeadActor::HandleHeartbeat(const std::string& id, uint64_t base, uint64_t version,
                                const std::vector<ActorStat>& changes) {
  Heartbeat beat{base, version, {}};
  beat.changes.reserve(changes.size());
  for (const ActorStat& s : changes) {
    beat.changes.push_back({s.name, s.progress, s.busy_ms, s.generation});
  }
  Execute(core_.OnHeartbeat(id, beat, Clock::now()));
}

// Chaos by name: the node's agent carries it out on its own host.
caf::result<bool> HeadActor::HandleNodeFault(const std::string& node, const NodeFault& f) {
  const MemberInfo* m = core_.Find(node);
  if (m == nullptr || m->kind != MemberKind::kNode || m->state == MemberState::kDead) {
    return StatusToError(
        absl::NotFoundError(absl::StrCat(to_string(f.kind), ": no live node '", node, "'")));
  }
  send(Handle(node), node_fault_atom::value, f);
  return true;
}

void HeadActor::HandleDown(const caf::down_msg& dm) {
  DriverDown(dm);
  subscribers_.erase(std::remove_if(subscribers_.begin(), subscribers_.end(),
                                    [&](const caf::actor& a) { return a.address() == dm.source; }),
                     subscribers_.end());
  if (NamedActorDown(dm)) return;
  for (const auto& [id, handle] : handles_) {
    const MemberInfo* m = core_.Find(id);
    if (handle.address() != dm.source || m == nullptr || m->state == MemberState::kDead) continue;
    Execute(core_.OnConnectionLost(id, caf::to_string(dm.reason)));
    return;
  }
}

absl::Status HeadActor::Refusal(const std::vector<MembershipAction>& actions) {
  for (const MembershipAction& a : actions) {
    if (a.kind == MembershipAction::Kind::kRefuse) return a.status;
  }
  return absl::OkStatus();
}

void HeadActor::Execute(const std::vector<MembershipAction>& actions) {
  using K = MembershipAction::Kind;
  for (const MembershipAction& a : actions) {
    switch (a.kind) {
      case K::kPublish:
        Publish(a);
        break;
      case K::kRefuse:  // the answer to the request (Refusal)
        break;
      case K::kPlaceJobs:
        PlaceJobs();
        break;
      case K::kAskRejoin:
        send(Handle(a.member), rejoin_atom::value);
        break;
      case K::kSyncHeartbeats:
        send(Handle(a.member), heartbeat_sync_atom::value);
        break;
      case K::kFence:
        send(Handle(a.node), fence_atom::value, a.member);
        break;
      case K::kReleaseNode:
        aout(this) << "troupe-head: node " << a.member << " released: handed over, it leaves now"
                   << std::endl;
        send(Handle(a.member), release_atom::value);
        break;
      case K::kReleaseLeases:
        leases_.ReleaseWorker(a.member);
        break;
      case K::kReleaseActors:
        ReleaseActorsOf(a.member, a.detail);
        break;
      case K::kSchedulerDrain:
        (void)sched_.DrainNode(a.node);
        break;
      case K::kSchedulerRemove:
        (void)sched_.RemoveNodes({a.node});
        break;
      case K::kFailJobs:
        FailJobsOn(a.node, a.detail);
        break;
      case K::kFlushAfter:
        delayed_send(this, a.delay, flush_atom::value, a.member);
        break;
    }
  }
}

const caf::actor& HeadActor::Handle(const std::string& member) const {
  static const caf::actor kNone;
  auto it = handles_.find(member);
  return it == handles_.end() ? kNone : it->second;
}

void HeadActor::Publish(const MembershipAction& a) {
  if (store_ && a.bump) {
    if (!batch_) {
      batch_.emplace();
      send(this, store_flush_atom::value);  // behind every message queued now
    }
    batch_->generation = a.event.generation;
    if (a.record) {
      auto [it, fresh] = batch_->member_index.try_emplace(a.record->id, batch_->members.size());
      if (fresh) {
        batch_->members.push_back(*a.record);
      } else {
        batch_->members[it->second] = *a.record;
      }
    }
  }
  if (batch_) {
    batch_->events.push_back(a.event);
  } else {
    Announce(a.event);
  }
}

void HeadActor::FlushStoreBatch() {
  if (!batch_) return;
  StoreBatch b = std::move(*batch_);
  batch_.reset();
  StoreFailed(store_->PutMembership(b.generation, b.members));
  for (const MembershipEvent& e : b.events) Announce(e);
  for (size_t i = 0; i < b.answers.size(); ++i) b.answers[i].deliver(b.answer_generations[i]);
}

void HeadActor::Announce(const MembershipEvent& e) {
  aout(this) << "troupe-head: " << e.DebugString() << std::endl;
  for (const auto& s : subscribers_) send(s, membership_atom::value, e);
}

caf::result<uint64_t> HeadActor::AnswerStored(uint64_t generation) {
  if (!batch_) return generation;
  batch_->answers.push_back(make_response_promise());
  batch_->answer_generations.push_back(generation);
  return batch_->answers.back();
}

// The state a previous head left in the store: the generation goes on from it, and what it knew
// is kept for its successor's report (members re-register as they reconnect).
void HeadActor::Restore() {
  absl::StatusOr<HeadStore::State> s = store_->Load();
  if (!s.ok()) return StoreFailed(s.status());
  size_t alive = 0;
  for (const MemberInfo& m : s->members) alive += m.state != MemberState::kDead ? 1 : 0;
  const size_t known = s->members.size();
  core_.Restore(s->generation, std::move(s->members));
  for (const auto& [id, record] : s->jobs) StoreFailed(jobs_.Restore(id, record));
  if (known > 0) leases_from_ = Clock::now() + options_.heartbeat_timeout;
  aout(this) << "troupe-head: store epoch " << store_->epoch() << ": generation "
             << core_.generation() << ", " << alive << " of " << known
             << " known members were alive; they re-register as they reconnect" << std::endl;
}

void HeadActor::StoreFailed(const absl::Status& s) {
  if (s.ok()) return;
  std::cerr << "troupe head: " << s.message() << "; stopping" << std::endl;
  std::fflush(nullptr);
  _exit(s.code() == absl::StatusCode::kFailedPrecondition ? 3 : 1);
}

caf::actor SpawnHead(caf::actor_system& system, ClusterOptions options, std::string build_id,
                     std::shared_ptr<HeadStore> store) {
  return system.spawn<HeadActor>(std::move(options), std::move(build_id), std::move(store));
}

// A draining node that hosts nothing of any job — no named actor or rank reservation on its
// workers, no running driver — is released now rather than at the end of its notice: an agent
// stopped after its job ended (SLURM's end of a job) leaves at once.
void HeadActor::ReleaseIfIdle(const std::string& node) {
  const MemberInfo* n = core_.Find(node);
  if (n == nullptr || n->kind != MemberKind::kNode || n->state != MemberState::kDraining) return;
  auto on_node = [&](const std::string& worker) {
    const MemberInfo* w = core_.Find(worker);
    return w != nullptr && w->node == node;
  };
  for (const auto& [name, named] : directory_) {
    if (on_node(named.worker)) return;
  }
  for (const auto& [name, r] : reserved_) {
    if (on_node(r.worker)) return;
  }
  for (const auto& [id, j] : jobs_.jobs()) {
    if (j.node == node && !JobEnded(j.state)) return;
  }
  Execute(core_.OnRelease(node));
}

}  // namespace troupe::runtime::internal
