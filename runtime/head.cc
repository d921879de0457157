#include "internal/head.h"

#include <unistd.h>

#include <iostream>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "caf/all.hpp"
#include "internal/cluster_protocol.h"
#include "internal/jobs.h"
#include "internal/lease.h"
#include "internal/resources.h"
#include "troupe/runtime/status.h"
#include "troupe/scheduler/scheduler.h"

namespace troupe::runtime::internal {
namespace {

using Clock = std::chrono::steady_clock;

// An unschedulable request: ResourceExhausted when waiting for resources may help,
// FailedPrecondition when no node could ever fit (what ClusterClient callers branch on).
absl::Status Unschedulable(const scheduler::Unschedulable& u, const std::string& what) {
  std::string m = absl::StrCat("unschedulable (",
                               u.retry_can_help ? "waiting may help" : "no node could ever fit",
                               "): ", what, " ", u.reason);
  return u.retry_can_help ? absl::ResourceExhaustedError(m) : absl::FailedPreconditionError(m);
}

struct Member {
  MemberInfo info;
  caf::actor handle;  // node agent or worker actor
  Clock::time_point last_seen;
  // worker only:
  std::map<std::string, ActorStat> actors;  // by actor name, from heartbeats
  std::set<std::string> hung;               // actors already reported hung
  bool down_reported = false;
  bool rejoin_asked = false;  // node only: declared dead, heard from again, told to join again
  bool exit_known = false;    // the node agent's waitpid status has arrived
  std::string exit_detail, stderr_tail;  // from the node agent's waitpid
  ExitCause cause = ExitCause::kNone;    // how it died, as far as the head knows
  int exit_code = -1, signal = 0;
  size_t hosted = 0;  // actors spawned here, for placement
};

// Every node carries this label, so a request can be pinned to one node by a selector.
constexpr char kNodeLabel[] = "troupe.node";

absl::StatusOr<scheduler::NodeSpec> ParseNodeSpec(const std::string& name,
                                                  const std::string& resources,
                                                  const std::string& labels) {
  scheduler::NodeSpec spec;
  spec.name = name;
  auto r = ParseResources(resources, "--resources");
  if (!r.ok()) return r.status();
  spec.resources = *r;
  auto l = ParseLabels(labels, "--labels");
  if (!l.ok()) return l.status();
  spec.labels = *l;
  spec.labels[kNodeLabel] = name;
  return spec;
}

class HeadActor final : public caf::event_based_actor {
 public:
  HeadActor(caf::actor_config& cfg, ClusterOptions options, std::string build_id,
            std::shared_ptr<HeadStore> store)
      : caf::event_based_actor(cfg),
        options_(std::move(options)),
        build_id_(std::move(build_id)),
        store_(std::move(store)) {}

