// troupe/runtime/supervisor.h — Erlang/OTP-style supervision trees of troupe actors.
//
// A supervisor starts its children in order, watches them, restarts them according to its
// strategy, their restart type, its restart intensity and their backoff (see supervision.h),
// and stops them in reverse start order — each gracefully (exit_reason::user_shutdown), then
// killed after its shutdown timeout. Each (re)start bumps the child's generation; the child is
// registered under its name in the runtime's directory, and messages sent through an ActorRef
// of an older generation are dropped by the new incarnation. Supervisors nest: a child can be
// a supervisor; when a supervisor gives up (intensity exceeded) it exits with an error and its
// parent handles that like any child failure.
//
//   SupervisorSpec spec{"job", Strategy::kOneForOne, Intensity{3, std::chrono::seconds(5)}};
//   spec.children.push_back(ChildSpec::Actor("worker-1", "worker", caf::make_message(1)));
//   spec.children.push_back(ChildSpec::Supervisor("shards", shards_spec));
//   absl::StatusOr<ActorRef> sup = runtime->StartSupervisor(spec);
//
// Every start, exit (with the decision taken), stop and escalation is one structured event
// (events.h).
#ifndef TROUPE_RUNTIME_SUPERVISOR_H_
#define TROUPE_RUNTIME_SUPERVISOR_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "caf/atom.hpp"
#include "caf/message.hpp"
#include "troupe/runtime/placement.h"
#include "troupe/runtime/registry.h"
#include "troupe/runtime/supervision.h"

namespace troupe::runtime {

struct SupervisorSpec;

struct ChildSpec {
  std::string name;
  std::string type;                                  // a registered actor type, or
  std::shared_ptr<const SupervisorSpec> supervisor;  // a nested supervisor
  caf::message args;
  // Unset: in this process. Set: spawned through the cluster's head where the scheduler
  // places it, so a child whose process dies is restarted on another worker.
  std::optional<Placement> placement;
  RestartType restart = RestartType::kPermanent;
  Duration shutdown_timeout = std::chrono::seconds(5);
  BackoffPolicy backoff;

  static ChildSpec Actor(std::string name, std::string type, caf::message args = {},
                         RestartType restart = RestartType::kPermanent);
  static ChildSpec Supervisor(std::string name, SupervisorSpec spec);
};

struct SupervisorSpec {
  std::string name;
  Strategy strategy = Strategy::kOneForOne;
  Intensity intensity;
  std::vector<ChildSpec> children;
  uint64_t seed = 0;  // for the backoff jitter
};

// Checks a whole tree before anything is spawned: names present and unique among siblings,
// actor types registered and their arguments of the right types, sane numbers.
[[nodiscard]] absl::Status Validate(const SupervisorSpec& spec, const ActorRegistry& registry);

// Requests a supervisor understands (besides exits and downs of its children):
//   (which_atom, std::string child) -> (caf::actor handle, uint64_t generation)
//                                      or an error if that child is not running.
using which_atom = caf::atom_constant<caf::atom("tr_which")>;

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_SUPERVISOR_H_
