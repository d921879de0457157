// membership_core.h — the head's membership decisions, as a pure state machine.
//
// No actors, no I/O, no clock: the head's actor (head.cc) feeds MembershipCore what it hears from
// node agents and workers (a hello, a registration, a heartbeat, a process's exit status, a lost
// connection, a preemption notice, a leave) and the time of its failure detector's ticks, and
// carries out the actions returned, in order; a test does the same by hand. Who is a member, in
// which state, with which generation; who is declared dead, when, why and how; who is fenced;
// which events are published: all of it is decided here and nowhere else.
//
// Per member, its MemberPhase in brackets, the transitions numbered:
//
//   node:   [absent] or [dead] ──(1) join──▶ [alive] ──(2) drain──▶ [draining]
//           [draining] ──(3) release──▶ [draining], its agent told it may leave now
//           [alive] or [draining] ──(4) leave, connection lost, or silent past heartbeat_timeout
//               (then its workers are fenced first)──▶ [dead]: its workers die first (11), its
//               submitted jobs fail, it leaves the scheduler; node_dead (generation + 1)
//           [dead] ──(5) heartbeat──▶ [dead_rejoining]: asked, once, to join again
//           [dead_rejoining] ──(1) join──▶ [alive]: a new incarnation under the same name
//
//   worker: [absent] ──(6) register: its node alive, the id never declared dead (by this head or
//               the one before it)──▶ [alive]
//           [alive] ──(7) exit status──▶ [dead_exited]: worker_down with it (generation + 1)
//           [alive] ──(8) connection lost──▶ [down_pending]: worker_down held for the status
//           [down_pending] ──(9) exit status──▶ [dead_exited]: worker_down with it
//           [down_pending] ──(10) flush, exit_report_wait later──▶ [dead]: worker_down, lost
//           [alive] ──(11) silent past heartbeat_timeout (fenced), or its node died (lost)──▶
//               [dead]: worker_down at once (generation + 1)
//           [dead] ──(12) exit status──▶ [dead_exited]: worker_exit (same generation), once
//   Any other event leaves a member where it is.
//   A worker declared dead stays dead: its id is refused from then on (fencing); its node's agent
//   is told to kill it when it was fenced. A worker's death releases its named actors; the last
//   alive worker of an alive node takes the node out of placement (sched_drain).
//
// A head restored from its store (Restore) expects the previous head's alive members back
// within 2 × heartbeat_timeout of its first tick; one that is not is declared dead as silent.
//
// Failure detector: OnTick every heartbeat_interval / 4. A member silent for more than
// heartbeat_timeout is declared dead (11, 4). Silence that overlaps the head's own stall is not
// the members': a tick later than 2 × heartbeat_interval after the previous one shifts every
// member's last heartbeat by the stall (the gap less one tick period) before looking. Nor is
// silence while the head hears no member at all, with two nodes or more alive (its receiving side
// stalled while its ticks ran, or every member starved together): no verdict is given while
// that lasts, up to 2 × heartbeat_timeout, and the first heartbeat after it shifts every
// member's last heartbeat by the deafness (less one heartbeat_interval). A whole cluster
// silent for real is declared dead after 2 × heartbeat_timeout.
//
// Every bumped publish raises the generation by exactly one; nothing lowers it (Restore starts
// from the store's). Other publishes (refused, actor_hung, worker_exit) carry the current one.
//
// Not thread-safe: owned by one actor.
#ifndef TROUPE_RUNTIME_MEMBERSHIP_CORE_H_
#define TROUPE_RUNTIME_MEMBERSHIP_CORE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "troupe/runtime/membership.h"
#include "troupe/runtime/supervision.h"

