// internal/cluster_protocol.h — the control messages between head, node agents and workers.
// Small typed CAF messages; every type here is registered by RegisterClusterTypes.
//
// to the head (a member's join: hello, then its registration; see JoinCluster in roles.h):
//   (cluster_hello_atom, uint32 version, build_id, kind, name)     -> uint32 version | error
//   (reg_node_atom, name, resources, labels, address, host, agent) -> uint64 generation | error
//   (reg_worker_atom, id, node, pid, worker, int32 port, int32 direct_port)
//                                                                  -> uint64 generation | error
//   (heartbeat_atom, id, uint64 base, uint64 version, std::vector<ActorStat> changes)
//                                                                  from nodes and workers: what
//                                                                  changed (internal/heartbeat.h)
//   (wexit_atom, worker id, pid, status text, stderr tail, int32 wait status, bool fenced)
//                                                                  from the worker's node agent
//   (reg_actor_atom, worker id, name, uint64 gen, actor)           a worker that rejoined a new
//                                                                  head: a named actor it hosts
//   (drain_atom, node, int64 grace_ms, notice)                     node got a preemption notice
//                                                                  (SIGTERM, aws …, gce …)
//   (leave_atom, node)                                             node leaves now
//   (spawn_atom, type, args, name, uint64 gen, Placement)          -> (actor, worker id, direct)
//                                                                  | error
//   (pg_atom, name, std::vector<std::string> bundles, GroupStrategy, domain_key)
//                                                                  -> std::vector<std::string>
//                                                                  nodes
//   (lookup_atom, name)                                -> (actor, uint64 gen, worker, direct)
//   (direct: the hosting worker's direct channel "HOST:PORT", ActorRef::direct; "" if none)
//   (members_atom)                                                 -> std::vector<MemberInfo>
//   (generation_atom)                                              -> uint64
//   (subscribe_atom, actor)
// to a node agent:   (fence_atom, worker id)   kill a worker the head declared dead
//                    (release_atom)            a draining node may leave now
//                    (new_head_atom, head)     (from itself) the head that took over
//                    (rejoin_atom)             this node was declared dead and is heard from
//                                              again (a healed partition): kill its workers,
//                                              join again, start workers under new ids
// to a worker:       (spawn_atom, type, args, name, uint64 gen)   -> actor | error
#ifndef TROUPE_RUNTIME_INTERNAL_CLUSTER_PROTOCOL_H_
#define TROUPE_RUNTIME_INTERNAL_CLUSTER_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "caf/atom.hpp"
#include "caf/meta/type_name.hpp"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime::internal {

using reg_node_atom = caf::atom_constant<caf::atom("tr_regnode")>;
using reg_worker_atom = caf::atom_constant<caf::atom("tr_regwork")>;
using heartbeat_atom = caf::atom_constant<caf::atom("tr_hb")>;
using wexit_atom = caf::atom_constant<caf::atom("tr_wexit")>;
using drain_atom = caf::atom_constant<caf::atom("tr_drain")>;
using leave_atom = caf::atom_constant<caf::atom("tr_leave")>;
using spawn_atom = caf::atom_constant<caf::atom("tr_spawn")>;
using lookup_atom = directory_lookup_atom;
using members_atom = members_table_atom;
using generation_atom = caf::atom_constant<caf::atom("tr_gen")>;
using subscribe_atom = membership_subscribe_atom;
using fence_atom = caf::atom_constant<caf::atom("tr_fence")>;
using release_atom = caf::atom_constant<caf::atom("tr_release")>;
using rejoin_atom = caf::atom_constant<caf::atom("tr_rejoin")>;
// head -> node agent or worker: (heartbeat_sync_atom) send a full heartbeat next.
using heartbeat_sync_atom = caf::atom_constant<caf::atom("tr_hbsync")>;
using new_head_atom = caf::atom_constant<caf::atom("tr_newhead")>;
using reg_actor_atom = caf::atom_constant<caf::atom("tr_regact")>;
using tick_atom = caf::atom_constant<caf::atom("tr_tick")>;
using store_flush_atom = caf::atom_constant<caf::atom("tr_stflush")>;
using pg_atom = caf::atom_constant<caf::atom("tr_pg")>;
using flush_atom = caf::atom_constant<caf::atom("tr_flush")>;
// head -> node agent: (job_run_atom, job id, spec TOML) start the job's driver process;
// node agent -> head: (job_exit_atom, job id, int64 pid, int32 wait status, stderr tail) it ended.
using job_run_atom = caf::atom_constant<caf::atom("tr_jrun")>;
using job_exit_atom = caf::atom_constant<caf::atom("tr_jexit")>;
// head -> whoever asked for a spawn: (rdown_atom, name, uint64 gen, caf::error reason, detail)
// when that actor exits or its worker dies (a proxy on a third process may never learn it).
using rdown_atom = caf::atom_constant<caf::atom("tr_rdown")>;

// One hosted actor's liveness, as a heartbeat reports it.
struct ActorStat {
  std::string name;
  uint64_t generation = 0;
  uint64_t progress = 0;  // application messages consumed
  uint64_t busy_ms = 0;   // how long its current handler has run (0 = idle, or gone)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ActorStat& x) {
  return f(caf::meta::type_name("troupe.ActorStat"), x.name, x.generation, x.progress, x.busy_ms);
}

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_CLUSTER_PROTOCOL_H_
