// troupe/runtime/membership.h — the cluster's membership table and its events, as plain data.
//
// What the head keeps about every node and worker (MemberInfo), and what it tells subscribers on
// every change (MembershipEvent): the lifecycle is drawn at the top of cluster.h, the decisions
// that move a member through it are the head's MembershipCore (runtime/membership_core.h). No CAF
// here: cluster.h adds the wire forms (inspect) and the atoms.
//
//   for (const MemberInfo& m : table)
//     if (m.kind == MemberKind::kWorker && m.state == MemberState::kAlive) ...
#ifndef TROUPE_RUNTIME_MEMBERSHIP_H_
#define TROUPE_RUNTIME_MEMBERSHIP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "troupe/base/events.h"

namespace troupe::runtime {

// What a member of the cluster is. Printed "node" | "worker" (Name, ParseMemberKind).
enum class MemberKind {
  kNode,    // a node agent: one per machine, named by --name
  kWorker,  // a worker process "<node>/w<i>", started by its node agent
};

// Where a member is in the lifecycle drawn at the top of cluster.h. Printed "joining" | "alive"
// | "draining" | "dead" (Name, ParseMemberState).
enum class MemberState {
  kJoining,   // registering with the head (never in the table today: accepted means alive)
  kAlive,     // accepted and heartbeating; a worker may host actors
  kDraining,  // a node that got its preemption notice: no new placements, leaves at its deadline
  kDead,      // gone for good (exited, killed, lost, fenced); a name comes back as a new member
};

// What changed, in a MembershipEvent. Printed as the event= field of DebugString: "node_alive" |
// "node_draining" | "node_dead" | "worker_alive" | "worker_down" | "worker_exit" | "actor_hung" |
// "refused" (Name, ParseMembershipKind).
enum class MembershipKind {
  kNodeAlive,     // a node agent joined (or rejoined under its name)
  kNodeDraining,  // a node got its preemption notice (SIGTERM + grace)
  kNodeDead,      // a node left, lost its connection or missed its heartbeats
  kWorkerAlive,   // a worker process registered
  kWorkerDown,    // a worker died: the head marks it dead, with the exit status when known
  kWorkerExit,    // the exit status of a worker already reported down (arrived late)
  kActorHung,     // an actor's handler has run longer than hung_timeout (its process answers)
  kRefused,       // a node or worker with another build id was turned away (not a member)
};

// The text forms above; "?" for a value outside the enum (never sent by a peer of this build).
const char* Name(MemberKind kind);
const char* Name(MemberState state);
const char* Name(MembershipKind kind);
// The inverses of Name, for text edges (tools, tests, logs read back): InvalidArgument naming the
// field, the expected values and the text otherwise.
absl::StatusOr<MemberKind> ParseMemberKind(const std::string& text);
absl::StatusOr<MemberState> ParseMemberState(const std::string& text);
absl::StatusOr<MembershipKind> ParseMembershipKind(const std::string& text);

// One row of the membership table.
struct MemberInfo {
  std::string id;  // node name, or worker id "<node>/w<i>"
  MemberKind kind = MemberKind::kNode;
  std::string node;  // for a worker: its node
  MemberState state = MemberState::kJoining;
  int64_t pid = 0;
  std::string resources;  // "cpu=2,gpu=0,memory=8G"
  std::string labels;     // "spot=true,zone=a"
  // The node's advertised IPv4 address (what its workers listen on and the other hosts reach
  // them by) and its host name (a failure domain: two nodes with one host name share a machine).
  // A worker carries its node's.
  std::string address;
  std::string host;
  // A worker: the port it listens on at `address` for the cluster's other processes (direct
  // connections, see ClusterClient::ConnectDirectly); 0 for a node.
  int32_t port = 0;
  // A worker: the port of its direct channel at `address` (Runtime::Call); 0 for a node.
  int32_t direct_port = 0;
};

// What subscribers receive, as (membership_atom, MembershipEvent).
struct MembershipEvent {
  uint64_t generation = 0;
  MembershipKind kind = MembershipKind::kNodeAlive;
  std::string subject;  // node name, worker id or actor name
  std::string node;
  int64_t pid = 0;
  std::string detail;       // why: exit status or signal, heartbeat silence, refusal reason
  std::string stderr_tail;  // worker_down: the last lines of the dead worker's stderr
  // worker_down, worker_exit and node_dead: how the process ended (see events.h); kNone for the
  // other kinds. kSignaled/kExited come from the node agent's waitpid, kFenced from the head's
  // failure detector (missed heartbeats), kLost when only the connection was seen to go.
  base::ExitCause cause = base::ExitCause::kNone;
  int32_t exit_code = -1;
  int32_t signal = 0;
  // The process_exit event for this membership event (a worker_down or node_dead), for the
  // structured event log of whoever subscribed; `observer` names the log's writer.
  base::SupervisionEvent ToProcessExit(const std::string& observer) const;
  std::string DebugString() const;
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_MEMBERSHIP_H_