  caf::behavior make_behavior() override {
    if (store_) Restore();
    set_down_handler([this](caf::down_msg& dm) { HandleDown(dm); });
    delayed_send(this, options_.heartbeat_interval / 4, tick_atom::value);
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
               const caf::actor& worker, int32_t port,
               int32_t direct_port) -> caf::result<uint64_t> {
          return HandleRegisterWorker(id, node, pid, worker, port, direct_port);
        },
        [this](heartbeat_atom, const std::string& id, const std::vector<ActorStat>& stats) {
          HandleHeartbeat(id, stats);
        },
        // The status text is for older agents' logs; the wait status says it all.
        [this](wexit_atom, const std::string& id, int64_t /*pid*/, const std::string& /*status*/,
               const std::string& tail, int32_t wait_status,
               bool fenced) { HandleWorkerExit(id, tail, wait_status, fenced); },
        [this](flush_atom, const std::string& id) { ReportWorkerDown(id); },
        [this](release_node_atom, const std::string& node) {
          auto it = members_.find(node);
          if (it == members_.end() || it->second.info.kind != MemberKind::kNode ||
              it->second.info.state != MemberState::kDraining) {
            return;
          }
          aout(this) << "troupe-head: node " << node << " released: handed over, it leaves now"
                     << std::endl;
          send(it->second.handle, release_atom::value);
        },
        [this](reg_actor_atom, const std::string& worker, const std::string& name, uint64_t gen,
               const caf::actor& h) { HandleRegisterActor(worker, name, gen, h); },
        [this](drain_atom, const std::string& node, int64_t grace_ms, const std::string& notice) {
          auto it = members_.find(node);
          if (it == members_.end() || it->second.info.state != MemberState::kAlive) return;
          it->second.info.state = MemberState::kDraining;
          (void)sched_.DrainNode(node);
          Publish(MembershipKind::kNodeDraining, node, node, 0,
                  absl::StrCat("preemption notice (", notice, "); leaves within ", grace_ms, "ms"));
        },
        [this](leave_atom, const std::string& node) { MarkNodeDead(node, "left"); },
        [this](spawn_atom, const std::string& type, const caf::message& args,
               const std::string& name, uint64_t gen,
               const Placement& where) -> caf::result<caf::actor, std::string, std::string> {
          return HandleSpawn(type, args, name, gen, where);
        },
        [this](pg_atom, const std::string& name, const std::vector<std::string>& bundles,
               GroupStrategy strategy,
               const std::string& domain_key) -> caf::result<std::vector<std::string>> {
          return HandlePlacementGroup(name, bundles, strategy, domain_key);
        },
        [this](lookup_atom, const std::string& name)
            -> caf::result<caf::actor, uint64_t, std::string, std::string> {
          auto it = directory_.find(name);
          if (it == directory_.end()) {
            return StatusToError(
                absl::NotFoundError(absl::StrCat("no actor named '", name, "' in the cluster")));
          }
          return {it->second.handle, it->second.generation, it->second.worker,
                  DirectEndpoint(it->second.worker)};
        },
        [this](members_atom) {
          std::vector<MemberInfo> out;
          for (const auto& [id, m] : members_) out.push_back(m.info);
          return out;
        },
        [this](generation_atom) { return generation_; },
        [this](subscribe_atom, const caf::actor& who) {
          subscribers_.push_back(who);
          monitor(who);
        },
        [this](lease_atom, const std::string& name) -> caf::result<uint64_t, int64_t> {
          return HandleLease(name);
        },
        [this](node_fault_atom, const std::string& node, const NodeFault& f) -> caf::result<bool> {
          return HandleNodeFault(node, f);
        },
        [this](job_submit_atom, const std::string& name, const std::string& spec,
               int64_t steps) -> std::string {
          const std::string id = jobs_.Submit(name, spec, steps, Now());
          aout(this) << "troupe-head: job " << id << " submitted (" << name << ", " << steps
                     << " steps)" << std::endl;
          PutJob(id);
          PlaceJobs();
          return id;
        },
        [this](job_register_atom, const std::string& id, const std::string& name,
               const std::string& spec, int64_t steps, int64_t pid, const std::string& node,
               const caf::actor& driver) -> caf::result<std::string> {
          absl::StatusOr<std::string> r = jobs_.Register(id, name, spec, steps, pid, node, Now());
          if (!r.ok()) return StatusToError(r.status());
          drivers_[*r] = driver;
          monitor(driver);
          aout(this) << "troupe-head: job " << *r << " running, its driver pid " << pid
                     << (node.empty() ? "" : " on ") << node << std::endl;
          PutJob(*r);
          return *r;
        },
        [this](job_events_atom, const std::string& id, const std::vector<std::string>& lines) {
          jobs_.Ingest(id, lines);
        },
        [this](job_log_atom, const std::string& id, const std::vector<std::string>& lines) {
          jobs_.Log(id, lines);
        },
        [this](job_end_atom, const std::string& id, const std::string& state,
               const std::string& error, const std::string& report) -> bool {
          EndJob(id, ParseJobState(state).value_or(JobState::kFailed), error, report);
          return true;
        },
        [this](job_exit_atom, const std::string& id, int64_t pid, int32_t wait_status,
               const std::string& tail) {
          SupervisionEvent e = ProcessExitEvent("head", id, pid, wait_status, false);
          std::string why =
              absl::StrCat("its driver (pid ", pid, ") ", e.reason, " before the job ended");
          if (!tail.empty()) absl::StrAppend(&why, "; its last lines:\n", tail);
          EndJob(id, JobState::kFailed, why, "");
        },
        [this](job_stop_atom, const std::string& id) -> caf::result<bool> {
          Job* j = jobs_.Find(id);
          if (j == nullptr) {
            return StatusToError(absl::NotFoundError(absl::StrCat("no job '", id, "'")));
          }
          if (JobEnded(j->state)) return false;
          auto d = drivers_.find(id);
          if (j->state == JobState::kPending || d == drivers_.end()) {
            EndJob(id, JobState::kStopped, "stopped by `troupe job stop` before it ran", "");
          } else {
            send(d->second, job_stop_atom::value, id);
          }
          return true;
        },
        [this](ops_view_atom, const std::string& what,
               const std::string& arg) -> caf::result<std::string> {
          absl::StatusOr<std::string> v = View(what, arg);
          if (!v.ok()) return StatusToError(v.status());
          return *v;
        },
        [this](tick_atom) {
          CheckHeartbeats();
          delayed_send(this, options_.heartbeat_interval / 4, tick_atom::value);
        },
    };
  }

 private:
  struct Named {
    caf::actor handle;
    uint64_t generation;
    std::string worker;
    caf::actor requester;  // told when the actor goes down
  };

  // Removes `it` from the directory and tells whoever spawned it.
  std::map<std::string, struct Named>::iterator NamedDown(std::map<std::string, Named>::iterator it,
                                                          const caf::error& reason,
                                                          const std::string& detail) {
    if (it->second.requester) {
      send(it->second.requester, rdown_atom::value, it->first, it->second.generation, reason,
           detail);
    }
    (void)sched_.ReleaseActor(it->first);
    if (store_) StoreFailed(store_->RemoveActor(it->first));
    if (auto w = members_.find(it->second.worker); w != members_.end() && w->second.hosted > 0) {
      w->second.hosted--;
    }
    return directory_.erase(it);
  }

