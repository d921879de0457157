// internal/mesh.h — direct connections between the cluster's processes, made on use.
//
// CAF 0.17 carries a message to another process's actor through the process the sender learned
// its handle from — the head, for every handle the directory or a spawn gives out — unless the
// two processes share a connection; and a handle learned that way stays dead once that process is
// gone, even when it is received again. So every worker listens for the cluster's other processes
// (its registration carries the port, MemberInfo::port), and a process connects to a worker when
// it starts to talk to actors there (Actor::ConnectTo: a coordinator to its ranks' workers, a
// supervisor to its remote children's; a connection serves both directions), not to every worker:
// a worker holds O(1) control connections, not O(N) (issue 45). Their messages then take their
// own connection, and losing the head cuts only the connections to the head. A connection that
// drops (its worker gone, a cut link) is forgotten; the next ConnectTo makes it again.
#ifndef TROUPE_RUNTIME_INTERNAL_MESH_H_
#define TROUPE_RUNTIME_INTERNAL_MESH_H_

#include <string>

#include "caf/actor.hpp"
#include "troupe/runtime/runtime.h"

namespace troupe::runtime::internal {

// This process's mesh (its id `self_id`: never dialled), with `head` to look workers up in. Once
// per runtime: a later call gives the mesh a head that took over.
void StartMesh(Runtime& runtime, const caf::actor& head, const std::string& self_id);
// Connects this process to worker `worker`'s in the background, unless it is connected or it is
// this process (no-op before StartMesh).
void ReachWorker(Context& ctx, const std::string& worker);

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_MESH_H_
