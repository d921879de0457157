// Helpers for the tests of the CUDA kernels run through the SIMT-on-CPU layer: the schedules every
// kernel runs under, plus bf16_test_util.h (bf16 rounding, ulp distance, comparisons).
// Private to kernels/cuda/ tests.
#ifndef TROUPE_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define TROUPE_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bf16_test_util.h"
#include "device.cuh"  // first: the SIMT layer's qualifiers precede the CUDA headers

namespace troupe::kernels::cuda::testing {

inline constexpr simt::Schedule kSchedules[] = {simt::Schedule::kForward, simt::Schedule::kReverse,
                                                simt::Schedule::kShuffled};

// A test run once per schedule: TEST_P(…) bodies launch under GetParam()'s schedule.
class ScheduledTest : public ::testing::TestWithParam<simt::Schedule> {
 protected:
  simt::ScopedSchedule schedule_{GetParam(), /*seed=*/11};
};

inline std::string ScheduleTestName(const ::testing::TestParamInfo<simt::Schedule>& info) {
  return simt::ScheduleName(info.param);
}

#define TROUPE_INSTANTIATE_SCHEDULES(suite)                                                   \
  INSTANTIATE_TEST_SUITE_P(Schedules, suite,                                                  \
                           ::testing::ValuesIn(::troupe::kernels::cuda::testing::kSchedules), \
                           ::troupe::kernels::cuda::testing::ScheduleTestName)

}  // namespace troupe::kernels::cuda::testing

#endif  // TROUPE_KERNELS_CUDA_CUDA_TEST_UTIL_H_
