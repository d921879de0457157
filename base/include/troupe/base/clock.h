// troupe/base/clock.h — the clock of every timeout, deadline and interval in troupe.
//
//   const absl::Time deadline = base::MonotonicNow() + absl::Seconds(30);
//   while (base::MonotonicNow() < deadline) { ... }
//   const absl::Duration took = base::MonotonicNow() - start;
//
// absl::Now() reads the wall clock (CLOCK_REALTIME), which NTP, an administrator or a fault can
// step by hours: a +1 h step would expire every deadline at once, a -1 h step would postpone them
// all by an hour. MonotonicNow() reads CLOCK_MONOTONIC, which never steps, as an absl::Time so that
// deadlines keep their absl::Time type: absl::UnixEpoch() plus the time since boot. It is not a
// date. Use it for deadlines and intervals only: never print it as a time, never store it or send
// it to another process (each machine's boot differs), never compare it with absl::Now(); a
// deadline handed across an API is on this clock at both ends. Wall times for people and for other
// processes (event timestamps, log lines) stay absl::Now().
#ifndef TROUPE_BASE_CLOCK_H_
#define TROUPE_BASE_CLOCK_H_

#include "absl/time/time.h"

namespace troupe::base {

// Now on CLOCK_MONOTONIC's timeline (absl::UnixEpoch() + the monotonic reading). Thread-safe.
absl::Time MonotonicNow();

}  // namespace troupe::base

#endif  // TROUPE_BASE_CLOCK_H_
