// supervisor_core.h — the OTP decision logic of a supervisor, as a pure state machine.
//
// No actors, no threads, no clock: the driver (the CAF supervisor actor, or a test) feeds it
// events with the current time and carries out the actions it returns, in order. That makes
// every decision testable exactly, with time driven by hand.
//
// Per child:                      Start
//   (not started) ───────────────────────────▶ running(gen g)
//   running(g) ── exit, restart decided ─────▶ waiting (timer) ── OnTimer ──▶ running(g+1)
//   running(g) ── Stop action (sibling group) ─▶ stopped ── group timer ────▶ running(g+1)
//   running(g) ── exit, no restart ──────────▶ terminated (temporary / normal transient)
//   any ── intensity exceeded ───────────────▶ all running children stopped, Escalate
//
// Not thread-safe: owned by one actor.
#ifndef TROUPE_RUNTIME_SUPERVISOR_CORE_H_
#define TROUPE_RUNTIME_SUPERVISOR_CORE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "troupe/runtime/supervision.h"

namespace troupe::runtime {

struct CoreChild {
  std::string name;
  RestartType restart = RestartType::kPermanent;
  BackoffPolicy backoff;
};

struct Action {
  enum class Kind {
    kStart,         // spawn `child` as incarnation `generation`
    kStop,          // stop `child` (graceful, then kill after its shutdown timeout); wait for it
    kRestartAfter,  // arm timer `timer` to fire after `delay`, then call OnTimer(timer)
    kEscalate,      // exit the supervisor with `reason` (its children are already stopped)
  };
  Kind kind;
  size_t child = 0;
  uint64_t generation = 0;
  Duration delay{0};
  uint64_t timer = 0;
  std::string reason;

  bool operator==(const Action& o) const {
    return kind == o.kind && child == o.child && generation == o.generation && delay == o.delay &&
           timer == o.timer;
  }
};

std::string DebugString(const Action& a);

class SupervisorCore {
 public:
  SupervisorCore(std::string name, Strategy strategy, Intensity intensity,
                 std::vector<CoreChild> children, uint64_t seed);

  // Starts every child in order.
  std::vector<Action> Start(TimePoint now);
  // A child exited by itself. Stale generations and children already stopped are ignored.
  // `decision` (if non-null) receives what the supervisor decided, for the log.
  std::vector<Action> OnExit(size_t child, uint64_t generation, ExitKind kind, TimePoint now,
                             std::string* decision = nullptr);
  // A timer armed by kRestartAfter fired.
  std::vector<Action> OnTimer(uint64_t timer, TimePoint now);
  // Stops every running child in reverse start order (the supervisor is shutting down).
  std::vector<Action> Shutdown();

  size_t size() const { return children_.size(); }
  const std::string& child_name(size_t i) const { return children_[i].spec.name; }
  uint64_t generation(size_t i) const { return children_[i].generation; }
  bool running(size_t i) const { return children_[i].state == State::kRunning; }
  // Looks a child up by name; returns size() if absent.
  size_t Find(const std::string& name) const;
  std::string DebugString() const;

 private:
  enum class State { kIdle, kRunning, kWaiting, kTerminated };
  struct Child {
    CoreChild spec;
    State state = State::kIdle;
    uint64_t generation = 0;
    int failures = 0;  // consecutive restarts, for the backoff
    TimePoint started_at{};
  };

  bool ShouldRestart(const Child& c, ExitKind kind) const;
  Duration BackoffDelay(size_t child);
  void StopRange(const std::vector<size_t>& order, std::vector<Action>* out);
  Action MakeStart(size_t i, TimePoint now);

  std::string name_;
  Strategy strategy_;
  Intensity intensity_;
  uint64_t seed_;
  std::vector<Child> children_;
  std::deque<TimePoint> restarts_;                  // within the intensity period
  std::map<uint64_t, std::vector<size_t>> timers_;  // timer -> children to start
  uint64_t next_timer_ = 1;
  uint64_t draws_ = 0;  // jitter counter
  bool escalated_ = false;
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_SUPERVISOR_CORE_H_