  // A lease on `name` for the actor registered under it (see lease_atom in cluster.h).
  caf::result<uint64_t, int64_t> HandleLease(const std::string& name) {
    auto it = directory_.find(name);
    const caf::strong_actor_ptr& sender = current_sender();
    if (it == directory_.end() || !sender || sender->node() != it->second.handle.node() ||
        sender->id() != it->second.handle.id()) {
      return StatusToError(absl::FailedPreconditionError(absl::StrCat(
          "no lease on '", name, "': the asker is not the actor registered under that name",
          it == directory_.end() ? " (none is)"
                                 : absl::StrCat(" (generation ", it->second.generation, " on ",
                                                it->second.worker, " is)"))));
    }
    auto w = members_.find(it->second.worker);
    if (w == members_.end() || w->second.info.state != MemberState::kAlive) {
      return StatusToError(absl::FailedPreconditionError(absl::StrCat(
          "no lease on '", name, "': its worker ", it->second.worker, " is not alive")));
    }
    const Clock::duration length = options_.heartbeat_timeout;
    // A lease its predecessor granted (this head cannot know whose) may still run: none until it
    // has surely run out. The holder asks again (Unavailable) and keeps its epoch's successor.
    if (const Clock::time_point now = Clock::now(); now < leases_from_) {
      return StatusToError(absl::UnavailableError(absl::StrCat(
          "no lease on '", name, "' for another ",
          std::chrono::duration_cast<std::chrono::milliseconds>(leases_from_ - now).count(),
          "ms: this head took over from one whose leases may still run")));
    }
    auto grant = leases_.Acquire(
        name, absl::StrCat(it->second.worker, " generation ", it->second.generation),
        it->second.worker, Clock::now(), length,
        static_cast<uint64_t>(absl::ToUnixMicros(absl::Now())));
    if (!grant.ok()) return StatusToError(grant.status());
    return {grant->epoch, std::chrono::duration_cast<std::chrono::milliseconds>(length).count()};
  }

  // The first message of every join: a member of another protocol version or build is refused
  // (and the refusal published) before it can send anything else.
  caf::result<uint32_t> HandleHello(uint32_t version, const std::string& build_id,
                                    const std::string& kind, const std::string& name) {
    std::string why;
    if (version != kClusterProtocolVersion) {
      why = absl::StrCat(kind, " '", name, "' refused: it speaks cluster protocol version ",
                         version, ", this head speaks version ", kClusterProtocolVersion,
                         "; run the same troupe release everywhere");
    } else if (build_id != build_id_) {
      why =
          absl::StrCat(kind, " '", name, "' refused: its build id ", build_id,
                       " differs from the head's ", build_id_, "; run the same binary everywhere");
    } else {
      return kClusterProtocolVersion;
    }
    // The kind is text in this frozen message; a node is its own node in the event.
    auto member = ParseMemberKind(kind);
    const bool node = member.ok() && *member == MemberKind::kNode;
    Publish(MembershipKind::kRefused, name, node ? name : "", 0, why, "", /*bump=*/false);
    return StatusToError(absl::FailedPreconditionError(why));
  }

  void Publish(MembershipKind kind, const std::string& subject, const std::string& node,
               int64_t pid, const std::string& detail, const std::string& tail = "",
               bool bump = true, ExitCause cause = ExitCause::kNone, int exit_code = -1,
               int signal = 0) {
    if (bump) ++generation_;
    MembershipEvent e{generation_, kind, subject, node,      pid,
                      detail,      tail, cause,   exit_code, signal};
    if (store_ && bump) {
      absl::Status s = store_->PutGeneration(generation_);
      if (auto m = members_.find(subject); s.ok() && m != members_.end()) {
        s = store_->PutMember(m->second.info);
      }
      StoreFailed(s);
    }
    aout(this) << "troupe-head: " << e.DebugString() << std::endl;
    for (const auto& s : subscribers_) send(s, membership_atom::value, e);
  }

  caf::result<uint64_t> HandleRegisterNode(const std::string& name, const std::string& resources,
                                           const std::string& labels, const std::string& address,
                                           const std::string& host, const caf::actor& agent) {
    auto it = members_.find(name);
    if (it != members_.end() && it->second.info.state != MemberState::kDead) {
      return StatusToError(
          absl::AlreadyExistsError(absl::StrCat("node '", name, "' is already a member")));
    }
    auto spec = ParseNodeSpec(name, resources, labels);
    if (!spec.ok()) {
      return StatusToError(absl::InvalidArgumentError(
          absl::StrCat("node '", name, "' refused: ", spec.status().message())));
    }
    if (absl::Status s = sched_.AddNode(*spec); !s.ok()) {
      return StatusToError(
          absl::Status(s.code(), absl::StrCat("node '", name, "' refused: ", s.message())));
    }
    Member m;
    m.info = MemberInfo{name,   MemberKind::kNode, name, MemberState::kAlive, 0, resources,
                        labels, address,           host};
    m.handle = agent;
    m.last_seen = Clock::now();
    monitor(agent);
    members_[name] = std::move(m);
    Publish(MembershipKind::kNodeAlive, name, name, 0,
            absl::StrCat("resources ", resources, " labels ", labels, " address ", address,
                         " host ", host));
    PlaceJobs();
    return generation_;
  }

