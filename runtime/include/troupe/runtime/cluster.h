// troupe/runtime/cluster.h — troupe across processes and machines.
//
// Roles (all run from the user's own binary through RunMain, or from the stock `troupe`):
//   head    membership table, named-actor directory, failure detector, remote spawn.
//   node    one per machine: registers resources/labels, starts, watches and reaps worker
//           processes (they die with it), forwards preemption notices (SIGTERM + --grace).
//   worker  hosts actors; started by its node agent, never by hand.
//
// Membership: every node and worker has a state; the head bumps the cluster generation on every
// change and tells subscribers (MembershipEvent).
//
//   node:    joining ──accepted──▶ alive ──SIGTERM──▶ draining ──deadline/release──▶ dead
//                │                   └────────── lost connection / heartbeats ──────▶ dead
//                └──build id differs──▶ refused (never a member)
//   worker:  alive ──process exit / lost connection / heartbeat timeout──▶ dead
//
// Failure detection: a lost CAF connection marks a process down at once; heartbeats (every
// heartbeat_interval, dead after heartbeat_timeout of silence) catch a stopped process; each
// heartbeat carries every hosted actor's progress counter and how long its current handler has
// been running, so an actor stuck in a handler is reported hung (after hung_timeout).
//
//   // A driver (or a test) talking to a running cluster:
//   auto client = ClusterClient::Connect(*runtime, "127.0.0.1", port);
//   auto ref = client->Spawn("echo", caf::make_message(), "echo-1");        // any worker
//   auto ref2 = client->Spawn("echo", {}, "echo-2", "node=node-a");          // a given node
#ifndef TROUPE_RUNTIME_CLUSTER_H_
#define TROUPE_RUNTIME_CLUSTER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "caf/actor.hpp"
#include "caf/meta/type_name.hpp"
#include "troupe/base/events.h"
#include "troupe/runtime/config.h"
#include "troupe/runtime/membership.h"
#include "troupe/runtime/placement.h"
#include "troupe/runtime/runtime.h"

namespace troupe::runtime {

struct ClusterOptions {
  Duration heartbeat_interval = std::chrono::milliseconds(100);
  Duration heartbeat_timeout = std::chrono::seconds(1);
  Duration hung_timeout = std::chrono::seconds(10);
  Duration spawn_timeout = std::chrono::seconds(10);
  // How long a node agent or worker keeps trying to reach a head that does not answer yet.
  Duration join_timeout = std::chrono::seconds(30);
  // A node agent or worker that lost the head rejoins it (restarted, or a standby on its address)
  // within this long, its processes and actors running meanwhile; then it gives up.
  Duration head_grace = std::chrono::seconds(30);
  std::string log_dir = "/tmp/troupe";  // worker logs: <log_dir>/<worker id>.{out,err}
  std::string build_id;                 // "" = this binary's ELF build id

  void Register(ConfigRegistry& registry);
  // build_id, or this binary's when it is "" (BuildId below).
  std::string EffectiveBuildId() const;
  // For `processes` members on one machine of `vcpus` (an embedded cluster): heartbeat_timeout at
  // least 1 s plus one second per 8 processes per vCPU beyond the first 8 (a longer one stays) —
  // a heartbeat thread waits its
  // turn behind every other process (130 processes starting together on 2 vCPUs missed 1 s
  // beats by the dozen). Silence takes that long to find; a process's exit does not (its
  // connection closes).
  void ScaleForSharedHost(int processes, int vcpus);
};

// CAF 0.17 serializes an enum as its underlying integer; these make its message printing
// (to_string of a message, CAF's logs) show the names instead of "<unprintable>".
inline std::string to_string(MemberKind x) { return Name(x); }
inline std::string to_string(MemberState x) { return Name(x); }
inline std::string to_string(MembershipKind x) { return Name(x); }

// The wire forms of membership.h's table row and event.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MemberInfo& x) {
  return f(caf::meta::type_name("troupe.MemberInfo"), x.id, x.kind, x.node, x.state, x.pid,
           x.resources, x.labels, x.address, x.host, x.port, x.direct_port);
}

// The enums travel as their underlying integers (CAF 0.17's data_processor does that for any
// enum without a serialize overload): the same bytes as the int32 fields they replaced.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MembershipEvent& x) {
  return f(caf::meta::type_name("troupe.MembershipEvent"), x.generation, x.kind, x.subject, x.node,
           x.pid, x.detail, x.stderr_tail, x.cause, x.exit_code, x.signal);
}

using membership_atom = caf::atom_constant<caf::atom("tr_member")>;

