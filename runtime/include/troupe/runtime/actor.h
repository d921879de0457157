// troupe/runtime/actor.h — the base of every actor troupe spawns.
//
// A troupe actor is a CAF event-based actor with an identity (name, generation) and a hook on
// every message it consumes. The hook is where the runtime
//   - counts progress (a heartbeat later reports it, so a handler stuck in a loop shows as hung),
//   - drops messages addressed to an older incarnation (see ActorRef),
//   - applies fault injection (fail at the Nth message, drop or delay matching messages).
// User code registers a factory returning a caf::behavior (see registry.h); it rarely needs
// this header beyond ActorRef.
//
//   troupe::runtime::ActorRef ref = runtime.LookupRef("worker-1").value();
//   runtime.Send(ref, ping_atom::value);   // dropped if worker-1 restarted since `ref` was taken
#ifndef TROUPE_RUNTIME_ACTOR_H_
#define TROUPE_RUNTIME_ACTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "caf/actor.hpp"
#include "caf/atom.hpp"
#include "caf/event_based_actor.hpp"

namespace troupe::runtime {

namespace internal {
class Context;
}  // namespace internal

// Liveness of one actor, read by the heartbeat from another thread.
struct ActorStats {
  std::string name;
  uint64_t generation = 0;
  std::atomic<uint64_t> progress{0};      // application messages consumed
  std::atomic<int64_t> busy_since_ns{0};  // steady-clock time its handler began; 0 = idle
};

// Envelope: (to_gen_atom, generation, payload). The receiver drops it unless its generation
// equals `generation`, then handles `payload` as if it had been sent directly.
using to_gen_atom = caf::atom_constant<caf::atom("tr_togen")>;

// A name plus the incarnation it refers to. Taken from the directory; stays valid only as long
// as that incarnation lives: messages sent through a stale ref are dropped by the receiver.
struct ActorRef {
  std::string name;
  uint64_t generation = 0;
  caf::actor handle;
  // "HOST:PORT" of the direct channel of the process hosting it (troupe/runtime/direct.h), as
  // the cluster's head hands it out with Spawn and Lookup; "" for an actor of this process or one
  // whose process has none. Runtime::Call uses it.
  std::string direct = {};
};

class Actor : public caf::event_based_actor {
 public:
  Actor(caf::actor_config& cfg, std::string name, uint64_t generation,
        std::shared_ptr<internal::Context> ctx);
  ~Actor() override;

  const std::string& actor_name() const { return name_; }
  uint64_t generation() const { return generation_; }
  // Application messages consumed so far (read from any thread).
  uint64_t progress() const { return stats_->progress.load(std::memory_order_relaxed); }

  caf::invoke_message_result consume(caf::mailbox_element& x) override;

  // The cluster head this process is joined to now (null outside a cluster): another one once a
  // head took over and this process rejoined it.
  caf::actor cluster_head();
  // Connects this process to worker `worker`'s (the directory's and a spawn's answers name it),
  // in the background, unless it is connected: messages between actors of the two processes
  // then skip the head, both ways, and survive its loss. No-op outside a cluster or for this
  // process's own worker. Connections are made on use, never to every worker (internal/mesh.h).
  void ConnectTo(const std::string& worker);

 protected:
  internal::Context& context() { return *ctx_; }
  const std::shared_ptr<internal::Context>& context_ptr() const { return ctx_; }

 private:
  caf::invoke_message_result ConsumeInner(caf::mailbox_element& x, caf::message inner);

  std::string name_;
  uint64_t generation_;
  std::shared_ptr<internal::Context> ctx_;
  std::shared_ptr<ActorStats> stats_;
};

// An actor whose behavior comes from a function; what the registry spawns.
class FunctionActor final : public Actor {
 public:
  using Init = std::function<caf::behavior(Actor*)>;
  FunctionActor(caf::actor_config& cfg, std::string name, uint64_t generation,
                std::shared_ptr<internal::Context> ctx, Init init)
      : Actor(cfg, std::move(name), generation, std::move(ctx)), init_(std::move(init)) {}
  caf::behavior make_behavior() override { return init_(this); }

 private:
  Init init_;
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_ACTOR_H_
