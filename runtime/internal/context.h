// internal/context.h — state shared by the runtime and the actors it spawns: the named-actor
// directory, the actor registry, fault injection and the event sink. Thread-safe.
#ifndef TROUPE_RUNTIME_INTERNAL_CONTEXT_H_
#define TROUPE_RUNTIME_INTERNAL_CONTEXT_H_

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "troupe/base/events.h"
#include "troupe/runtime/actor.h"
#include "troupe/runtime/faults.h"
#include "troupe/runtime/registry.h"

namespace troupe::runtime::internal {

class Context : public std::enable_shared_from_this<Context> {
 public:
  explicit Context(ActorRegistry registry) : registry_(std::move(registry)) {}

  const ActorRegistry& registry() const { return registry_; }
  FaultInjector& faults() { return faults_; }

  void SetEventSink(base::EventSink sink);
  void Emit(base::SupervisionEvent e);

  // Named-actor directory. Register replaces an older incarnation of the same name.
  void Register(const ActorRef& ref);
  // Removes `name` only if it still names incarnation `generation`.
  void Unregister(const std::string& name, uint64_t generation);
  std::optional<ActorRef> Lookup(const std::string& name);
  // Every live named actor of this process (a worker tells a new head about them).
  std::vector<ActorRef> Directory();
  void ClearDirectory();
  // Incarnation numbers are per name and never reused, even across supervisor restarts:
  // returns one more than the last handed out for `name` (1 the first time).
  uint64_t NextGeneration(const std::string& name);

  // Named actors' liveness, for heartbeats.
  void Track(const std::shared_ptr<ActorStats>& stats);
  void Untrack(const ActorStats* stats);
  std::vector<std::shared_ptr<ActorStats>> Tracked();
  // The head asked for a full heartbeat (heartbeat_sync_atom); the sender takes the request.
  void RequestFullHeartbeat() { full_heartbeat_.store(true); }
  bool TakeFullHeartbeatRequest() { return full_heartbeat_.exchange(false); }

  // The cluster head this process belongs to (null when not in a cluster).
  void SetHead(caf::actor head);
  caf::actor head();

  // This process's mesh actor (internal/mesh.h), once started.
  void SetMesh(caf::actor mesh);
  caf::actor mesh();

  // Keeps `x` alive until the runtime shuts down (TLS relays).
  void KeepAlive(std::shared_ptr<void> x);
  void ReleaseKeepAlive();

  // Top-level actors the runtime spawned and must stop at shutdown; each leaves when it exits.
  void Own(const caf::actor& handle);
  // Still-running owned actors, in start order.
  std::vector<caf::actor> Owned();

 private:
  ActorRegistry registry_;
  FaultInjector faults_;
  std::mutex mu_;
  base::EventSink sink_;
  std::map<std::string, ActorRef> directory_;
  std::map<std::string, uint64_t> generations_;
  std::map<uint64_t, caf::actor> owned_;
  std::map<const ActorStats*, std::shared_ptr<ActorStats>> tracked_;
  caf::actor head_;
  caf::actor mesh_;
  std::vector<std::shared_ptr<void>> keep_alive_;
  uint64_t next_owned_ = 0;
  std::atomic<bool> full_heartbeat_{false};
};

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_CONTEXT_H_