// The head's named-actor directory, for actors that talk to the head themselves: a request
// (directory_lookup_atom, name) to ClusterClient::head() is answered with (caf::actor,
// uint64_t generation, std::string worker, std::string direct) — direct as in ActorRef — or an
// error when no such actor is alive. Take
// handles of other processes' actors from the head: CAF 0.17 routes a message through the
// process it learned the handle from, and drops it when that route takes more than one hop.
using directory_lookup_atom = caf::atom_constant<caf::atom("tr_lookup")>;
// The membership table, for actors that talk to the head themselves: (members_table_atom) is
// answered with std::vector<MemberInfo>.
using members_table_atom = caf::atom_constant<caf::atom("tr_members")>;
// (membership_subscribe_atom, subscriber) to the head: `subscriber` receives every membership
// event from then on. Sent before a members_table_atom request by the same actor, it guarantees
// that no event falls between the table and the subscription.
using membership_subscribe_atom = caf::atom_constant<caf::atom("tr_sub")>;
// (release_node_atom, node) to the head: a draining node (one with a preemption notice) that the
// asker's job has handed over may leave now rather than at the end of its notice; the head
// releases its agent. Ignored for a node that is not draining.
using release_node_atom = caf::atom_constant<caf::atom("tr_relnode")>;
// Chaos on one node, carried out by its agent on its own host: no pid or firewall rule crosses a
// machine. kPreempt: a preemption notice (SIGTERM to the agent, as a cloud gives it). kPartition:
// the host cut off from every other host, both ways; kOneWay: what the host sends is dropped, what
// is sent to it arrives; kFlap: the host cut off both ways and restored, every `period_ms` in turn;
// kDrop: `drop_percent` % of the host's packets lost each way; kDelay: every packet in or out of
// the host held `delay_us` ± `jitter_us` (uniform) by a `troupe relay` process (NFQUEUE: this
// needs no netem) — each healed after `duration_ms` by a process of their own (the heal happens
// even if the agent dies meanwhile); iptables rules in the host's network namespace, loopback
// untouched, so they need CAP_NET_ADMIN there (root on a host of its own).
enum class NodeFaultKind { kPreempt, kPartition, kDrop, kDelay, kOneWay, kFlap, kSpotNotice };
struct NodeFault {
  NodeFaultKind kind = NodeFaultKind::kPreempt;
  int64_t duration_ms = 0;
  int32_t drop_percent = 0;
  int64_t delay_us = 0, jitter_us = 0;
  int64_t period_ms = 0;  // kFlap: how long each cut, and each gap between cuts, lasts
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeFault& x) {
  return f(caf::meta::type_name("troupe.NodeFault"), x.kind, x.duration_ms, x.drop_percent,
           x.delay_us, x.jitter_us, x.period_ms);
}
inline std::string to_string(NodeFaultKind x) {
  switch (x) {
    case NodeFaultKind::kPreempt:
      return "preempt";
    case NodeFaultKind::kPartition:
      return "partition";
    case NodeFaultKind::kDrop:
      return "drop";
    case NodeFaultKind::kDelay:
      return "delay";
    case NodeFaultKind::kOneWay:
      return "one-way partition";
    case NodeFaultKind::kFlap:
      return "flapping";
    case NodeFaultKind::kSpotNotice:
      return "spot notice";
  }
  return "?";
}
// (node_fault_atom, node name, NodeFault) to the head → bool (NotFound: no live node of that
// name): chaos by name. The head forwards (node_fault_atom, NodeFault) to that node's agent.
using node_fault_atom = caf::atom_constant<caf::atom("tr_nfault")>;

// A lease on a named actor's role, for an actor that must act alone under its name even when its
// host is cut off from the rest (the training coordinator: it commits and writes checkpoints only
// while it holds one). (lease_atom, name), sent by that actor itself to ClusterClient::head(), is
// answered with (uint64 epoch, int64 lease_ms): valid for lease_ms (the head's heartbeat timeout)
// from when the request was sent. Another incarnation is granted the lease only once it ran out
// (or the holder's process exit was confirmed by its node agent), so two never hold it at once.
// Renewing keeps the epoch; a new holder gets a higher one (a fencing token for storage). Errors:
// Unavailable while another incarnation's lease runs (ask again later); FailedPrecondition when the
// sender is not the actor registered under `name`, or its worker is not alive (it never will be
// again: stop acting).
using lease_atom = caf::atom_constant<caf::atom("tr_lease")>;

