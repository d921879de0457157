#include "adamw.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "test_util.h"
#include "troupe/kernels/adamw.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomVector;

class AdamWCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(AdamWCudaTest);

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    ASSERT_EQ(a, b) << what << "[" << i << "] is " << got[i] << ", CPU kernel " << want[i];
  }
}

std::vector<float> Abs(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// Step 1 from m = v = 0 (no decay); a late step with clipping and decay; and v so small that eps
// dominates the denominator.
std::vector<AdamWScalars> ScalarSets() {
  AdamWScalars first;  // default betas and eps
  first.lr = 3e-4f;
  first.bias_correction1 = 0.1f;
  first.bias_correction2 = 0.05f;
  AdamWScalars late;
  late.lr = 6e-4f;
  late.weight_decay = 0.1f;
  late.grad_scale = 0.37f;
  late.bias_correction1 = static_cast<float>(1 - std::pow(0.9, 1000));
  late.bias_correction2 = static_cast<float>(1 - std::pow(0.95, 1000));
  AdamWScalars tiny_v;
  tiny_v.lr = 1e-3f;
  tiny_v.beta1 = 0.8f;
  tiny_v.beta2 = 0.999f;
  tiny_v.eps = 1e-6f;
  tiny_v.weight_decay = 0.01f;
  tiny_v.grad_scale = 1e-4f;
  tiny_v.bias_correction1 = 0.2f;
  tiny_v.bias_correction2 = 0.002f;
  return {first, late, tiny_v};
}

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
  ExpectSameBits(p, p_cpu, "param");
  ExpectSameBits(m, m_cpu, "m");
  ExpectSameBits(v, v_cpu, "v");
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
      for (const AdamWScalars& s : ScalarSets()) {
        for (bool zero : {true, false}) {
          ExpectMatchesCpuKernel<float>(n, block, s, zero, /*with_copy=*/true);
        }
      }
    }
  }
}

TEST_P(AdamWCudaTest, WithoutTheBf16CopyUpdatesTheSameAndWritesNoCopy) {
  for (const AdamWScalars& s : ScalarSets()) {
    ExpectMatchesCpuKernel<float>(1000, 128, s, /*start_at_zero=*/false, /*with_copy=*/false);
  }
}

TEST_P(AdamWCudaTest, Bf16GradientsMatchTheCpuKernelOnTheirFloatValues) {
  for (int64_t n : {1, 300, 3001}) {
    for (const AdamWScalars& s : ScalarSets()) {
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
