// The cuBLASLt wrapper on a real GPU (label gpu): every kind of the GPT's matmuls, fp32 and bf16,
// against the CPU interpretation of the same plan (ReferenceMatmul), and bit-identical when run
// again. Skips, saying why, where no GPU is usable; scripts/gpu-check runs it.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "bf16_test_util.h"
#include "gpu_test_util.h"
#include "matmul_lt.h"
#include "test_util.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomVector;

using testing::Bf16UlpDistance;

// On a GPU machine: every kind, fp32 and bf16, against the CPU interpretation of the same plan,
// and bit-identical when run again.
template <typename T>
T Storage(double x) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(x);
  } else {
    return __float2bfloat16(static_cast<float>(x));
  }
}

template <typename T>
std::vector<T> Storage(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Storage<T>(v[i]);
  return out;
}

template <typename T>
void ExpectGpuMatches(const std::vector<T>& gpu, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(gpu.size(), want.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      ASSERT_LE(std::fabs(gpu[i] - want[i]), 1e-5 * std::fmax(std::fabs(want[i]), 1.0f))
          << what << "[" << i << "]: " << gpu[i] << " vs " << want[i];
    } else {
      // Both single roundings of fp32 sums in different orders: at most one ulp apart.
      ASSERT_LE(Bf16UlpDistance(gpu[i], want[i]), 1)
          << what << "[" << i << "]: " << __bfloat162float(gpu[i]) << " vs "
          << __bfloat162float(want[i]);
    }
  }
}

template <typename T>
void GpuMatchesReference(MatmulRunner& runner, MatmulDtype dtype) {
  const int64_t n = 37, c = 24, oc = 40;
  const MatmulShape shapes[] = {
      MatmulShape::Forward(n, c, oc, true, true, dtype),
      MatmulShape::Forward(n, c, oc, false, true, dtype),
      MatmulShape::Forward(n, c, oc, true, false, dtype),
      MatmulShape::Forward(n, c, oc, false, false, dtype),
      MatmulShape::BackwardInput(n, c, oc, false, dtype),
      MatmulShape::BackwardInput(n, c, oc, true, dtype),
      MatmulShape::BackwardWeight(n, c, oc, dtype),
      MatmulShape::BackwardBias(n, oc, dtype),
  };
  for (const MatmulShape& s : shapes) {
    SCOPED_TRACE(s.ToString());
    const int64_t out_size = s.kind == MatmulKind::kForward          ? n * oc
                             : s.kind == MatmulKind::kBackwardInput  ? n * c
                             : s.kind == MatmulKind::kBackwardWeight ? oc * c
                                                                     : oc;
    const bool fwd = s.kind == MatmulKind::kForward;
    // Roles: out, inp, weight, dout, bias, pre_gelu.
    std::vector<std::vector<T>> h = {Storage<T>(RandomVector(out_size, 1)),
                                     Storage<T>(RandomVector(n * c, 2)),
                                     Storage<T>(RandomVector(oc * c, 3)),
                                     Storage<T>(RandomVector(n * oc, 4)),
                                     Storage<T>(RandomVector(oc, 5)),
                                     Storage<T>(RandomVector(fwd ? n * oc : n * c, 6, 3.0))};
    auto buffers = [&](std::vector<void*> p) {
      MatmulBuffers b;
      b.out = p[0], b.inp = p[1], b.weight = p[2], b.dout = p[3], b.bias = p[4];
      b.pre_gelu = p[5];
      return b;
    };
    std::vector<std::vector<T>> want = h;
    ASSERT_TRUE(ReferenceMatmul(s, buffers({want[0].data(), want[1].data(), want[2].data(),
                                            want[3].data(), want[4].data(), want[5].data()}))
                    .ok());

    std::vector<void*> dev(h.size(), nullptr);
    for (size_t i = 0; i < h.size(); ++i) {
      ASSERT_EQ(cudaMalloc(&dev[i], h[i].size() * sizeof(T)), cudaSuccess);
    }
    std::vector<std::vector<T>> first;
    for (int run = 0; run < 2; ++run) {
      for (size_t i = 0; i < h.size(); ++i) {
        ASSERT_EQ(cudaMemcpy(dev[i], h[i].data(), h[i].size() * sizeof(T), cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      const absl::Status st = runner.Run(s, buffers(dev), nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<std::vector<T>> got = h;
      for (size_t i = 0; i < h.size(); ++i) {
        ASSERT_EQ(
            cudaMemcpy(got[i].data(), dev[i], h[i].size() * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
      }
      ExpectGpuMatches(got[0], want[0], "out");
      if (fwd && s.gelu) ExpectGpuMatches(got[5], want[5], "pre_gelu");
      if (run == 0) {
        first = got;
      } else {
        EXPECT_EQ(0, std::memcmp(first[0].data(), got[0].data(), got[0].size() * sizeof(T)))
            << "not bit-identical run to run";
      }
    }
    for (void* p : dev) cudaFree(p);
  }
}

TEST(MatmulRunnerGpuTest, MatchesTheCpuInterpretationAndRepeatsBitForBit) {
  TROUPE_SKIP_WITHOUT_GPU();
  auto runner = MatmulRunner::Create();
  ASSERT_TRUE(runner.ok()) << runner.status();
  GpuMatchesReference<float>(**runner, MatmulDtype::kF32);
  GpuMatchesReference<__nv_bfloat16>(**runner, MatmulDtype::kBf16);
  EXPECT_EQ((*runner)->cached_shapes(), 16u);  // planned once each, though run twice
}

}  // namespace
}  // namespace troupe::kernels::cuda
