// MonotonicNow never goes back and advances with real time.
#include "troupe/base/clock.h"

#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace troupe::base {
namespace {

TEST(MonotonicNowTest, NeverGoesBack) {
  absl::Time last = MonotonicNow();
  for (int i = 0; i < 10000; ++i) {
    const absl::Time now = MonotonicNow();
    ASSERT_GE(now, last);
    last = now;
  }
}

TEST(MonotonicNowTest, AdvancesWithSleep) {
  const absl::Time start = MonotonicNow();
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_GE(MonotonicNow() - start, absl::Milliseconds(20));
}

}  // namespace
}  // namespace troupe::base
