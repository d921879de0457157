// troupe/runtime/events.h — the structured record of every start, exit, stop and restart.
//
// Each event is one line in the log, so an operator can grep a job's history and a test can
// assert the exact sequence a supervisor produced:
//
//   ts=2026-11-22T10:00:00.123456Z supervisor=job child=worker-1 gen=2 event=exit
//     reason=killed decision="restart after 10000us"        (one line in the log)
//
// Install a sink with Runtime::SetEventSink (e.g. to capture events in a test); the default
// writes the line above to stderr. Sinks are called from actor threads: make them thread-safe.
#ifndef TROUPE_RUNTIME_EVENTS_H_
#define TROUPE_RUNTIME_EVENTS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace troupe::runtime {

struct SupervisionEvent {
  std::chrono::system_clock::time_point wall_time;
  std::string supervisor;
  std::string child;
  uint64_t generation = 0;
  std::string event;     // "start", "exit", "stop", "restart_scheduled", "escalate", "drop"
  std::string reason;    // exit reason as the supervisor classified it, with detail
  std::string decision;  // what the supervisor decided, for "exit"
};

using EventSink = std::function<void(const SupervisionEvent&)>;

// The one-line form: ts=... supervisor=... child=... gen=... event=... reason=... decision=...
std::string FormatEvent(const SupervisionEvent& e);

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_EVENTS_H_
