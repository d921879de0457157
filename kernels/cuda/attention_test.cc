#include "attention.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "kernel_cases.h"
#include "test_util.h"
#include "troupe/kernels/attention.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomVector;
using testing::ExpectClose;
using testing::ExpectWithinOneBf16Ulp;
// kernel_cases.h
using testing::AttentionReference;
using testing::AttentionShape;
using testing::BackwardFromOut;
using testing::ComputeAttentionReference;
using testing::ExpectBackwardFromOutIsTheCpuGradient;
using testing::kAttentionShapes;
using testing::SameBits;

template <typename Tx>
struct Result {
  std::vector<Tx> out, dqkv;
  std::vector<float> lse;
};

// Forward then backward (from the forward's own out and lse), as training runs them.
template <typename Tx>
Result<Tx> RunBoth(const AttentionShape& s, const std::vector<Tx>& qkv, const std::vector<Tx>& dout,
                   const std::vector<Tx>& dqkv0, int group) {
  Result<Tx> r;
  r.out.resize(s.b * s.t * s.c);
  r.lse.resize(s.b * s.nh * s.t);
  r.dqkv = dqkv0;
  std::vector<float> workspace(attention_workspace_bytes(s.b, s.t, s.c, s.nh) / sizeof(float));
  const absl::Status f = attention_forward(r.out.data(), r.lse.data(), qkv.data(), s.b, s.t, s.c,
                                           s.nh, nullptr, group);
  EXPECT_TRUE(f.ok()) << f;
  const absl::Status b =
      attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(),
                         workspace.data(), s.b, s.t, s.c, s.nh, nullptr, group);
  EXPECT_TRUE(b.ok()) << b;
  return r;
}

// The groups (threads per row) a shape is run with: the default, and a wider one.
std::vector<int> Groups(const AttentionShape& s) {
  const int def = AttentionDefaultGroup(s.c / s.nh);
  return {0, def == 1 ? 4 : 2 * def};
}

class AttentionCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(AttentionCudaTest);

TEST_P(AttentionCudaTest, Fp32MatchesTheCpuReference) {
  uint64_t seed = 1;
  for (const AttentionShape& s : kAttentionShapes) {
    for (int group : Groups(s)) {
      SCOPED_TRACE(::testing::Message() << "B=" << s.b << " T=" << s.t << " C=" << s.c
                                        << " NH=" << s.nh << " group=" << group);
      // Scale 2: scores of a few units, so that the softmax is far from uniform.
      const auto qkv = RandomVector(s.b * s.t * 3 * s.c, ++seed, 2.0);
      const auto dout = RandomVector(s.b * s.t * s.c, ++seed);
      for (bool zero_dqkv0 : {true, false}) {
        // From zero: the gradient itself; from random values: that backward accumulates.
        const auto dqkv0 =
            zero_dqkv0 ? std::vector<double>(qkv.size(), 0.0) : RandomVector(qkv.size(), ++seed);
        const AttentionReference ref = ComputeAttentionReference(s, qkv, dout, dqkv0);
        const auto r = RunBoth(s, kernels::testing::ToFloat(qkv), kernels::testing::ToFloat(dout),
                               kernels::testing::ToFloat(dqkv0), group);
        // out is a convex combination of values of size ~1: floor 0.1 against cancellation.
        ExpectClose(r.out, ref.out, 1e-5, "out", /*floor=*/0.5);
        ExpectClose(r.lse, ref.lse, 1e-5, "lse", /*floor=*/1.0);
        // Gradients sum up to T terms of size ~1 that cancel: floor 1.
        ExpectClose(r.dqkv, ref.dqkv, 1e-5, "dqkv", /*floor=*/0.1);
      }
    }
  }
}

// The test's flash-attention-2 reference agrees with the CPU kernel when given the exact out.
TEST(AttentionCudaReferenceTest, BackwardFromOutIsTheCpuGradient) {
  ExpectBackwardFromOutIsTheCpuGradient();
}

