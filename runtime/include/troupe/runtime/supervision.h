// troupe/runtime/supervision.h — OTP supervision vocabulary shared by the pure supervision
// logic (supervisor_core.h) and the CAF supervisor actor (supervisor.h).
//
//   strategy      which siblings restart with a failed child:
//     kOneForOne    only the failed child;
//     kOneForAll    all children (the others are stopped in reverse start order first);
//     kRestForOne   the failed child and every child started after it.
//   restart type  whether a child that exited is restarted:
//     kPermanent    always;  kTransient  only after an abnormal exit (error or killed);
//     kTemporary    never (and it is dropped when its siblings restart as a group).
//   intensity     at most `max_restarts` restarts within `period`; one more and the
//                 supervisor stops all its children and exits, escalating to its parent.
//   backoff       the n-th consecutive restart of a child waits
//                 min(max, initial * multiplier^(n-1)) * (1 + jitter * u), u in [-1, 1)
//                 drawn from a seeded counter-based generator (deterministic per seed).
#ifndef TROUPE_RUNTIME_SUPERVISION_H_
#define TROUPE_RUNTIME_SUPERVISION_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace troupe::runtime {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::steady_clock::time_point;

enum class Strategy { kOneForOne, kOneForAll, kRestForOne };
enum class RestartType { kPermanent, kTransient, kTemporary };

// Why a child exited, as the supervisor classifies it.
enum class ExitKind {
  kNormal,    // finished its work (exit_reason::normal)
  kError,     // failed: an error, an exception, a failed remote link
  kKilled,    // killed (exit_reason::kill, e.g. through fault injection)
  kShutdown,  // stopped by its supervisor; never triggers a restart
};

struct Intensity {
  int max_restarts = 3;
  Duration period = std::chrono::seconds(5);
};

struct BackoffPolicy {
  Duration initial = std::chrono::milliseconds(10);
  Duration max = std::chrono::seconds(10);
  double multiplier = 2.0;
  double jitter = 0.2;  // fraction of the delay, in [0, 1)
  // A child that ran at least this long before failing starts again from `initial`.
  Duration reset_after = std::chrono::seconds(30);
};

const char* ToString(Strategy s);
const char* ToString(RestartType r);
const char* ToString(ExitKind k);

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_SUPERVISION_H_
