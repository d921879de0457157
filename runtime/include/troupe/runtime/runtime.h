// troupe/runtime/runtime.h — the embeddable troupe runtime.
//
// A Runtime owns a CAF actor system, the registry of actor types, the named-actor directory,
// the supervisors it started and the fault injector. Options come from code, the environment
// (TROUPE_*) or flags through one ConfigRegistry (config.h). Destroying it (or Shutdown())
// stops every supervisor in reverse start order and every actor it spawned, and waits for them.
// TROUPE_CHAOS_ACTORS in the environment arms a chaos schedule on the actors (faults.h).
//
//   troupe::runtime::ActorRegistry registry;
//   registry.Register<int32_t>("worker", MakeWorker);
//   auto rt = troupe::runtime::Runtime::FromArgs(std::move(registry), argc, argv);
//   if (!rt.ok()) { std::cerr << rt.status() << "\n"; return 2; }
//   SupervisorSpec spec{"job", Strategy::kOneForOne};
//   spec.children.push_back(ChildSpec::Actor("w1", "worker", caf::make_message(int32_t{1})));
//   auto sup = (*rt)->StartSupervisor(spec);
//   (*rt)->faults().KillActor("w1");   // the supervisor restarts it; the event is logged
#ifndef TROUPE_RUNTIME_RUNTIME_H_
#define TROUPE_RUNTIME_RUNTIME_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "caf/actor_system.hpp"
#include "caf/send.hpp"
#include "troupe/base/events.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/actor.h"
#include "troupe/runtime/config.h"
#include "troupe/runtime/faults.h"
#include "troupe/runtime/registry.h"
#include "troupe/runtime/runtime_options.h"
#include "troupe/runtime/supervisor.h"

namespace troupe::runtime {

namespace internal {
class ActorChaos;
class Context;
class DirectPool;
}  // namespace internal

class Runtime {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Runtime>> Create(ActorRegistry registry,
                                                                       RuntimeOptions options = {});
  // Options from defaults, then TROUPE_* environment variables, then flags. Arguments that are
  // not runtime options are returned in `rest` (if non-null).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Runtime>> FromArgs(
      ActorRegistry registry, int argc, const char* const* argv,
      std::vector<std::string>* rest = nullptr);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  caf::actor_system& system() { return *system_; }
  const RuntimeOptions& options() const { return options_; }

  // Spawns a registered actor type, unnamed and unsupervised.
  [[nodiscard]] absl::StatusOr<caf::actor> Spawn(const std::string& type,
                                                 const caf::message& args = {});
  // Spawns a registered actor type under a cluster-visible name (AlreadyExists if taken).
  [[nodiscard]] absl::StatusOr<ActorRef> SpawnNamed(const std::string& name,
                                                    const std::string& type,
                                                    const caf::message& args = {});
  // Validates the whole tree, then starts it. Returns the root supervisor's ref.
  [[nodiscard]] absl::StatusOr<ActorRef> StartSupervisor(const SupervisorSpec& spec);
  // The current incarnation registered under `name`.
  [[nodiscard]] absl::StatusOr<ActorRef> Lookup(const std::string& name) const;

  // Sends to the incarnation `to` names; dropped by the receiver if it is a newer one.
  // Resolves the name at send time; a name that is not registered is NotFound.
  template <class... Ts>
  [[nodiscard]] absl::Status Send(const ActorRef& to, Ts&&... xs) {
    TROUPE_ASSIGN_OR_RETURN(auto current, Lookup(to.name));
    caf::anon_send(current.handle, to_gen_atom::value, to.generation,
                   caf::make_message(std::forward<Ts>(xs)...));
    return absl::OkStatus();
  }

  // Calls the incarnation `to` names with `request` and returns its reply within `timeout`. An
  // actor of another process is called over the direct channel of the process hosting it
  // (ActorRef::direct; mutual TLS when this runtime has the cluster's TLS files): the calling
  // thread writes the request and reads the reply on a pooled connection, no other thread
  // involved. Otherwise the request goes through CAF. Thread-safe.
  // Errors: NotFound (that incarnation is gone: it exited, or restarted and has another
  // generation: Lookup the name again), Unavailable (its process is dead or cannot be reached,
  // or no reply within `timeout`), InvalidArgument (it does not handle the message), or the
  // actor's own error with its code (runtime::StatusToError, status.h).
  [[nodiscard]] absl::StatusOr<caf::message> Call(const ActorRef& to, const caf::message& request,
                                                  Duration timeout = std::chrono::seconds(5));

  FaultInjector& faults();
  void SetEventSink(base::EventSink sink);
  // Stops supervisors (reverse start order) and spawned actors, waits for all actors.
  void Shutdown();

  // For troupe's own cluster code; not part of the stable API.
  const std::shared_ptr<internal::Context>& internal_context() const { return ctx_; }

 private:
  Runtime(RuntimeOptions options, ActorRegistry registry);

  RuntimeOptions options_;
  std::shared_ptr<internal::Context> ctx_;
  std::unique_ptr<caf::actor_system_config> config_;
  std::unique_ptr<caf::actor_system> system_;
  std::unique_ptr<internal::DirectPool> direct_pool_;  // Call's idle connections
  std::unique_ptr<internal::ActorChaos> chaos_;        // TROUPE_CHAOS_ACTORS (faults.h)
  bool shut_down_ = false;
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_RUNTIME_H_