namespace troupe::runtime {

struct MembershipAction {
  enum class Kind {
    kPublish,         // `event` to the log and every subscriber; when `bump`, write the
                      // generation and `record` (the subject's row, if a member) to the store first
    kRefuse,          // answer the hello or registration with `status`; it is not a member
    kPlaceJobs,       // a node joined: start pending jobs' drivers (runtime/head_jobs.cc)
    kAskRejoin,       // tell node `member` (declared dead, heard from again) to join again
    kFence,           // tell node `node`'s agent to kill worker `member` (stale state, or stopped)
    kReleaseNode,     // tell draining node `member`'s agent it may leave now
    kReleaseLeases,   // worker `member`'s process is gone: its leases end now
    kReleaseActors,   // every named actor on worker `member` is gone (`detail`): tell who spawned
                      // it, take it out of the directory, the scheduler and the store
    kSchedulerDrain,  // no new placements on node `node`
    kSchedulerRemove,  // node `node` leaves the scheduler
    kFailJobs,         // every submitted job whose driver runs on node `node` fails with `detail`
    kFlushAfter,       // call OnFlush(`member`) after `delay`
    kSyncHeartbeats,   // ask member `member` for a full heartbeat (its deltas no longer chain)
  };
  Kind kind = Kind::kPublish;
  std::string member;
  std::string node;
  std::string detail;
  MembershipEvent event;
  bool bump = false;
  std::optional<MemberInfo> record;
  absl::Status status;
  Duration delay{0};
};

// The short form tests compare: "publish(+g3,worker_down,n1/w0,fenced)" (+: bumped),
// "publish(g3,actor_hung,a)", "fence(n1,n1/w0)", "sched_drain(n1)",
// "refuse(FAILED_PRECONDITION)"...
std::string DebugString(const MembershipAction& a);
std::string DebugString(const std::vector<MembershipAction>& actions);  // space-separated

// Where a member stands, for tests and the property test's coverage (the diagram above).
enum class MemberPhase {
  kAbsent,         // never registered with this head
  kAlive,          // node or worker
  kDraining,       // node: got its preemption notice
  kDownPending,    // worker: dead, its worker_down waiting for the exit status (8)
  kDead,           // dead and published; a node not heard from since, a worker's status not known
  kDeadExited,     // worker: dead, its exit status known (nothing more to publish)
  kDeadRejoining,  // node: dead, heard from again and asked to rejoin (5)
};
const char* Name(MemberPhase p);

// One hosted actor's liveness, as a heartbeat reports it (ActorStat on the wire).
struct ActorBusy {
  std::string name;
  uint64_t progress = 0;    // application messages consumed
  uint64_t busy_ms = 0;     // how long its current handler has run (0 = idle, or gone)
  uint64_t generation = 0;  // its incarnation: a restarted actor is another one
};

// A heartbeat: the actors whose handler state changed since the member's beat at `base`
// (internal/heartbeat.h); base 0 is a full one, every actor busy past the sender's floor.
struct Heartbeat {
  uint64_t base = 0;
  uint64_t version = 0;
  std::vector<ActorBusy> changes;
};

class MembershipCore {
 public:
  struct Options {
    Duration heartbeat_interval = std::chrono::milliseconds(100);
    Duration heartbeat_timeout = std::chrono::seconds(1);
    Duration hung_timeout = std::chrono::seconds(10);
    // How long a worker_down waits for the exit status after a lost connection (8 → 10).
    Duration exit_report_wait = std::chrono::milliseconds(250);
    uint32_t protocol_version = 0;  // a hello of another version is refused
    std::string build_id;           // ... and one of another build
  };
  explicit MembershipCore(Options options);

  // What a previous head left in the store: the generation goes on from `generation`; a worker
  // `members` has dead stays refused; a member it has alive that has not registered again within
  // 2 × heartbeat_timeout of the first tick is then a member silent since that tick (11, 4).
  void Restore(uint64_t generation, std::vector<MemberInfo> members);

