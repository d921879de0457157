// troupe/base/crash_point.h — named points where a process can be made to die, for chaos tests.
//
//   base::CrashPoint("checkpoint.rename");   // in the code: SIGKILL here when armed
//   --crash_at=checkpoint.rename[:N]          // a role's option arms it (its N-th hit), or
//   base::ArmCrashPoint("checkpoint.rename", 2);
//
// Process-level, unlike the runtime's message faults (troupe/runtime/faults.h): the pure training
// code (train/) calls it too, so it lives below every module.
#ifndef TROUPE_BASE_CRASH_POINT_H_
#define TROUPE_BASE_CRASH_POINT_H_

#include <cstdint>
#include <string>

namespace troupe::base {

// Kills this process (SIGKILL, after one line on stderr) if `point` is armed and this is the
// armed hit. Cheap when nothing is armed. Thread-safe.
void CrashPoint(const char* point);
// Arms `point` for its `hit`-th hit (1-based) in this process; "" disarms.
void ArmCrashPoint(const std::string& point, uint64_t hit = 1);

}  // namespace troupe::base

#endif  // TROUPE_BASE_CRASH_POINT_H_