// Jobs, kept by the head (submit, status, logs, stop) and read by `troupe job`, `troupe status`,
// the head's dashboard and /metrics. From `troupe job` (ClusterClient) and from a job's driver:
//   (job_submit_atom, name, spec TOML, int64 steps)     -> std::string id: pending until a node
//       agent runs its driver (`troupe train --job ID`) on an on-demand node where there is one
//   (job_register_atom, id, name, spec TOML, int64 steps, int64 pid, node, caf::actor driver)
//       -> std::string id: a driver starts; id "" registers a job that was not submitted
//   (job_events_atom, id, std::vector<std::string> lines)  the job's event log, from its start
//   (job_log_atom, id, std::vector<std::string> lines)     the driver's progress lines
//   (job_end_atom, id, state "succeeded"|"failed"|"stopped"|"preempted", error, report JSON)
//       -> bool
//   (job_stop_atom, id) -> bool: the head relays (job_stop_atom, id) to the job's driver, which
//       stops the job at once (every rank stopped, the coordinator's record kept)
//   (ops_view_atom, what, arg) -> std::string: "cluster", "jobs", "job" ID (JSON), "logs" ID,
//       "metrics" (Prometheus text): what the head's HTTP API serves (runtime/ops_http.cc)
using job_submit_atom = caf::atom_constant<caf::atom("tr_jsubmit")>;
using job_register_atom = caf::atom_constant<caf::atom("tr_jreg")>;
using job_events_atom = caf::atom_constant<caf::atom("tr_jevents")>;
using job_log_atom = caf::atom_constant<caf::atom("tr_jlog")>;
using job_end_atom = caf::atom_constant<caf::atom("tr_jend")>;
using job_stop_atom = caf::atom_constant<caf::atom("tr_jstop")>;
using ops_view_atom = caf::atom_constant<caf::atom("tr_view")>;

// A job's ranks, asked for by its driver as a gang: (job_gang_atom, RankGang) -> RankGrant.
// `min` and `max` are the job's (min_workers, max_workers). The head reserves ranks of `each`'s
// demands, each on an alive worker of its own that hosts no rank of any job, spread over the
// nodes (`each.strategy`): up to `max` counting those the job holds, and at least `min` at once —
// or none, and the job is queued (JobState kQueued) with why. A rank reserved on worker W is
// spawned under the name `prefix` + W ('/' as '.'); a reservation not spawned within 30 s lapses,
// and a job's reservations end with it. The queue is ordered by priority, then first come first
// served; a job that can never fit (the alive nodes could not hold its min) waits without holding
// up the others, and one whose driver stopped asking for 10 s is passed over. `grow` (a running
// job asking for more, up to max): granted only while no job that could fit is queued — freed
// capacity goes to the queue first. A queued job takes ranks from running jobs of lower priority,
// never below their min: the head sends (job_shrink_atom, job id, int32 n) to such a job's
// driver, which hands n ranks over at a step boundary (as a spot notice does) and stops them.
// `actors` (optional): the prefix of the names of the job's other actors (its coordinator); the
// head places such an actor on a worker of the job's own ranks (an on-demand one first), so that
// a process killed in one job never takes another job's actor with it.
struct RankGang {
  std::string job;
  std::string prefix;
  std::string actors;
  int32_t min = 1;
  int32_t max = 1;
  Placement each;
  int32_t priority = 0;
  bool grow = false;
};
struct RankGrant {
  std::vector<std::string> workers;  // reserved: one rank each
  std::string waiting;               // none reserved: why
  bool can_fit = true;               // false: fewer workers that could take a rank exist than min
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankGang& x) {
  return f(caf::meta::type_name("troupe.RankGang"), x.job, x.prefix, x.actors, x.min, x.max, x.each,
           x.priority, x.grow);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankGrant& x) {
  return f(caf::meta::type_name("troupe.RankGrant"), x.workers, x.waiting, x.can_fit);
}
using job_gang_atom = caf::atom_constant<caf::atom("tr_jgang")>;
using job_shrink_atom = caf::atom_constant<caf::atom("tr_jshrink")>;

// The version of the messages between head, node agents and workers. Every member's join starts
// with (cluster_hello_atom, uint32 protocol version, build id, kind "node"|"worker", name), a
// message whose shape never changes: the head answers with its own version (uint32), or refuses a
// member of another version (FailedPrecondition, both versions named) or another build. Bump it
// whenever a message of internal/cluster_protocol.h or a type registered by RegisterClusterTypes
// changes.
inline constexpr uint32_t kClusterProtocolVersion = 11;
using cluster_hello_atom = caf::atom_constant<caf::atom("tr_hello")>;

