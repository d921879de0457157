// troupe/runtime/faults.h — fault injection for actors: compiled in, off until used.
//
// The chaos harness and tests use it to prove a job survives. Faults are keyed by actor name
// (as registered in the runtime's directory) and, for message faults, by the message's first
// element when it is an atom:
//
//   auto& faults = runtime.faults();
//   faults.KillActor("worker-2");                         // exit_reason::kill, now
//   faults.FailAtMessage("worker-1", 3);                  // its 3rd message makes it fail
//   faults.DropMessages({.receiver = "shard-0", .atom = "grad"});
//   faults.DelayMessages({.receiver = "", .atom = "ping"}, std::chrono::milliseconds(50));
//   faults.HangAtMessage("shard-1", 2, std::chrono::seconds(30));  // stuck inside its handler
//
//   faults.Clear();
//
// Process-level crash points (CrashPoint("checkpoint.rename"), armed by --crash_at) are in
// troupe/base/crash_point.h.
//
// A chaos schedule from the environment (what `troupe chaos actors` sets for a program that
// embeds troupe): when TROUPE_CHAOS_ACTORS is set as a Runtime is created, the runtime fires its
// faults at their offsets (steady clock, milliseconds since the runtime was created) from a
// thread of its own, joined at Shutdown. The value is faults separated by spaces:
//
//   TROUPE_CHAOS_ACTORS='kill:worker-2@1500 stop:worker-1@800+2000 delay:shard-0@300+1000/50'
//
//   kill:NAME@AT               KillActor(NAME) at AT ms (exit_reason::kill)
//   stop:NAME@AT+FOR           from AT to AT+FOR ms the actor hangs inside its handler at its
//                              next message: alive, but no progress (FOR > 0)
//   delay:NAME@AT+FOR/DELAY    from AT to AT+FOR ms every message to it waits DELAY ms first
//                              (FOR > 0, DELAY > 0)
//
// NAME is an actor's name in the runtime's directory (it may hold any character but a space;
// the last '@' ends it). A malformed value makes Runtime creation fail (InvalidArgument naming
// the variable, the fault, what was expected and what it got). Each fault, when its time comes,
// is one supervision event through the runtime's event sink (supervisor=chaos child=NAME
// event=chaos_fault kind= at_ms= fired_ms= result=ok|no_actor fault=...) and, when
// TROUPE_CHAOS_LOG names a file, the same line appended to it. When TROUPE_CHAOS_ACTORS_LIST
// names a file, the runtime writes there at Shutdown the names in its directory, one a line.
//
// With no fault armed, the cost on the message path is one relaxed atomic load.
// Thread-safe.
#ifndef TROUPE_RUNTIME_FAULTS_H_
#define TROUPE_RUNTIME_FAULTS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::runtime {

// One fault of a TROUPE_CHAOS_ACTORS schedule (above).
struct ActorFault {
  enum class Kind { kKill, kStop, kDelay };
  Kind kind = Kind::kKill;
  std::string actor;
  int64_t at_ms = 0;     // since the runtime was created
  int64_t for_ms = 0;    // stop, delay: how long it lasts
  int64_t delay_ms = 0;  // delay: each message's

  // "kill:worker-2@1500", "stop:worker-1@800+2000", "delay:shard-0@300+1000/50".
  std::string ToString() const;
  bool operator==(const ActorFault& o) const {
    return kind == o.kind && actor == o.actor && at_ms == o.at_ms && for_ms == o.for_ms &&
           delay_ms == o.delay_ms;
  }
};
// "kill", "stop", "delay".
const char* ActorFaultKindName(ActorFault::Kind kind);
// The inverse; false for an unknown name.
bool ParseActorFaultKind(const std::string& name, ActorFault::Kind* kind);
// A schedule's text (faults separated by spaces; none: no fault) -> its faults, ordered by at_ms
// (stable). InvalidArgument names the first malformed fault, what was expected and what it got.
[[nodiscard]] absl::StatusOr<std::vector<ActorFault>> ParseActorFaults(const std::string& text);
// The faults' ToString()s separated by spaces ("" for none): ParseActorFaults reads it back.
std::string FormatActorFaults(const std::vector<ActorFault>& faults);

struct MessageFilter {
  std::string receiver;  // actor name; empty = any actor
  std::string atom;      // first element's atom text; empty = any message
  int64_t count = -1;    // how many matching messages to affect; -1 = all
};

class FaultInjector {
 public:
  struct Decision {
    enum class Kind { kDeliver, kDrop, kDelay, kFail, kHang } kind = Kind::kDeliver;
    std::chrono::nanoseconds delay{0};
    std::string reason;
  };

  // Kills the actor named `name` (exit_reason::kill: it cannot trap it). NotFound if no actor
  // has that name.
  [[nodiscard]] absl::Status KillActor(const std::string& name);
  // Makes the actor named `name` fail (exit with an error) when it is about to handle its
  // `n`-th application message (1-based, counted per incarnation).
  void FailAtMessage(const std::string& name, uint64_t n);
  // Makes the actor named `name` block inside its handler for `duration` when it handles its
  // `n`-th application message (as a deadlock or an endless loop would), then go on.
  void HangAtMessage(const std::string& name, uint64_t n, std::chrono::nanoseconds duration);
  void DropMessages(MessageFilter filter);
  void DelayMessages(MessageFilter filter, std::chrono::nanoseconds delay);
  // Faults that end at `until` (steady clock), as a schedule's stop and delay: the actor named
  // `name` hangs in its handler at its next message until `until`; messages matching `filter`
  // are delayed by `delay` until `until`. A rule past its end is removed at the next message.
  void HangNextMessageUntil(const std::string& name, std::chrono::steady_clock::time_point until);
  void DelayMessagesUntil(MessageFilter filter, std::chrono::nanoseconds delay,
                          std::chrono::steady_clock::time_point until);
  void Clear();

  bool armed() const { return armed_.load(std::memory_order_relaxed); }
  // Called by the receiving actor for its `index`-th (1-based) application message.
  Decision OnMessage(const std::string& receiver, uint64_t index, const std::string& atom);
  // Messages dropped or delayed so far.
  uint64_t dropped() const { return dropped_.load(); }
  uint64_t delayed() const { return delayed_.load(); }

  // Set once by the runtime: how KillActor reaches an actor by name.
  void SetKiller(std::function<absl::Status(const std::string&)> killer) {
    killer_ = std::move(killer);
  }

 private:
  struct Rule {
    MessageFilter filter;
    Decision::Kind kind;
    std::chrono::nanoseconds delay{0};
    uint64_t at = 0;  // kFail, kHang: message index (0: the next message)
    // When the rule ends (the hang lasts until then); max(): never.
    std::chrono::steady_clock::time_point until = std::chrono::steady_clock::time_point::max();
  };
  void Arm(Rule r);

  std::function<absl::Status(const std::string&)> killer_;
  std::atomic<bool> armed_{false};
  std::atomic<uint64_t> dropped_{0}, delayed_{0};
  std::mutex mu_;
  std::vector<Rule> rules_;
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_FAULTS_H_