  caf::result<uint64_t> HandleRegisterWorker(const std::string& id, const std::string& node,
                                             int64_t pid, const caf::actor& worker, int32_t port,
                                             int32_t direct_port) {
    // A worker of a node declared dead would get nothing placed on it (the scheduler dropped its
    // node); the node joins again with new workers instead.
    // A worker once declared dead (here, or by the head before this one) stays dead: its node
    // joins again with new workers instead (fencing).
    bool dead = false;
    if (auto old = members_.find(id); old != members_.end()) {
      dead = old->second.info.state == MemberState::kDead;
    }
    for (const MemberInfo& r : restored_) dead |= r.id == id && r.state == MemberState::kDead;
    if (dead) {
      return StatusToError(absl::FailedPreconditionError(
          absl::StrCat("worker '", id, "' refused: it was declared dead")));
    }
    auto n = members_.find(node);
    if (n == members_.end() || n->second.info.state != MemberState::kAlive) {
      return StatusToError(absl::FailedPreconditionError(
          absl::StrCat("worker '", id, "' refused: its node '", node, "' is ",
                       n == members_.end() ? "unknown" : Name(n->second.info.state))));
    }
    Member m;
    m.info.id = id;
    m.info.kind = MemberKind::kWorker;
    m.info.node = node;
    m.info.state = MemberState::kAlive;
    m.info.pid = pid;
    m.info.address = n->second.info.address;
    m.info.host = n->second.info.host;
    m.info.port = port;
    m.info.direct_port = direct_port;
    m.handle = worker;
    m.last_seen = Clock::now();
    monitor(worker);
    members_[id] = std::move(m);
    Publish(MembershipKind::kWorkerAlive, id, node, pid, "");
    return generation_;
  }

  // A named actor of a worker that rejoined this head (after its predecessor was lost): into the
  // directory, unless a newer incarnation of the name is known. Whoever spawned it is not known
  // here; its loss reaches lookups and monitors, not an rdown.
  void HandleRegisterActor(const std::string& worker, const std::string& name, uint64_t gen,
                           const caf::actor& h) {
    auto w = members_.find(worker);
    if (w == members_.end() || w->second.info.kind != MemberKind::kWorker ||
        w->second.info.state != MemberState::kAlive || !h) {
      return;
    }
    if (auto it = directory_.find(name); it != directory_.end() && it->second.generation >= gen) {
      return;
    }
    directory_[name] = Named{h, gen, worker, caf::actor()};
    w->second.hosted++;
    if (store_) StoreFailed(store_->PutActor({name, worker, gen}));
    monitor(h);
  }

  // A worker's or node's heartbeat, with its actors' handler times: a handler running longer
  // than hung_timeout is reported once as actor_hung.
  void HandleHeartbeat(const std::string& id, const std::vector<ActorStat>& stats) {
    auto it = members_.find(id);
    if (it == members_.end()) return;
    Member& m = it->second;
    if (m.info.state == MemberState::kDead) {
      // A node declared dead (cut off) is heard from again: it joins again as a new member, its
      // workers (fenced, their state stale) replaced by new ones.
      if (m.info.kind == MemberKind::kNode && !m.rejoin_asked) {
        m.rejoin_asked = true;
        send(m.handle, rejoin_atom::value);
      }
      return;
    }
    m.last_seen = Clock::now();
    m.actors.clear();
    for (const auto& s : stats) m.actors[s.name] = s;
    auto hung_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(options_.hung_timeout).count();
    for (const auto& s : stats) {
      if (s.busy_ms >= static_cast<uint64_t>(hung_ms)) {
        if (m.hung.insert(s.name).second) {
          Publish(MembershipKind::kActorHung, s.name, m.info.node, m.info.pid,
                  absl::StrCat("handler running for ", s.busy_ms, "ms on worker ", id,
                               " (progress ", s.progress, ")"),
                  "", /*bump=*/false);
        }
      } else {
        m.hung.erase(s.name);
      }
    }
  }

  // Chaos by name: the node's agent carries it out on its own host.
  caf::result<bool> HandleNodeFault(const std::string& node, const NodeFault& f) {
    auto it = members_.find(node);
    if (it == members_.end() || it->second.info.kind != MemberKind::kNode ||
        it->second.info.state == MemberState::kDead) {
      return StatusToError(
          absl::NotFoundError(absl::StrCat(to_string(f.kind), ": no live node '", node, "'")));
    }
    send(it->second.handle, node_fault_atom::value, f);
    return true;
  }

  // The node agent's waitpid status of a worker. Usually it marks the worker dead; when the head
  // already had (a lost connection whose report waited out the flush delay, or a fence for
  // missed heartbeats), the real status follows as worker_exit, so no death goes unexplained.
  void HandleWorkerExit(const std::string& id, const std::string& tail, int32_t wait_status,
                        bool fenced) {
    auto it = members_.find(id);
    if (it == members_.end() || it->second.exit_known) return;
    leases_.ReleaseWorker(id);  // the process is gone: nothing of it can act under a lease
    Member& m = it->second;
    SupervisionEvent e = ProcessExitEvent("", id, m.info.pid, wait_status, fenced);
    m.exit_known = true;
    m.stderr_tail = tail;
    if (m.down_reported) {
      Publish(MembershipKind::kWorkerExit, id, m.info.node, m.info.pid, "process " + e.reason, tail,
              /*bump=*/false, e.cause, e.exit_code, e.signal);
      return;
    }
    m.exit_detail = "process " + e.reason;
    m.cause = e.cause;
    m.exit_code = e.exit_code;
    m.signal = e.signal;
    MarkWorkerDead(id, m.exit_detail, e.cause);
    ReportWorkerDown(id);
  }