// Registers the types above (and the heartbeat's) with a CAF config; every process of a
// cluster must do this (Runtime does when RuntimeOptions::network is set).
void RegisterClusterTypes(caf::actor_system_config& cfg);

// Writes a new cluster CA (ca.pem, ca.key) and one certificate + key per member
// (<member>.pem, <member>.key) into `dir`: what --tls_ca/--tls_cert/--tls_key take. A member is
// "NAME" or "NAME=ADDR[+ADDR...]": its certificate names NAME and the addresses (IPs or host
// names) others dial it at — loopback when none are given. A process dialing a peer over TLS
// refuses a certificate that does not name the address it dialed. InvalidArgument naming
// --members for a malformed member. With `ca_dir`, the CA there (ca.pem, ca.key: e.g. a
// Kubernetes Secret) issues the certificates instead, and only its ca.pem is copied into `dir`
// (a pod's init container issues the pod's own certificate, naming the pod's IP).
[[nodiscard]] absl::Status GenerateClusterCertificates(const std::string& dir,
                                                       const std::vector<std::string>& members,
                                                       const std::string& ca_dir = "");

// A head address "HOST:PORT" (what --head takes) as (host, port); InvalidArgument naming --head,
// the expected form and the text otherwise.
[[nodiscard]] absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(
    const std::string& text);

// This binary's ELF build id as hex (falls back to a hash of the executable).
std::string BuildId();

class ClusterClient {
 public:
  // `timeout`: of each request to the head; `retry_for`: how long to keep trying while nothing
  // listens at host:port yet.
  [[nodiscard]] static absl::StatusOr<ClusterClient> Connect(
      Runtime& runtime, const std::string& host, uint16_t port,
      Duration timeout = std::chrono::seconds(10), Duration retry_for = {});
  // Spawns a registered type on a worker chosen by `where`: "" (least loaded worker),
  // "node=<name>" or "worker=<id>". The actor is registered cluster-wide under `name`.
  [[nodiscard]] absl::StatusOr<ActorRef> Spawn(const std::string& type, const caf::message& args,
                                               const std::string& name,
                                               const std::string& where = "");
  // The same with resource demands and constraints. Unschedulable requests fail with
  // ResourceExhausted (waiting for resources may help) or FailedPrecondition (no node could
  // ever fit), and a message saying why.
  [[nodiscard]] absl::StatusOr<ActorRef> Spawn(const std::string& type, const caf::message& args,
                                               const std::string& name, const Placement& placement);
  // Gang-schedules a placement group: `bundles` are resource lists ("cpu=1,gpu=1"), placed by
  // `strategy` (see placement.h). Returns each bundle's node.
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> CreatePlacementGroup(
      const std::string& name, const std::vector<std::string>& bundles, GroupStrategy strategy,
      const std::string& domain_key = "");
  [[nodiscard]] absl::StatusOr<ActorRef> Lookup(const std::string& name);
  // The worker id hosting actor `name`.
  [[nodiscard]] absl::StatusOr<std::string> WhereIs(const std::string& name);
  [[nodiscard]] absl::StatusOr<std::vector<MemberInfo>> Members();
  [[nodiscard]] absl::StatusOr<uint64_t> Generation();
  // Jobs (see job_submit_atom): a submitted job's id; a stop asked; a view of the head's state
  // (ops_view_atom: JSON, or text for "logs" and "metrics").
  [[nodiscard]] absl::StatusOr<std::string> SubmitJob(const std::string& name,
                                                      const std::string& spec_toml, int64_t steps);
  [[nodiscard]] absl::Status StopJob(const std::string& id);
  // A job's driver asks for its ranks (see job_gang_atom); `timeout` (when set) instead of the
  // client's, for an ask that must not hold up its caller.
  [[nodiscard]] absl::StatusOr<RankGrant> ReserveRanks(const RankGang& gang,
                                                       Duration timeout = Duration::zero());
  [[nodiscard]] absl::StatusOr<std::string> View(const std::string& what,
                                                 const std::string& arg = "");
  // `subscriber` receives (membership_atom, MembershipEvent) for every change from now on.
  void Subscribe(const caf::actor& subscriber);
  // From now on this process connects to a worker (in the background) when its actors start to
  // talk to actors there — a supervisor's remote children, Actor::ConnectTo — so that those
  // messages do not pass through the head: they go on while the head is lost and replaced
  // (Reconnect). A handle taken before the connection is up uses it too. Workers do so always.
  void ConnectDirectly();
  // The same for code that is no actor: connects this process to worker `worker` (WhereIs names
  // an actor's) in the background; after ConnectDirectly.
  void ConnectTo(const std::string& worker);
  // After the head was lost: connects again to the same address (the head restarted, or a
  // standby took over there), trying until `grace` has passed; then head() is the new one (a
  // subscriber must subscribe again). Unavailable naming the address and `grace` after it.
  [[nodiscard]] absl::Status Reconnect(Duration grace);
  const caf::actor& head() const { return head_; }
  // The head's address, as given to Connect ("HOST:PORT").
  std::string address() const;

