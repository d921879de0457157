// The monotonic clock as an absl::Time (troupe/base/clock.h).
#include "troupe/base/clock.h"

#include <time.h>

namespace troupe::base {

absl::Time MonotonicNow() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return absl::UnixEpoch() + absl::DurationFromTimespec(ts);
}

}  // namespace troupe::base
