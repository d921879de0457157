// processes.h — signals for tests that stop real processes.
//
// kill(pid, SIGSTOP) returns before the process has stopped: the kernel wakes one of its threads
// to take the signal, and the group stop starts only when that thread runs. On a loaded machine
// the others go on working meanwhile (a stopped worker once answered a spawn 1 ms after the
// kill). A test that needs the process silent waits for every thread to be stopped.
#ifndef TROUPE_RUNTIME_PROCESSES_H_
#define TROUPE_RUNTIME_PROCESSES_H_

#include <sys/types.h>

#include <chrono>

namespace troupe::runtime::testing {

// Whether every thread of `pid` is stopped (state T in /proc/<pid>/task/*/stat).
bool AllThreadsStopped(pid_t pid);

// SIGSTOP to `pid`, then waits until every one of its threads has stopped; false if the signal
// failed or they were not all stopped within `within`.
bool StopAndWait(pid_t pid, std::chrono::milliseconds within = std::chrono::seconds(2));

}  // namespace troupe::runtime::testing

#endif  // TROUPE_RUNTIME_PROCESSES_H_