 private:
  ClusterClient(Runtime* runtime, caf::actor head, std::string host, uint16_t port,
                Duration timeout)
      : runtime_(runtime),
        head_(std::move(head)),
        host_(std::move(host)),
        port_(port),
        timeout_(timeout) {}
  Runtime* runtime_;
  caf::actor head_;
  std::string host_;
  uint16_t port_;
  Duration timeout_;
};

// Runs the role named by argv[1] ("head", "node", "worker", "up", "certs", "status", "relay") with
// the program's actor types, and returns the process exit code. Returns -1 if argv[1] is not a
// role, so a program can handle its own commands. `--help` after a role prints its options.
int RunMain(int argc, char** argv, ActorRegistry registry);

}  // namespace troupe::runtime

namespace troupe::runtime {

// A head and node agents as child processes of this one (each dies with it): the embedded
// default cluster behind `troupe up` and the tests. `binary` must be a program that calls
// RunMain (the stock `troupe`, or the user's own).
class LocalCluster {
 public:
  struct Options {
    std::string binary;  // "" = this program
    int workers = 2;     // workers of the first node ("local"); 0 = no node
    ClusterOptions cluster;
    std::vector<std::string> extra_args;  // passed to every role
    std::vector<std::string> head_args;   // passed to the head only (e.g. its TLS files)
    // The head keeps its state in a store (<cluster dir>/head.db), so that RestartHead's head
    // goes on from it.
    bool head_store = false;
    // Starts the head again (from its store) whenever it dies, as a supervisor (systemd, a
    // Kubernetes Deployment) would; RestartHead is then not for the caller.
    bool keep_head = false;
  };
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(Options options);
  ~LocalCluster();

  // Starts another node agent process with `workers` worker processes. `env` is added to the
  // agent's environment (e.g. CUDA_VISIBLE_DEVICES: the GPUs its workers share out).
  [[nodiscard]] absl::StatusOr<pid_t> AddNode(const std::string& name, int workers,
                                              const std::string& resources = "cpu=1",
                                              const std::string& labels = "",
                                              const std::vector<std::string>& extra_args = {},
                                              const std::map<std::string, std::string>& env = {});
  // Starts the head again on the same port (the old one must be gone: killed, and reaped here),
  // as a supervisor (systemd, a Kubernetes Deployment) would; with head_store it goes on from the
  // old one's state, under a new epoch.
  [[nodiscard]] absl::Status RestartHead();
  uint16_t port() const { return port_; }
  // The head's dashboard, JSON API and /metrics (troupe head --http_port), on 127.0.0.1; a
  // restarted head keeps it.
  int http_port() const { return http_port_; }
  pid_t head_pid() const { return head_pid_; }
  // Node agent pids by node name.
  const std::map<std::string, pid_t>& nodes() const { return nodes_; }
  // Sends `sig` to node `name`'s agent and, for SIGKILL/SIGTERM, reaps it.
  void SignalNode(const std::string& name, int sig);
  // Where the head's, node agents' and workers' stdout/stderr go: cluster.log_dir (a private
  // temporary directory when that is empty, removed with the cluster as the rest of it is).
  std::string LogDir() const;

 private:
  LocalCluster() = default;
  std::vector<std::string> RoleArgs() const;
  // Starts the head on `port` (0: ephemeral) and waits for it to report the port it listens on.
  absl::Status StartHead(uint16_t port);
  // keep_head: reaps the head and starts another, until the destructor says stop.
  void KeepHead();
  Options options_;
  std::string dir_;
  uint16_t port_ = 0;
  int http_port_ = 0;  // 0: an ephemeral one, until the first head has chosen it
  std::atomic<pid_t> head_pid_{0};
  int head_starts_ = 0;
  std::map<std::string, pid_t> nodes_;
  std::mutex head_mu_;  // keep_head: the keeper's restart against the destructor's stop
  bool stopping_ = false;
  std::thread keeper_;
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_CLUSTER_H_
