// internal/head.h — the head's actor: membership table, failure detector, named-actor
// directory and remote spawn. Owned by one CAF actor; all state is touched only by it. Its
// membership decisions are MembershipCore's (runtime/membership_core.h); head_actor.h lists
// the files its work is split over.
#ifndef TROUPE_RUNTIME_INTERNAL_HEAD_H_
#define TROUPE_RUNTIME_INTERNAL_HEAD_H_

#include <memory>
#include <string>

#include "caf/actor.hpp"
#include "caf/actor_system.hpp"
#include "internal/head_store.h"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime::internal {

// `store` (may be null: nothing outlives the process): the head starts from its state — the
// membership generation goes on from there — and writes every membership change and directory
// entry to it; a write refused (another head has claimed the store since) ends this head.
caf::actor SpawnHead(caf::actor_system& system, ClusterOptions options, std::string build_id,
                     std::shared_ptr<HeadStore> store = nullptr);

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_HEAD_H_