  void MarkWorkerDead(const std::string& id, const std::string& why, ExitCause cause) {
    auto it = members_.find(id);
    if (it == members_.end() || it->second.info.state == MemberState::kDead) return;
    Member& m = it->second;
    m.info.state = MemberState::kDead;
    if (m.exit_detail.empty()) m.exit_detail = why;
    if (m.cause == ExitCause::kNone) m.cause = cause;
    for (auto d = directory_.begin(); d != directory_.end();) {
      d = d->second.worker == id
              ? NamedDown(d, caf::make_error(caf::exit_reason::remote_link_unreachable),
                          "worker " + id + " died: " + why)
              : std::next(d);
    }
    // A node whose last worker died can host nothing more: no new placements there (the
    // scheduler would otherwise keep choosing it and every spawn would fail).
    bool node_has_worker = false;
    for (const auto& [wid, w] : members_) {
      node_has_worker =
          node_has_worker || (w.info.kind == MemberKind::kWorker &&
                              w.info.state == MemberState::kAlive && w.info.node == m.info.node);
    }
    if (auto node = members_.find(m.info.node); !node_has_worker && node != members_.end() &&
                                                node->second.info.state == MemberState::kAlive) {
      (void)sched_.DrainNode(m.info.node);
    }
    // The exit report from the node agent normally follows within milliseconds; wait for it
    // briefly so the down event can carry the exit status and the stderr tail.
    delayed_send(this, std::chrono::milliseconds(250), flush_atom::value, id);
  }

  void ReportWorkerDown(const std::string& id) {
    auto it = members_.find(id);
    if (it == members_.end() || it->second.down_reported ||
        it->second.info.state != MemberState::kDead) {
      return;
    }
    Member& m = it->second;
    m.down_reported = true;
    Publish(MembershipKind::kWorkerDown, id, m.info.node, m.info.pid, m.exit_detail, m.stderr_tail,
            /*bump=*/true, m.cause, m.exit_code, m.signal);
  }

  void MarkNodeDead(const std::string& node, const std::string& why) {
    auto it = members_.find(node);
    if (it == members_.end() || it->second.info.state == MemberState::kDead) return;
    for (auto& [id, m] : members_) {
      if (m.info.kind == MemberKind::kWorker && m.info.node == node &&
          m.info.state != MemberState::kDead) {
        MarkWorkerDead(id, "its node " + why, ExitCause::kLost);
        ReportWorkerDown(id);
      }
    }
    it->second.info.state = MemberState::kDead;
    for (const auto& [id, j] : jobs_.jobs()) {
      if (j.submitted && j.node == node && !JobEnded(j.state)) {
        EndJob(id, JobState::kFailed, absl::StrCat("its driver's node ", node, " ", why), "");
      }
    }
    // Its actors were released above (their workers died with it); nothing is left to move.
    (void)sched_.RemoveNodes({node});
    // A node that left exits 0 right after; otherwise nobody here can see how it ended.
    const bool left = why == "left";
    Publish(MembershipKind::kNodeDead, node, node, it->second.info.pid, why, "", /*bump=*/true,
            left ? ExitCause::kExited : ExitCause::kLost, left ? 0 : -1);
  }

  void HandleDown(const caf::down_msg& dm) {
    // A job whose driver is gone before it said how the job ended (`troupe train` killed; a
    // submitted job's driver is reported by its node agent, with its exit status).
    for (const auto& [jid, driver] : drivers_) {
      const Job* j = jobs_.Find(jid);
      if (driver.address() != dm.source || j == nullptr || j->submitted) continue;
      const std::string id = jid;  // EndJob erases the entry
      EndJob(
          id, JobState::kFailed,
          absl::StrCat("its driver is gone (", caf::to_string(dm.reason), ") before the job ended"),
          "");
      break;
    }
    subscribers_.erase(
        std::remove_if(subscribers_.begin(), subscribers_.end(),
                       [&](const caf::actor& a) { return a.address() == dm.source; }),
        subscribers_.end());
    for (auto d = directory_.begin(); d != directory_.end(); ++d) {
      if (d->second.handle.address() == dm.source) {
        NamedDown(d, dm.reason, "actor exited");
        return;
      }
    }
    for (auto& [id, m] : members_) {
      if (m.handle.address() != dm.source || m.info.state == MemberState::kDead) continue;
      std::string why = "connection lost (" + caf::to_string(dm.reason) + ")";
      if (m.info.kind == MemberKind::kWorker) {
        MarkWorkerDead(id, why, ExitCause::kLost);
      } else {
        MarkNodeDead(id, why);
      }
      return;
    }
  }

