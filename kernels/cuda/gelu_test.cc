#include "gelu.cuh"

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "test_util.h"
#include "troupe/kernels/gelu.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomVector;
using testing::ExpectClose;
using testing::ExpectWithinOneBf16Ulp;

class GeluCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(GeluCudaTest);

TEST_P(GeluCudaTest, Fp32MatchesTheCpuReference) {
  for (int64_t n : {1, 31, 257, 5000}) {
    for (int block : {32, 96, 256}) {
      const auto inp = RandomVector(n, n + 1, 4.0), dout = RandomVector(n, n + 2);
      const auto dinp0 = RandomVector(n, n + 3);
      std::vector<double> out_ref(n), dinp_ref = dinp0;
      GeluForward<double>(out_ref.data(), inp.data(), n);
      GeluBackward<double>(dinp_ref.data(), inp.data(), dout.data(), n);

      auto inp_f = kernels::testing::ToFloat(inp), dout_f = kernels::testing::ToFloat(dout);
      std::vector<float> out(n), dinp = kernels::testing::ToFloat(dinp0);
      ASSERT_TRUE(gelu_forward(out.data(), inp_f.data(), n, nullptr, block).ok());
      ASSERT_TRUE(gelu_backward(dinp.data(), inp_f.data(), dout_f.data(), n, nullptr, block).ok());
      ExpectClose(out, out_ref, 1e-5, "out");
      ExpectClose(dinp, dinp_ref, 1e-5, "dinp", /*floor=*/1.0);  // accumulated onto O(1) values
    }
  }
}

TEST_P(GeluCudaTest, Bf16IsWithinOneUlpOfTheRoundedReference) {
  const int64_t n = 3001;
  const auto inp_b = testing::ToBf16(RandomVector(n, 5, 4.0));
  const auto dout_b = testing::ToBf16(RandomVector(n, 6));
  const auto dinp0_b = testing::ToBf16(RandomVector(n, 7));
  // The reference starts from the same bf16 values, in double.
  const auto inp = testing::ToDouble(inp_b), dout = testing::ToDouble(dout_b);
  std::vector<double> out_ref(n), dinp_ref = testing::ToDouble(dinp0_b);
  GeluForward<double>(out_ref.data(), inp.data(), n);
  GeluBackward<double>(dinp_ref.data(), inp.data(), dout.data(), n);

  std::vector<__nv_bfloat16> out(n), dinp = dinp0_b;
  ASSERT_TRUE(gelu_forward(out.data(), inp_b.data(), n, nullptr).ok());
  ASSERT_TRUE(gelu_backward(dinp.data(), inp_b.data(), dout_b.data(), n, nullptr).ok());
  ExpectWithinOneBf16Ulp(out, out_ref, "out");
  ExpectWithinOneBf16Ulp(dinp, dinp_ref, "dinp");
}

}  // namespace
}  // namespace troupe::kernels::cuda