// out is one rounding of a float computation from bf16 inputs: within 1 ulp of the rounded
// double reference. The backward computes D from the bf16 out it is given (as flash attention
// does), so its reference is the double gradient for that same out (BackwardFromOut): one
// rounding of float sums again, within 1 ulp. That gradient differs from the exact one by the
// rounding of out: relative ~2^-9 (checked below, norm-wise, at 2^-7).
TEST_P(AttentionCudaTest, Bf16IsWithinOneUlpOfTheRoundedReference) {
  uint64_t seed = 100;
  for (const AttentionShape& s :
       {AttentionShape{2, 33, 16, 2}, AttentionShape{1, 70, 64, 1}, AttentionShape{1, 7, 3, 3}}) {
    for (bool zero_dqkv0 : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "B=" << s.b << " T=" << s.t << " C=" << s.c
                                        << " NH=" << s.nh << " zero_dqkv0=" << zero_dqkv0);
      const auto qkv_b = testing::ToBf16(RandomVector(s.b * s.t * 3 * s.c, ++seed, 2.0));
      const auto dout_b = testing::ToBf16(RandomVector(s.b * s.t * s.c, ++seed));
      const auto dqkv0_b = testing::ToBf16(zero_dqkv0 ? std::vector<double>(qkv_b.size(), 0.0)
                                                      : RandomVector(qkv_b.size(), ++seed));
      // The reference starts from the same bf16 values, in double.
      const auto qkv = testing::ToDouble(qkv_b), dout = testing::ToDouble(dout_b);
      const auto dqkv0 = testing::ToDouble(dqkv0_b);
      const AttentionReference ref = ComputeAttentionReference(s, qkv, dout, dqkv0);
      const auto r = RunBoth(s, qkv_b, dout_b, dqkv0_b, /*group=*/0);
      ExpectWithinOneBf16Ulp(r.out, ref.out, "out");
      ExpectClose(r.lse, ref.lse, 1e-5, "lse", /*floor=*/1.0);
      std::vector<double> dqkv_ref = dqkv0;
      BackwardFromOut(s, dqkv_ref, dout, qkv, testing::ToDouble(r.out));
      ExpectWithinOneBf16Ulp(r.dqkv, dqkv_ref, "dqkv");
      if (zero_dqkv0) {
        EXPECT_LT(kernels::testing::RelErr(testing::ToDouble(r.dqkv), ref.dqkv), 1.0 / 128);
      }
    }
  }
}

// No atomics, and every sum in a fixed order that does not depend on the threads per row: the
// same bits under every schedule and group.
TEST(AttentionCudaDeterminismTest, SameBitsAcrossSchedulesAndGroups) {
  const AttentionShape s{2, 37, 32, 2};
  const auto qkv = kernels::testing::ToFloat(RandomVector(s.b * s.t * 3 * s.c, 7, 2.0));
  const auto dout = kernels::testing::ToFloat(RandomVector(s.b * s.t * s.c, 8));
  const auto dqkv0 = kernels::testing::ToFloat(RandomVector(qkv.size(), 9));
  Result<float> first;
  bool have_first = false;
  for (simt::Schedule schedule : testing::kSchedules) {
    simt::ScopedSchedule scoped(schedule, /*seed=*/5);
    for (int group : {2, 8, 32}) {
      const auto r = RunBoth(s, qkv, dout, dqkv0, group);
      if (!have_first) {
        first = r;
        have_first = true;
        continue;
      }
      EXPECT_TRUE(SameBits(r.out, first.out)) << simt::ScheduleName(schedule) << " " << group;
      EXPECT_TRUE(SameBits(r.lse, first.lse)) << simt::ScheduleName(schedule) << " " << group;
      EXPECT_TRUE(SameBits(r.dqkv, first.dqkv)) << simt::ScheduleName(schedule) << " " << group;
    }
  }
}

TEST(AttentionCudaWorkspaceTest, LinearInTAndFarBelowTheScoreMatrix) {
  const int64_t b = 8, c = 768, nh = 12;
  const size_t at1024 = attention_workspace_bytes(b, 1024, c, nh);
  const size_t at2048 = attention_workspace_bytes(b, 2048, c, nh);
  EXPECT_EQ(at2048, 2 * at1024);
  EXPECT_GT(at1024, 0u);
  const double scores = static_cast<double>(b * nh) * 1024 * 1024 * sizeof(float);
  EXPECT_LT(static_cast<double>(at1024), scores / 100);
}

TEST(AttentionCudaShapeTest, RejectsWhatTheKernelsCannotRun) {
  std::vector<float> buf(4096), lse(64);
  auto forward = [&](int64_t c, int64_t nh, int group) {
    return attention_forward(buf.data(), lse.data(), buf.data(), 1, 4, c, nh, nullptr, group);
  };
  EXPECT_FALSE(forward(10, 3, 0).ok());   // C not a multiple of NH
  EXPECT_FALSE(forward(256, 1, 0).ok());  // head size 256 > 128
  EXPECT_FALSE(forward(64, 1, 3).ok());   // group not a power of two
  EXPECT_FALSE(forward(64, 1, 4).ok());   // 4 threads × 8 channels < 64
  EXPECT_FALSE(forward(64, 1, 64).ok());  // wider than a warp
  EXPECT_TRUE(forward(64, 1, 8).ok());
  EXPECT_TRUE(attention_forward(buf.data(), lse.data(), buf.data(), 0, 4, 64, 1, nullptr).ok());
  EXPECT_TRUE(attention_backward(buf.data(), buf.data(), buf.data(), buf.data(), lse.data(),
                                 nullptr, 1, 0, 64, 1, nullptr)
                  .ok());
}

}  // namespace
}  // namespace troupe::kernels::cuda
