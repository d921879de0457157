#include "adamw.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "kernel_cases.h"
#include "test_util.h"
#include "troupe/kernels/adamw.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomVector;
using testing::Abs;
using testing::AdamWScalarSets;
using testing::ExpectSameBits;

class AdamWCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(AdamWCudaTest);

// Two consecutive steps (the second with fresh gradients) on the CPU kernel and on the CUDA kernel
// from the same state: param, m, v and the bf16 copy must be the same bits.
template <typename Tg>
void ExpectMatchesCpuKernel(int64_t n, int block, const AdamWScalars& s, bool start_at_zero,
                            bool with_copy) {
  SCOPED_TRACE(::testing::Message()
               << "n=" << n << " block=" << block << " lr=" << s.lr << " copy=" << with_copy);
  const auto param0 = kernels::testing::ToFloat(RandomVector(n, n + 1));
  const auto m0 = start_at_zero ? std::vector<float>(n, 0.0f)
                                : kernels::testing::ToFloat(RandomVector(n, n + 2, 1e-2));
  const auto v0 = start_at_zero ? std::vector<float>(n, 0.0f)
                                : Abs(kernels::testing::ToFloat(RandomVector(n, n + 3, 1e-4)));
  std::vector<float> p_cpu = param0, m_cpu = m0, v_cpu = v0;
  std::vector<float> p = param0, m = m0, v = v0;
  std::vector<__nv_bfloat16> copy(n, __float2bfloat16(-7.0f));
  for (int step = 0; step < 2; ++step) {
    // Gradients as the kernel stores them, and as the CPU kernel reads them (float).
    std::vector<Tg> grad(n);
    std::vector<float> grad_f(n);
    const auto g = RandomVector(n, 100 * n + step, 3.0);
    for (int64_t i = 0; i < n; ++i) {
      grad[i] = FromFloat<Tg>(static_cast<float>(g[i]));
      grad_f[i] = ToFloat(grad[i]);
    }
    AdamWUpdate(p_cpu.data(), grad_f.data(), m_cpu.data(), v_cpu.data(), n, s);
    ASSERT_TRUE(adamw_update(p.data(), with_copy ? copy.data() : nullptr, grad.data(), m.data(),
                             v.data(), n, s, nullptr, block)
                    .ok());
  }
  ExpectSameBits(p, p_cpu, "param", "CPU kernel");
  ExpectSameBits(m, m_cpu, "m", "CPU kernel");
  ExpectSameBits(v, v_cpu, "v", "CPU kernel");
  for (int64_t i = 0; i < n; ++i) {
    const __nv_bfloat16 want = with_copy ? __float2bfloat16(p_cpu[i]) : __float2bfloat16(-7.0f);
    ASSERT_EQ(testing::Bf16UlpDistance(copy[i], want), 0)
        << "param_bf16[" << i << "] is " << __bfloat162float(copy[i]) << ", want "
        << __bfloat162float(want);
  }
}

// Bit-identical to the CPU kernel in every schedule, hence also identical across schedules.
TEST_P(AdamWCudaTest, Fp32MatchesTheCpuKernelBitForBit) {
  for (int64_t n : {1, 31, 257, 5000}) {
    for (int block : {32, 96, 256}) {
      for (const AdamWScalars& s : AdamWScalarSets()) {
        for (bool zero : {true, false}) {
          ExpectMatchesCpuKernel<float>(n, block, s, zero, /*with_copy=*/true);
        }
      }
    }
  }
}

TEST_P(AdamWCudaTest, WithoutTheBf16CopyUpdatesTheSameAndWritesNoCopy) {
  for (const AdamWScalars& s : AdamWScalarSets()) {
    ExpectMatchesCpuKernel<float>(1000, 128, s, /*start_at_zero=*/false, /*with_copy=*/false);
  }
}

TEST_P(AdamWCudaTest, Bf16GradientsMatchTheCpuKernelOnTheirFloatValues) {
  for (int64_t n : {1, 300, 3001}) {
    for (const AdamWScalars& s : AdamWScalarSets()) {
      ExpectMatchesCpuKernel<__nv_bfloat16>(n, 96, s, /*start_at_zero=*/false, /*with_copy=*/true);
    }
  }
}

TEST_P(AdamWCudaTest, EmptyRangeIsANoOp) {
  EXPECT_TRUE(
      adamw_update<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 0, AdamWScalars{}, nullptr)
          .ok());
}

}  // namespace
}  // namespace troupe::kernels::cuda
