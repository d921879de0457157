// internal/head.h — the head's actor: membership table, failure detector, named-actor
// directory and remote spawn. Owned by one CAF actor; all state is touched only by it.
#ifndef TROUPE_RUNTIME_INTERNAL_HEAD_H_
#define TROUPE_RUNTIME_INTERNAL_HEAD_H_

#include <string>

#include "caf/actor.hpp"
#include "caf/actor_system.hpp"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime::internal {

caf::actor SpawnHead(caf::actor_system& system, ClusterOptions options, std::string build_id);

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_HEAD_H_
