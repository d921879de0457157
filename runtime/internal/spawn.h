// internal/spawn.h — how the runtime and supervisors spawn registered actors and supervisors:
// monitored by the spawner (if any), registered in the directory under their name, and
// unregistered when they exit.
#ifndef TROUPE_RUNTIME_INTERNAL_SPAWN_H_
#define TROUPE_RUNTIME_INTERNAL_SPAWN_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "caf/actor.hpp"
#include "caf/actor_system.hpp"
#include "caf/local_actor.hpp"
#include "troupe/runtime/supervisor.h"

namespace troupe::runtime::internal {

class Context;

// Spawns child `spec` as incarnation `generation`. With `parent`, the child is spawned from
// (and monitored by) the parent actor; otherwise from `system`, unmonitored.
[[nodiscard]] absl::StatusOr<caf::actor> SpawnChild(caf::actor_system& system,
                                                    caf::event_based_actor* parent,
                                                    const ChildSpec& spec, uint64_t generation,
                                                    const std::shared_ptr<Context>& ctx);

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_SPAWN_H_