  // The first message of every join (`kind` "node" | "worker" as sent): [] to go on, or
  // publish(refused) then refuse(FailedPrecondition) for another protocol version or build.
  std::vector<MembershipAction> OnHello(uint32_t version, const std::string& build_id,
                                        const std::string& kind, const std::string& name);
  // A node's registration, in two steps around the scheduler's admission of its resources:
  // CheckNodeJoin refuses a name that is a member and not dead (AlreadyExists); OnNodeJoined
  // (1) makes it alive: publish(node_alive), place_jobs.
  absl::Status CheckNodeJoin(const std::string& name) const;
  std::vector<MembershipAction> OnNodeJoined(const MemberInfo& node, TimePoint now);
  // (6) A worker's registration (`worker.node`, pid, ports as sent; address and host are its
  // node's): publish(worker_alive), or refuse(FailedPrecondition) for a worker declared dead or
  // a node not alive.
  std::vector<MembershipAction> OnRegisterWorker(const MemberInfo& worker, TimePoint now);
  // A heartbeat of a node or worker (5 for a dead node): it lives. Its changes apply to the
  // head's copy of the member's busy actors when they chain from it (else sync_heartbeats, at
  // most once per heartbeat_timeout until a full one comes); an actor whose handler has run for
  // hung_timeout is published actor_hung once, until it is seen idle again. O(changes + the
  // member's busy actors), whatever the member hosts.
  std::vector<MembershipAction> OnHeartbeat(const std::string& id, const Heartbeat& beat,
                                            TimePoint now);
  // (7, 9, 12) The node agent's waitpid status of worker `id` (`fenced`: the agent killed it on
  // the head's fence), with its stderr's last lines.
  std::vector<MembershipAction> OnWorkerExit(const std::string& id, const std::string& tail,
                                             int32_t wait_status, bool fenced);
  // (10) The wait for a worker's exit status (kFlushAfter) is over.
  std::vector<MembershipAction> OnFlush(const std::string& id);
  // (8, 4) The connection to member `id` is gone (`reason`: how CAF put it).
  std::vector<MembershipAction> OnConnectionLost(const std::string& id, const std::string& reason);
  // (2) Node `node` got a preemption notice: it leaves within `grace_ms`.
  std::vector<MembershipAction> OnDrain(const std::string& node, int64_t grace_ms,
                                        const std::string& notice);
  // (3) A job handed draining node `node` over: it may leave now.
  std::vector<MembershipAction> OnRelease(const std::string& node);
  // (4) Node `node` says it leaves.
  std::vector<MembershipAction> OnLeave(const std::string& node);
  // The failure detector's tick (4, 11), with the stall compensation described above.
  std::vector<MembershipAction> OnTick(TimePoint now);

  uint64_t generation() const { return generation_; }
  // The member's row, or nullptr.
  const MemberInfo* Find(const std::string& id) const;
  MemberPhase Phase(const std::string& id) const;
  // Every member's row, in id order (a node sorts before its workers "<node>/w<i>").
  std::vector<MemberInfo> Members() const;
  template <class F>
  void ForEachMember(F&& f) const {
    for (const auto& [id, m] : members_) f(m.info);
  }
  std::string DebugString() const;

 private:
  struct Member {
    MemberInfo info;
    TimePoint last_seen{};
    struct Busy {
      TimePoint since{};  // when its handler began, as the head reckons it
      uint64_t progress = 0;
      bool published = false;  // actor_hung sent for this handler
    };
    std::map<std::pair<std::string, uint64_t>, Busy> busy;  // (actor, incarnation) busy past
                                                            // the sender's floor
    uint64_t beat_version = 0;                              // the copy's heartbeat version
    bool beats_synced = false;  // a full heartbeat has come since registration
    std::optional<TimePoint> sync_asked;
    bool down_reported = false;
    bool rejoin_asked = false;  // node: declared dead, heard from again, told to join again
    bool exit_known = false;    // the node agent's waitpid status has arrived
    std::string exit_detail, stderr_tail;
    base::ExitCause cause = base::ExitCause::kNone;  // how it died, as far as the head knows
    int exit_code = -1, signal = 0;
  };
  using Actions = std::vector<MembershipAction>;

  void Publish(Actions* out, MembershipKind kind, const std::string& subject,
               const std::string& node, int64_t pid, const std::string& detail,
               const std::string& tail = "", bool bump = true,
               base::ExitCause cause = base::ExitCause::kNone, int exit_code = -1, int signal = 0);
  void MarkWorkerDead(Actions* out, const std::string& id, const std::string& why,
                      base::ExitCause cause);
  void ReportWorkerDown(Actions* out, const std::string& id);
  void MarkNodeDead(Actions* out, const std::string& node, const std::string& why);
  void ExpectRestored(TimePoint now);  // see Restore
  void DeclareSilent(Actions* out, const std::string& id, TimePoint now);
  bool HasAliveWorker(const std::string& node) const;

  Options options_;
  uint64_t generation_ = 0;
  std::map<std::string, Member> members_;
  std::vector<MemberInfo> restored_;  // the previous head's table (Restore)
  // Its alive members are expected back within 2 × heartbeat_timeout of the first tick.
  bool expecting_restored_ = false;
  std::optional<TimePoint> restored_since_;
  std::optional<TimePoint> last_tick_;
  std::optional<TimePoint> last_heard_;  // the latest heartbeat or join of any member
  // How long the head has heard no member, where that is deafness: over 2 × heartbeat_interval
  // with two nodes or more alive (one node's silence is its own); zero otherwise.
  Duration Deafness(TimePoint now) const;
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_MEMBERSHIP_CORE_H_