  void CheckHeartbeats() {
    auto now = Clock::now();
    // Silence that overlaps the head's own stall is not the members': on an oversubscribed host
    // the head process can go unscheduled for over a heartbeat_timeout, and on waking it would
    // find every member silent at once (seen: all four nodes of a job declared dead together,
    // 1.07-1.18 s against a 1 s timeout, and the job lost). A tick later than two heartbeat
    // intervals shifts every member's last heartbeat by the stall instead; the heartbeats that
    // queued up meanwhile arrive within the next ticks.
    const auto tick = options_.heartbeat_interval / 4;
    if (last_tick_ != Clock::time_point{} && now - last_tick_ > 2 * options_.heartbeat_interval) {
      const auto stall = now - last_tick_ - tick;
      for (auto& [id, m] : members_) m.last_seen += stall;
    }
    last_tick_ = now;
    std::vector<std::string> silent;
    for (auto& [id, m] : members_) {
      if (m.info.state == MemberState::kDead) continue;
      if (now - m.last_seen > options_.heartbeat_timeout) silent.push_back(id);
    }
    for (const auto& id : silent) {
      Member& m = members_[id];
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - m.last_seen).count();
      std::string why = absl::StrCat(
          "no heartbeat for ", ms, "ms (timeout ",
          std::chrono::duration_cast<std::chrono::milliseconds>(options_.heartbeat_timeout).count(),
          "ms)");
      if (m.info.kind == MemberKind::kWorker) {
        MarkWorkerDead(id, absl::StrCat("fenced: ", why), ExitCause::kFenced);
        ReportWorkerDown(id);
        // Fence it: a stopped process must not come back and act on stale state.
        auto node = members_.find(m.info.node);
        if (node != members_.end() && node->second.info.state != MemberState::kDead) {
          send(node->second.handle, fence_atom::value, id);
        }
      } else {
        // A silent node may still hear us (a one-way partition): its agent kills the workers,
        // which must not act on stale state either; when it is heard from again it rejoins.
        for (const auto& [wid, w] : members_) {
          if (w.info.kind == MemberKind::kWorker && w.info.node == id &&
              w.info.state != MemberState::kDead) {
            send(m.handle, fence_atom::value, wid);
          }
        }
        MarkNodeDead(id, why);
      }
    }
  }

  // A worker's direct channel as ActorRef::direct has it: "ADDRESS:PORT", "" if it has none.
  std::string DirectEndpoint(const std::string& worker) const {
    auto w = members_.find(worker);
    if (w == members_.end() || w->second.info.direct_port <= 0) return "";
    return absl::StrCat(w->second.info.address, ":", w->second.info.direct_port);
  }

  caf::result<caf::actor, std::string, std::string> HandleSpawn(const std::string& type,
                                                                const caf::message& args,
                                                                const std::string& name,
                                                                uint64_t gen,
                                                                const Placement& where) {
    std::string id = name.empty() ? absl::StrCat("anon-", ++anonymous_) : name;
    if (directory_.count(id)) {
      // A restart of a named actor whose old incarnation the head has not seen die yet.
      NamedDown(directory_.find(id), caf::make_error(caf::exit_reason::user_shutdown),
                "replaced by a new incarnation");
    }
    (void)sched_.ReleaseActor(id);
    std::string node_pin = where.node;
    if (!where.worker.empty()) {
      auto w = members_.find(where.worker);
      if (w == members_.end() || w->second.info.kind != MemberKind::kWorker ||
          w->second.info.state != MemberState::kAlive) {
        return StatusToError(
            absl::UnavailableError(absl::StrCat("no alive worker '", where.worker, "'")));
      }
      node_pin = w->second.info.node;
    }
    auto actor_request = MakeActorRequest(id, where, node_pin);
    if (!actor_request.ok()) {
      return StatusToError(actor_request.status());
    }
    auto decision = sched_.PlaceActor(*actor_request);
    if (!decision.ok()) {
      return StatusToError(decision.status());
    }
    if (!decision->placed()) {
      return StatusToError(Unschedulable(*decision->unschedulable, id));
    }
    Member* best = nullptr;
    for (auto& [wid, m] : members_) {
      if (m.info.kind != MemberKind::kWorker || m.info.state != MemberState::kAlive ||
          m.info.node != decision->node) {
        continue;
      }
      if (!where.worker.empty() && wid != where.worker) continue;
      if (!best || m.hosted < best->hosted) best = &m;
    }
    if (!best) {
      (void)sched_.ReleaseActor(id);
      return StatusToError(absl::UnavailableError(
          absl::StrCat("no alive worker on node '", decision->node, "' for ", id)));
    }
    best->hosted++;
    std::string worker_id = best->info.id;
    // Before make_response_promise, which takes the sender out of the current message.
    caf::actor requester = caf::actor_cast<caf::actor>(current_sender());
    auto rp = make_response_promise<caf::actor, std::string, std::string>();
    request(best->handle, options_.spawn_timeout, spawn_atom::value, type, args, name, gen)
        .then(
            [this, rp, id, gen, worker_id, requester](const caf::actor& h) mutable {
              directory_[id] = Named{h, gen, worker_id, requester};
              if (store_) StoreFailed(store_->PutActor({id, worker_id, gen}));
              monitor(h);
              rp.deliver(h, worker_id, DirectEndpoint(worker_id));
            },
            [this, rp, id, worker_id](caf::error& e) mutable {
              (void)sched_.ReleaseActor(id);
              if (auto w = members_.find(worker_id); w != members_.end() && w->second.hosted) {
                w->second.hosted--;
              }
              rp.deliver(std::move(e));
            });
    return rp;
  }

  absl::StatusOr<scheduler::ActorRequest> MakeActorRequest(const std::string& id,
                                                           const Placement& where,
                                                           const std::string& node_pin) {
    scheduler::ActorRequest r;
    r.actor = id;
    auto demands = ParseResources(where.resources, "resources");
    if (!demands.ok()) return demands.status();
    r.demands = *demands;
    auto labels = ParseLabels(where.labels, "labels");
    if (!labels.ok()) return labels.status();
    for (const auto& [k, v] : *labels)
      r.selector.push_back({k, scheduler::LabelTerm::Op::kIn, {v}});
    if (!node_pin.empty()) {
      r.selector.push_back({kNodeLabel, scheduler::LabelTerm::Op::kIn, {node_pin}});
    }
    switch (where.strategy) {
      case PlacementStrategy::kPack:
        r.strategy = scheduler::Strategy::kPack;
        break;
      case PlacementStrategy::kSpread:
        r.strategy = scheduler::Strategy::kSpread;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "placement strategy: expected pack or spread, got ", static_cast<int>(where.strategy)));
    }
    switch (where.spot) {
      case SpotPreference::kNone:
        r.spot = scheduler::SpotPreference::kNone;
        break;
      case SpotPreference::kPrefer:
        r.spot = scheduler::SpotPreference::kPreferSpot;
        break;
      case SpotPreference::kAvoid:
        r.spot = scheduler::SpotPreference::kPreferOnDemand;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "placement spot: expected none, prefer or avoid, got ", static_cast<int>(where.spot)));
    }
    r.group = where.group;
    r.bundle = static_cast<int>(where.bundle);
    return r;
  }

  caf::result<std::vector<std::string>> HandlePlacementGroup(
      const std::string& name, const std::vector<std::string>& bundles, GroupStrategy strategy,
      const std::string& domain_key) {
    scheduler::PlacementGroupRequest r;
    r.group = name;
    r.domain_key = domain_key;
    switch (strategy) {
      case GroupStrategy::kPack:
        r.strategy = scheduler::Strategy::kPack;
        break;
      case GroupStrategy::kSpread:
        r.strategy = scheduler::Strategy::kSpread;
        break;
      case GroupStrategy::kStrictPack:
        r.strategy = scheduler::Strategy::kStrictPack;
        break;
      case GroupStrategy::kStrictSpread:
        r.strategy = scheduler::Strategy::kStrictSpread;
        break;
      default:
        return StatusToError(absl::InvalidArgumentError(
            absl::StrCat("placement group '", name,
                         "': strategy expected pack, spread, strict_pack or strict_spread, got ",
                         static_cast<int>(strategy))));
    }
    for (size_t i = 0; i < bundles.size(); ++i) {
      auto b = ParseResources(bundles[i], absl::StrCat("bundle ", i));
      if (!b.ok()) return StatusToError(b.status());
      r.bundles.push_back(*b);
    }
    auto d = sched_.CreatePlacementGroup(r);
    if (!d.ok()) return StatusToError(d.status());
    if (!d->placed()) {
      return StatusToError(Unschedulable(*d->unschedulable, "placement group " + name));
    }
    return d->bundle_nodes;
  }

  static double Now() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

  void PutJob(const std::string& id) {
    if (const Job* j = jobs_.Find(id); store_ && j != nullptr) {
      StoreFailed(store_->PutJob(id, JobTable::Record(*j)));
    }
  }

  void EndJob(const std::string& id, JobState state, const std::string& error,
              const std::string& report) {
    Job* j = jobs_.Find(id);
    if (j == nullptr || JobEnded(j->state)) return;
    jobs_.End(id, state, error, report, Now());
    drivers_.erase(id);
    aout(this) << "troupe-head: job " << id << " " << Name(state) << (error.empty() ? "" : ": ")
               << error << std::endl;
    PutJob(id);
  }

  // Submitted jobs whose driver has no node yet: each to the alive node running the fewest
  // drivers, on-demand nodes first (a spot node's preemption would take the driver with it).
  void PlaceJobs() {
    for (const std::string& id : jobs_.Unplaced()) {
      const Member* best = nullptr;
      auto drivers_on = [this](const std::string& node) {
        size_t n = 0;
        for (const auto& [jid, j] : jobs_.jobs()) n += j.node == node && !JobEnded(j.state);
        return n;
      };
      auto rank = [&](const Member& m) {
        return std::make_pair(IsSpot(m.info), drivers_on(m.info.id));
      };
      for (const auto& [name, m] : members_) {
        if (m.info.kind != MemberKind::kNode || m.info.state != MemberState::kAlive) continue;
        if (best == nullptr || rank(m) < rank(*best)) best = &m;
      }
      if (best == nullptr) return;  // placed when a node joins
      jobs_.Placed(id, best->info.id);
      PutJob(id);
      aout(this) << "troupe-head: job " << id << ": its driver starts on node " << best->info.id
                 << std::endl;
      send(best->handle, job_run_atom::value, id, jobs_.Find(id)->spec_toml);
    }
  }

  // A node labelled spot=true, its labels read as at its registration (ParseNodeSpec).
  static bool IsSpot(const MemberInfo& node) {
    absl::StatusOr<std::map<std::string, std::string>> labels = ParseLabels(node.labels, "labels");
    if (!labels.ok()) return false;
    auto spot = labels->find(scheduler::kSpotLabel);
    return spot != labels->end() && spot->second == "true";
  }

  absl::StatusOr<std::string> View(const std::string& what, const std::string& arg) {
    using json = nlohmann::json;
    if (what == "cluster") return ClusterView().dump();
    if (what == "metrics") return Metrics();
    if (what == "jobs") {
      json list = json::array();
      for (const auto& [id, j] : jobs_.jobs()) list.push_back(JobTable::Summary(j));
      return json{{"jobs", list}}.dump();
    }
    Job* j = jobs_.Find(arg);
    if ((what == "job" || what == "logs") && j == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job '", arg, "' on this head"));
    }
    if (what == "job") return JobTable::Full(*j).dump();
    if (what == "logs") {
      std::string out;
      for (const std::string& l : j->logs) absl::StrAppend(&out, l, "\n");
      return out;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown view '", what, "': expected cluster, jobs, job ID, logs ID or metrics"));
  }

  nlohmann::json ClusterView() {
    using json = nlohmann::json;
    json nodes = json::array();
    for (const auto& [name, m] : members_) {
      if (m.info.kind != MemberKind::kNode) continue;
      json node = {{"name", name},
                   {"state", Name(m.info.state)},
                   {"host", m.info.host},
                   {"address", m.info.address},
                   {"spot", IsSpot(m.info)},
                   {"resources", json::object()},
                   {"used", json::object()},
                   {"labels", json::object()},
                   {"workers", json::array()}};
      if (std::optional<scheduler::NodeView> v = sched_.Node(name)) {
        for (const auto& [r, total] : v->total) {
          node["resources"][r] = total;
          node["used"][r] = total - (v->free.count(r) ? v->free.at(r) : 0.0);
        }
        for (const auto& [k, l] : v->labels) {
          if (k != kNodeLabel) node["labels"][k] = l;
        }
      }
      for (const auto& [id, w] : members_) {
        if (w.info.kind != MemberKind::kWorker || w.info.node != name) continue;
        json actors = json::array();
        for (const auto& [actor, named] : directory_) {
          if (named.worker == id) actors.push_back(actor);
        }
        node["workers"].push_back(
            {{"id", id}, {"state", Name(w.info.state)}, {"pid", w.info.pid}, {"actors", actors}});
      }
      nodes.push_back(std::move(node));
    }
    json groups = json::array();
    for (const std::string& g : sched_.GroupIds()) {
      groups.push_back(
          {{"name", g}, {"bundles", sched_.GroupNodes(g).value_or(std::vector<std::string>{})}});
    }
    return {{"generation", generation_},
            {"epoch", store_ ? store_->epoch() : 0},
            {"nodes", std::move(nodes)},
            {"placement_groups", std::move(groups)}};
  }

  // Prometheus text format: the cluster's own series, then every job's (internal/jobs.h).
  std::string Metrics() {
    std::map<std::pair<std::string, std::string>, int> by_state;
    for (MemberKind k : {MemberKind::kNode, MemberKind::kWorker}) {
      for (MemberState s : {MemberState::kJoining, MemberState::kAlive, MemberState::kDraining,
                            MemberState::kDead}) {
        by_state[{Name(k), Name(s)}] = 0;
      }
    }
    for (const auto& [id, m] : members_) ++by_state[{Name(m.info.kind), Name(m.info.state)}];
    std::string out =
        "# HELP troupe_members Cluster members by kind and state.\n"
        "# TYPE troupe_members gauge\n";
    for (const auto& [ks, n] : by_state) {
      absl::StrAppend(&out, "troupe_members{kind=\"", ks.first, "\",state=\"", ks.second, "\"} ", n,
                      "\n");
    }
    absl::StrAppend(&out,
                    "# HELP troupe_membership_generation The membership generation (bumped on "
                    "every change).\n# TYPE troupe_membership_generation gauge\n"
                    "troupe_membership_generation ",
                    generation_, "\n");
    absl::StrAppend(&out, jobs_.Metrics());
    return out;
  }

  // The state a previous head left in the store: the generation goes on from it, and what it knew
  // is kept for its successor's report (members re-register as they reconnect).
  void Restore() {
    absl::StatusOr<HeadStore::State> s = store_->Load();
    if (!s.ok()) return StoreFailed(s.status());
    generation_ = s->generation;
    restored_ = std::move(s->members);
    for (const auto& [id, record] : s->jobs) StoreFailed(jobs_.Restore(id, record));
    if (!restored_.empty()) leases_from_ = Clock::now() + options_.heartbeat_timeout;
    size_t alive = 0;
    for (const MemberInfo& m : restored_) alive += m.state != MemberState::kDead ? 1 : 0;
    aout(this) << "troupe-head: store epoch " << store_->epoch() << ": generation " << generation_
               << ", " << alive << " of " << restored_.size()
               << " known members were alive; they re-register as they reconnect" << std::endl;
  }
  // A store that refuses this head's writes has been claimed by a later head: this one is stale
  // and stops, rather than serve a cluster it can no longer record.
  void StoreFailed(const absl::Status& s) {
    if (s.ok()) return;
    std::cerr << "troupe head: " << s.message() << "; stopping" << std::endl;
    std::fflush(nullptr);
    _exit(s.code() == absl::StatusCode::kFailedPrecondition ? 3 : 1);
  }

  ClusterOptions options_;
  std::string build_id_;
  std::shared_ptr<HeadStore> store_;
  std::vector<MemberInfo> restored_;
  uint64_t generation_ = 0;
  std::map<std::string, Member> members_;
  std::map<std::string, Named> directory_;
  scheduler::Scheduler sched_;
  uint64_t anonymous_ = 0;
  std::vector<caf::actor> subscribers_;
  Clock::time_point last_tick_;  // when CheckHeartbeats last ran
  LeaseTable leases_;
  JobTable jobs_;
  std::map<std::string, caf::actor> drivers_;  // running jobs' drivers, by job id
  Clock::time_point leases_from_;  // a head that took over grants none before (HandleLease)
};

}  // namespace

caf::actor SpawnHead(caf::actor_system& system, ClusterOptions options, std::string build_id,
                     std::shared_ptr<HeadStore> store) {
  return system.spawn<HeadActor>(std::move(options), std::move(build_id), std::move(store));
}

}  // namespace troupe::runtime::internal
