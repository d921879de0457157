// internal/mesh.h — direct connections between the cluster's processes.
//
// CAF 0.17 carries a message to another process's actor through the process the sender learned
// its handle from — the head, for every handle the directory or a spawn gives out — unless the
// two processes share a connection; and a handle learned that way stays dead once that process is
// gone, even when it is received again. So every worker listens for the cluster's other processes
// (its registration carries the port, MemberInfo::port) and a process connects to every worker:
// a worker to those that joined before it (a later one connects to it), a client that asks for it
// (ClusterClient::ConnectDirectly: the training driver) to each one as it joins. Their messages
// then take their own connection, and losing the head cuts only the connections to the head.
#ifndef TROUPE_RUNTIME_INTERNAL_MESH_H_
#define TROUPE_RUNTIME_INTERNAL_MESH_H_

#include <string>

#include "caf/actor.hpp"
#include "troupe/runtime/runtime.h"

namespace troupe::runtime::internal {

// Connects this process to every alive worker in `head`'s membership table but `self_id`, in the
// background; `follow`: also to each worker that joins later. Once per runtime: a later call
// gives the mesh a head that took over (whose events it then follows).
void StartMesh(Runtime& runtime, const caf::actor& head, const std::string& self_id, bool follow);

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_MESH_H_
