// The SIMT-on-CPU layer's own semantics: barriers, warp operations, exited lanes, shared memory,
// and the errors it reports. Every CUDA kernel test in kernels/cuda/ rests on these.
#include "simt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "device.cuh"

namespace troupe::kernels::cuda {
namespace {

using simt::Schedule;
using simt::ScopedSchedule;

constexpr Schedule kSchedules[] = {Schedule::kForward, Schedule::kReverse, Schedule::kShuffled};

class SimtTest : public ::testing::TestWithParam<Schedule> {
 protected:
  ScopedSchedule schedule_{GetParam(), /*seed=*/7};
};

INSTANTIATE_TEST_SUITE_P(Schedules, SimtTest, ::testing::ValuesIn(kSchedules),
                         [](const auto& info) { return simt::ScheduleName(info.param); });

__global__ void rotate_kernel(int* out, int salt) {
  __shared__ int s[256];
  const int tid = threadIdx.x, n = blockDim.x;
  s[tid] = salt + 1000 * static_cast<int>(blockIdx.x) + tid;
  __syncthreads();
  out[blockIdx.x * n + tid] = s[(tid + 1) % n];
}

TEST_P(SimtTest, BarrierOrdersSharedMemoryWrites) {
  for (int n : {1, 37, 64, 256}) {
    std::vector<int> out(3 * n, -1);
    ASSERT_TRUE(TROUPE_LAUNCH(rotate_kernel, dim3(3), dim3(n), 0, nullptr, out.data(), 5).ok());
    for (int b = 0; b < 3; ++b) {
      for (int t = 0; t < n; ++t) {
        ASSERT_EQ(out[b * n + t], 5 + 1000 * b + (t + 1) % n) << "block " << b << " thread " << t;
      }
    }
  }
}

// The same kernel without its barrier: a thread may read its neighbour's slot before the
// neighbour wrote it.
__global__ void racy_rotate_kernel(int* out, int salt) {
  __shared__ int s[256];
  const int tid = threadIdx.x, n = blockDim.x;
  s[tid] = salt + tid;
  out[tid] = s[(tid + n - 1) % n];  // the previous thread's slot; no __syncthreads
}

TEST(SimtSemanticsTest, AMissingBarrierShowsUnderTheReverseOrShuffledSchedule) {
  const int n = 64;
  auto wrong = [&](Schedule schedule) {
    ScopedSchedule scoped(schedule, 3);
    std::vector<int> out(n, -1);
    EXPECT_TRUE(
        TROUPE_LAUNCH(racy_rotate_kernel, dim3(1), dim3(n), 0, nullptr, out.data(), 9).ok());
    int mismatches = 0;
    for (int t = 0; t < n; ++t) mismatches += out[t] != 9 + (t + n - 1) % n;
    return mismatches;
  };
  // Forward order runs thread t-1 to completion before thread t, so it happens to look right.
  EXPECT_EQ(wrong(Schedule::kForward), 1);  // only thread 0 reads a slot not yet written
  EXPECT_GT(wrong(Schedule::kReverse), n / 2);
  EXPECT_GT(wrong(Schedule::kShuffled), 0);
}

TEST(SimtSemanticsTest, SharedMemoryStartsPoisonedInEveryBlock) {
  // Reads before writes see 0xFF bytes (NaN), in each block, not the previous block's values.
  struct Probe {
    static __global__ void kernel(float* out) {
      __shared__ float s[32];
      TROUPE_DYNAMIC_SHARED(float, d);
      out[2 * blockIdx.x] = s[threadIdx.x];
      out[2 * blockIdx.x + 1] = d[threadIdx.x];
      __syncthreads();
      s[threadIdx.x] = 1.0f;
      d[threadIdx.x] = 2.0f;
    }
  };
  std::vector<float> out(4, 0);
  ASSERT_TRUE(
      TROUPE_LAUNCH(Probe::kernel, dim3(2), dim3(1), 32 * sizeof(float), nullptr, out.data()).ok());
  for (float v : out) EXPECT_TRUE(std::isnan(v)) << v;
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void partial_barrier_kernel(int* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1;
  __syncthreads();
}

TEST_P(SimtTest, SyncthreadsFromDivergentCodeIsReported) {
  std::vector<int> out(64, 0);
  absl::Status s =
      TROUPE_LAUNCH(divergent_barrier_kernel, dim3(1), dim3(64), 0, nullptr, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("divergent __syncthreads"), std::string::npos) << s;
  EXPECT_NE(s.message().find("divergent_barrier_kernel"), std::string::npos) << s;
  EXPECT_NE(s.message().find("simt_test.cc:"), std::string::npos) << s;

  s = TROUPE_LAUNCH(partial_barrier_kernel, dim3(1), dim3(64), 0, nullptr, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("divergent"), std::string::npos) << s;
}

__global__ void butterfly_kernel(float* out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float v = static_cast<float>(100 * warp + lane + 1);
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  out[threadIdx.x] = v;
}

TEST_P(SimtTest, ShflXorButterflyReducesEachWarp) {
  std::vector<float> out(96, 0);
  ASSERT_TRUE(TROUPE_LAUNCH(butterfly_kernel, dim3(1), dim3(96), 0, nullptr, out.data()).ok());
  for (int t = 0; t < 96; ++t) {
    const int warp = t / 32;
    EXPECT_EQ(out[t], 32 * 100 * warp + 32 * 33 / 2) << "thread " << t;
  }
}

__global__ void shuffle_forms_kernel(int* out) {
  const int lane = threadIdx.x;
  out[lane] = __shfl_sync(0xffffffffu, lane * 10, 3, 8);  // lane 3 of each 8-lane segment
  out[32 + lane] = __shfl_down_sync(0xffffffffu, lane * 10, 2, 8);
  out[64 + lane] = __shfl_up_sync(0xffffffffu, lane * 10, 5);
  out[96 + lane] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
}

TEST_P(SimtTest, ShuffleFormsFollowCudaRules) {
  std::vector<int> out(128, -1);
  ASSERT_TRUE(TROUPE_LAUNCH(shuffle_forms_kernel, dim3(1), dim3(32), 0, nullptr, out.data()).ok());
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(out[l], (l / 8 * 8 + 3) * 10) << l;
    EXPECT_EQ(out[32 + l], (l % 8 + 2 < 8 ? l + 2 : l) * 10) << l;  // past the segment: own value
    EXPECT_EQ(out[64 + l], (l >= 5 ? l - 5 : l) * 10) << l;
    EXPECT_EQ(static_cast<unsigned>(out[96 + l]), ballot) << l;
  }
}

// Lanes 16..31 of every warp leave at once; the rest reduce among themselves, synchronise the
// warp and the block (exited threads do not hold barriers), and write the result.
__global__ void early_exit_kernel(float* out) {
  const int lane = threadIdx.x % 32;
  if (lane >= 16) return;
  float v = static_cast<float>(lane + 1);
  for (int offset = 8; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffu, v, offset);
  __syncwarp(0xffffu);
  __syncthreads();
  out[threadIdx.x] = v;
}

TEST_P(SimtTest, WarpWithEarlyExitedLanes) {
  std::vector<float> out(64, -1);
  ASSERT_TRUE(TROUPE_LAUNCH(early_exit_kernel, dim3(2), dim3(64), 0, nullptr, out.data()).ok());
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], t % 32 < 16 ? 136.0f : -1.0f) << t;
}

