// troupe/base/events.h — the structured record of every start, exit, stop and restart.
//
// Each event is one line in the log, so an operator can grep a job's history and a test can
// assert the exact sequence a supervisor produced:
//
//   ts=2026-11-22T10:00:00.123456Z supervisor=job child=worker-1 gen=2 event=exit
//     reason=killed decision="restart after 10000us"        (one line in the log)
//
// Every process death is one event=process_exit line with its cause, written by whoever saw it
// end (the node agent that reaped a worker, the head that lost a node or fenced a worker, the
// driver of a training job into <work_dir>/logs/events.log):
//
//   ts=... supervisor=node:n1 child=n1/w0 gen=0 event=process_exit pid=4242 cause=signaled
//     signal=9 reason="killed by signal 9 (Killed)"
//
// Events that need more than the fields below carry a small map of further key=value fields,
// written after them in key order: a training job's decisions (train/job_events.h) are
//
//   ts=... supervisor=coordinator child= gen=3 event=generation source=checkpoint step=10
//     world=3 workers="n0/w0 n1/w0 n3/w0" reason="..."
//
// The record sits below every module: the runtime's supervisors and the pure training core
// (train/) both produce it. Install a sink with Runtime::SetEventSink (e.g. to capture events in a
// test); the default writes the line above to stderr. Sinks are called from actor threads: make
// them thread-safe. ParseEvent reads a line back, so tests and tools match fields, never the
// wording of `reason`.
#ifndef TROUPE_BASE_EVENTS_H_
#define TROUPE_BASE_EVENTS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace troupe::base {

// How a process ended (event=process_exit), as the process that reaped or fenced it saw it.
enum class ExitCause {
  kNone,      // not a process exit
  kExited,    // it exited by itself; exit_code holds its status
  kSignaled,  // a signal ended it (kill -9 from outside, a crash); signal holds the number
  kFenced,    // the head declared it dead for missed heartbeats and its node agent killed it
  kLost,      // its node or connection went away: no exit status could be observed
};
// "none", "exited", "signaled", "fenced", "lost" (the cause= field of the line).
const char* ExitCauseName(ExitCause cause);
// The inverse of ExitCauseName; false for an unknown name.
bool ParseExitCause(const std::string& name, ExitCause* cause);
// CAF prints an enum of a message by this name (CAF 0.17 serializes it as its integer).
inline std::string to_string(ExitCause x) { return ExitCauseName(x); }

struct SupervisionEvent {
  std::chrono::system_clock::time_point wall_time;
  std::string supervisor;
  std::string child;
  uint64_t generation = 0;
  std::string event;     // "start", "exit", "stop", "restart_scheduled", "escalate", "drop"
  std::string reason;    // exit reason as the supervisor classified it, with detail
  std::string decision;  // what the supervisor decided, for "exit"
  int64_t pid = 0;       // the process the event is about (written when set, or with a cause)
  // event "process_exit" only:
  ExitCause cause = ExitCause::kNone;
  int exit_code = -1;  // kExited: the exit status
  int signal = 0;      // kSignaled: the signal; kFenced: the signal it was killed with, if seen;
                       // otherwise a signal the event is about (written when non-zero)
  // Further fields (step=, world=, source=, ...). Keys are lowercase words, none of the names
  // above nor "ts" (FormatEvent skips such a key); ParseEvent puts every other key here.
  std::map<std::string, std::string> fields{};

  // fields[key], or "" when absent.
  std::string Field(const std::string& key) const;
  // fields[key] as an integer, or `fallback` when absent or not an integer.
  int64_t IntField(const std::string& key, int64_t fallback = -1) const;
  SupervisionEvent& Set(const std::string& key, const std::string& value);
  SupervisionEvent& Set(const std::string& key, int64_t value);
};

using EventSink = std::function<void(const SupervisionEvent&)>;

// The one-line form: ts=... supervisor=... child=... gen=... event=... [pid=...] [cause=...
// [exit_code=...]] [signal=...] [key=value of `fields`, in key order] reason=... decision=...
std::string FormatEvent(const SupervisionEvent& e);
// Reads a FormatEvent line back; false if it is not one.
// ParseEvent(FormatEvent(e)) gives e back, fields included (wall_time to the microsecond).
bool ParseEvent(const std::string& line, SupervisionEvent* e);

// A process_exit event for a wait(2) status: kExited or kSignaled (kFenced when `fenced`: the
// reaper itself killed it because the head fenced it), with a reason a person can read.
SupervisionEvent ProcessExitEvent(const std::string& reaper, const std::string& child, int64_t pid,
                                  int wait_status, bool fenced);

}  // namespace troupe::base

#endif  // TROUPE_BASE_EVENTS_H_
