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
// Process-level crash points (CrashPoint("checkpoint.rename"), armed by --crash_at) are in
// troupe/base/crash_point.h.
//   faults.Clear();
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

namespace troupe::runtime {

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
    uint64_t at = 0;  // kFail: message index
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