__global__ void read_exited_lane_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 16);  // lane ^ 16 has exited
}

__global__ void partial_warp_kernel(float* out) {
  // A block of 48 threads: its second warp has 16 lanes, and xor 16 names lanes that do not exist.
  out[threadIdx.x] = WarpSum(1.0f);
}

TEST_P(SimtTest, ShuffleFromALaneNotTakingPartIsReported) {
  std::vector<float> out(64, 0);
  absl::Status s =
      TROUPE_LAUNCH(read_exited_lane_kernel, dim3(1), dim3(32), 0, nullptr, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("not taking part"), std::string::npos) << s;
  s = TROUPE_LAUNCH(partial_warp_kernel, dim3(1), dim3(48), 0, nullptr, out.data());
  EXPECT_NE(s.message().find("not taking part"), std::string::npos) << s;
}

__global__ void warp_mismatch_kernel(float* out) {
  const int lane = threadIdx.x;
  float v = lane < 8 ? __shfl_xor_sync(0xffffffffu, 1.0f, 1) : 0.0f;
  __syncwarp();
  out[lane] = v;
}

TEST_P(SimtTest, WarpLanesAtDifferentOperationsAreReported) {
  std::vector<float> out(32, 0);
  absl::Status s = TROUPE_LAUNCH(warp_mismatch_kernel, dim3(1), dim3(32), 0, nullptr, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("__syncwarp"), std::string::npos) << s;
}

__global__ void count_kernel(int* counter, float* sum) {
  atomicAdd(counter, 1);
  atomicAdd(sum, 0.5f);
}

TEST_P(SimtTest, AtomicsAndGridIndices) {
  int counter = 0;
  float sum = 0;
  ASSERT_TRUE(
      TROUPE_LAUNCH(count_kernel, dim3(3, 2, 2), dim3(8, 4, 2), 0, nullptr, &counter, &sum).ok());
  EXPECT_EQ(counter, 12 * 64);
  EXPECT_EQ(sum, 12 * 32);

  struct Index {
    static __global__ void kernel(int* out) {
      const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
      const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
      out[block * blockDim.x * blockDim.y * blockDim.z + thread] += 1;
    }
  };
  std::vector<int> out(12 * 64, 0);
  ASSERT_TRUE(
      TROUPE_LAUNCH(Index::kernel, dim3(3, 2, 2), dim3(8, 4, 2), 0, nullptr, out.data()).ok());
  for (int v : out) EXPECT_EQ(v, 1);
}

TEST(SimtSemanticsTest, LaunchesOutsideTheLimitsAreRejected) {
  int counter = 0;
  float sum = 0;
  absl::Status s = TROUPE_LAUNCH(count_kernel, dim3(1), dim3(2048), 0, nullptr, &counter, &sum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("count_kernel"), std::string::npos) << s;
  s = TROUPE_LAUNCH(count_kernel, dim3(0), dim3(32), 0, nullptr, &counter, &sum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = TROUPE_LAUNCH(count_kernel, dim3(1), dim3(32), 1 << 20, nullptr, &counter, &sum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(counter, 0);
}

TEST(SimtSemanticsTest, Bf16ArithmeticRoundsAsOnTheGpu) {
  // 1 + 2^-8 is halfway between two bf16 values: round to nearest even gives 1.
  EXPECT_EQ(__bfloat162float(__float2bfloat16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(__bfloat162float(__float2bfloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  const __nv_bfloat16 a = __float2bfloat16(1.5f), b = __float2bfloat16(2.25f);
  EXPECT_EQ(__bfloat162float(a * b), 3.375f);
}

}  // namespace
}  // namespace troupe::kernels::cuda
