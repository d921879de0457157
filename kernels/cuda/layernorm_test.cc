#include "layernorm.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_test_util.h"
#include "kernel_cases.h"
#include "test_util.h"
#include "troupe/kernels/layernorm.h"
#include "troupe/kernels/residual.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomVector;
using testing::ExpectClose;
using testing::ExpectWithinOneBf16Ulp;
using testing::ToBf16;
using testing::ToDouble;
// kernel_cases.h
using testing::Activations;
using testing::Around1;
using testing::LayerNormBackwardData;
using testing::LayerNormRef;
using testing::MakeLayerNormBackward;
using testing::SameBits;
using testing::ToD;
using testing::ToF;

class LayerNormCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(LayerNormCudaTest);

// Scratch full of NaN: the backward must not depend on what it holds on entry.
std::vector<float> Scratch(int64_t n, int64_t c, int max_blocks) {
  return std::vector<float>(layernorm_backward_scratch_floats(n, c, max_blocks),
                            std::numeric_limits<float>::quiet_NaN());
}

struct Shape {
  int64_t n, c;
};
constexpr Shape kForwardShapes[] = {{1, 1}, {3, 3}, {5, 37}, {33, 100}, {4, 768}};

TEST_P(LayerNormCudaTest, ResidualFp32MatchesTheCpuReference) {
  for (int64_t n : {1, 31, 257, 1000}) {
    for (int block : {32, 96, 256}) {
      const auto a = RandomVector(n, n + 1), b = RandomVector(n, n + 2);
      const auto dout = RandomVector(n, n + 3), da0 = RandomVector(n, n + 4),
                 db0 = RandomVector(n, n + 5);
      std::vector<double> out_ref(n), da_ref = da0, db_ref = db0, dab_ref = da0;
      ResidualForward<double>(out_ref.data(), a.data(), b.data(), n);
      ResidualBackward<double>(da_ref.data(), db_ref.data(), dout.data(), n);
      ResidualBackward<double>(dab_ref.data(), dab_ref.data(), dout.data(), n);

      const auto a_f = ToF(a), b_f = ToF(b), dout_f = ToF(dout);
      std::vector<float> out(n), da = ToF(da0), db = ToF(db0), dab = ToF(da0);
      ASSERT_TRUE(residual_forward(out.data(), a_f.data(), b_f.data(), n, nullptr, block).ok());
      ASSERT_TRUE(residual_backward(da.data(), db.data(), dout_f.data(), n, nullptr, block).ok());
      // da and db the same buffer: it receives dout twice.
      ASSERT_TRUE(residual_backward(dab.data(), dab.data(), dout_f.data(), n, nullptr, block).ok());
      ExpectClose(out, out_ref, 1e-5, "out", /*floor=*/1.0);  // sums of O(1) values
      ExpectClose(da, da_ref, 1e-5, "da", 1.0);
      ExpectClose(db, db_ref, 1e-5, "db", 1.0);
      ExpectClose(dab, dab_ref, 1e-5, "da = db", 1.0);
    }
  }
}

TEST_P(LayerNormCudaTest, ResidualBf16IsWithinOneUlpOfTheRoundedReference) {
  const int64_t n = 1001;
  const auto a_b = ToBf16(RandomVector(n, 1)), b_b = ToBf16(RandomVector(n, 2));
  const auto dout_b = ToBf16(RandomVector(n, 3)), da0_b = ToBf16(RandomVector(n, 4)),
             db0_b = ToBf16(RandomVector(n, 5));
  const auto a = ToDouble(a_b), b = ToDouble(b_b), dout = ToDouble(dout_b);
  std::vector<double> out_ref(n), da_ref = ToDouble(da0_b), db_ref = ToDouble(db0_b);
  ResidualForward<double>(out_ref.data(), a.data(), b.data(), n);
  ResidualBackward<double>(da_ref.data(), db_ref.data(), dout.data(), n);

  std::vector<__nv_bfloat16> out(n), da = da0_b, db = db0_b;
  ASSERT_TRUE(residual_forward(out.data(), a_b.data(), b_b.data(), n, nullptr).ok());
  ASSERT_TRUE(residual_backward(da.data(), db.data(), dout_b.data(), n, nullptr).ok());
  ExpectWithinOneBf16Ulp(out, out_ref, "out");
  ExpectWithinOneBf16Ulp(da, da_ref, "da");
  ExpectWithinOneBf16Ulp(db, db_ref, "db");
}

TEST_P(LayerNormCudaTest, ForwardAndFusedFp32MatchTheCpuReference) {
  for (const Shape sh : kForwardShapes) {
    const int64_t n = sh.n, c = sh.c;
    for (int block : {32, 96, 256}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " c " << c << " block " << block);
      const auto x = Activations(n * c, c + 1), w = Around1(c, c + 2), b = RandomVector(c, c + 3);
      const auto ref = LayerNormRef(x, w, b, n, c);
      const auto x_f = ToF(x), w_f = ToF(w), b_f = ToF(b);
      std::vector<float> out(n * c), mean(n), rstd(n);
      ASSERT_TRUE(layernorm_forward(out.data(), mean.data(), rstd.data(), x_f.data(), w_f.data(),
                                    b_f.data(), n, c, nullptr, block)
                      .ok());
      // out = norm·w + b: sums of O(1) terms, so the error is judged against 1 where they cancel.
      ExpectClose(out, ref.out, 1e-5, "out", /*floor=*/1.0);
      ExpectClose(mean, ref.mean, 1e-5, "mean", 1.0);
      ExpectClose(rstd, ref.rstd, 1e-5, "rstd");

      // Fused: residual = inp1 + inp2, then the same LayerNorm of it, bit for bit.
      const auto inp1 = Activations(n * c, c + 4), inp2 = RandomVector(n * c, c + 5);
      std::vector<double> res_ref(n * c);
      ResidualForward<double>(res_ref.data(), inp1.data(), inp2.data(), n * c);
      const auto fused_ref = LayerNormRef(res_ref, w, b, n, c);
      const auto inp1_f = ToF(inp1), inp2_f = ToF(inp2);
      std::vector<float> res(n * c), out2(n * c), mean2(n), rstd2(n);
      ASSERT_TRUE(fused_residual_layernorm_forward(res.data(), out2.data(), mean2.data(),
                                                   rstd2.data(), inp1_f.data(), inp2_f.data(),
                                                   w_f.data(), b_f.data(), n, c, nullptr, block)
                      .ok());
      ExpectClose(res, res_ref, 1e-5, "residual", 1.0);
      ExpectClose(out2, fused_ref.out, 1e-5, "fused out", 1.0);
      ExpectClose(mean2, fused_ref.mean, 1e-5, "fused mean", 1.0);
      ExpectClose(rstd2, fused_ref.rstd, 1e-5, "fused rstd");

      std::vector<float> res3(n * c), out3(n * c), mean3(n), rstd3(n);
      ASSERT_TRUE(residual_forward(res3.data(), inp1_f.data(), inp2_f.data(), n * c, nullptr).ok());
      ASSERT_TRUE(layernorm_forward(out3.data(), mean3.data(), rstd3.data(), res3.data(),
                                    w_f.data(), b_f.data(), n, c, nullptr, block)
                      .ok());
      EXPECT_TRUE(SameBits(res, res3) && SameBits(out2, out3) && SameBits(mean2, mean3) &&
                  SameBits(rstd2, rstd3))
          << "fused differs from residual_forward + layernorm_forward";

      // In place: the residual stream updated over inp1.
      std::vector<float> inplace = inp1_f, out4(n * c), mean4(n), rstd4(n);
      ASSERT_TRUE(fused_residual_layernorm_forward(inplace.data(), out4.data(), mean4.data(),
                                                   rstd4.data(), inplace.data(), inp2_f.data(),
                                                   w_f.data(), b_f.data(), n, c, nullptr, block)
                      .ok());
      EXPECT_TRUE(SameBits(inplace, res) && SameBits(out4, out2)) << "in place";
    }
  }
}

TEST_P(LayerNormCudaTest, ForwardAndFusedBf16AreWithinOneUlpOfTheRoundedReference) {
  for (const Shape sh : {Shape{7, 37}, Shape{3, 768}}) {
    const int64_t n = sh.n, c = sh.c;
    SCOPED_TRACE(::testing::Message() << "n " << n << " c " << c);
    const auto x_b = ToBf16(Activations(n * c, 11)), w_b = ToBf16(Around1(c, 12)),
               b_b = ToBf16(RandomVector(c, 13));
    const auto ref = LayerNormRef(ToDouble(x_b), ToDouble(w_b), ToDouble(b_b), n, c);
    std::vector<__nv_bfloat16> out(n * c);
    std::vector<float> mean(n), rstd(n);
    ASSERT_TRUE(layernorm_forward(out.data(), mean.data(), rstd.data(), x_b.data(), w_b.data(),
                                  b_b.data(), n, c, nullptr, 64)
                    .ok());
    ExpectWithinOneBf16Ulp(out, ref.out, "out");
    ExpectClose(mean, ref.mean, 1e-5, "mean", 1.0);
    ExpectClose(rstd, ref.rstd, 1e-5, "rstd");

    // The residual is one rounding of an exact float sum; the LayerNorm then normalises that
    // stored bf16 residual, so the reference starts from it too.
    const auto in1_b = ToBf16(Activations(n * c, 14)), in2_b = ToBf16(RandomVector(n * c, 15));
    std::vector<double> res_ref(n * c);
    const auto in1 = ToDouble(in1_b), in2 = ToDouble(in2_b);
    ResidualForward<double>(res_ref.data(), in1.data(), in2.data(), n * c);
    const auto fused_ref =
        LayerNormRef(ToDouble(ToBf16(res_ref)), ToDouble(w_b), ToDouble(b_b), n, c);
    std::vector<__nv_bfloat16> res(n * c), out2(n * c);
    ASSERT_TRUE(fused_residual_layernorm_forward(res.data(), out2.data(), mean.data(), rstd.data(),
                                                 in1_b.data(), in2_b.data(), w_b.data(), b_b.data(),
                                                 n, c, nullptr)
                    .ok());
    EXPECT_TRUE(SameBits(res, ToBf16(res_ref))) << "residual is not a+b rounded once";
    ExpectWithinOneBf16Ulp(out2, fused_ref.out, "fused out");
    ExpectClose(mean, fused_ref.mean, 1e-5, "fused mean", 1.0);
    ExpectClose(rstd, fused_ref.rstd, 1e-5, "fused rstd");
  }
}

struct BackwardCase {
  int64_t n, c;
  int block, max_blocks;  // max_blocks < n: several rows per block
};
constexpr BackwardCase kBackwardCases[] = {{1, 1, 32, 512}, {3, 3, 32, 2},    {5, 37, 64, 512},
                                           {37, 37, 96, 4}, {9, 300, 256, 3}, {2, 768, 256, 512},
                                           {40, 5, 32, 512}};

struct BackwardRef {
  std::vector<double> dinp, dw, db;
};

BackwardRef LayerNormBackwardRef(const LayerNormBackwardData& d, int64_t n, int64_t c) {
  BackwardRef r{d.dinp0, d.dw0, d.db0};
  LayerNormBackward<double>(r.dinp.data(), r.dw.data(), r.db.data(), d.dout.data(), d.x.data(),
                            d.w.data(), d.mean.data(), d.rstd.data(), n, c);
  return r;
}

TEST_P(LayerNormCudaTest, BackwardFp32MatchesTheCpuReference) {
  for (const BackwardCase k : kBackwardCases) {
    const int64_t n = k.n, c = k.c;
    SCOPED_TRACE(::testing::Message() << "n " << n << " c " << c << " block " << k.block
                                      << " max_blocks " << k.max_blocks);
    const auto d = MakeLayerNormBackward(n, c, n * 100 + c);
    const auto ref = LayerNormBackwardRef(d, n, c);
    const auto dout = ToF(d.dout), x = ToF(d.x), w = ToF(d.w), mean = ToF(d.mean),
               rstd = ToF(d.rstd);
    auto dinp = ToF(d.dinp0), dw = ToF(d.dw0), db = ToF(d.db0);
    auto scratch = Scratch(n, c, k.max_blocks);
    ASSERT_TRUE(layernorm_backward(dinp.data(), dw.data(), db.data(), scratch.data(), dout.data(),
                                   x.data(), w.data(), mean.data(), rstd.data(), n, c, nullptr,
                                   k.block, k.max_blocks)
                    .ok());
    // All three accumulate onto O(1) values; dw and db sum n terms of O(1).
    ExpectClose(dinp, ref.dinp, 1e-5, "dinp", /*floor=*/1.0);
    ExpectClose(dw, ref.dw, 1e-5, "dweight", 1.0);
    ExpectClose(db, ref.db, 1e-5, "dbias", 1.0);
  }
}

TEST_P(LayerNormCudaTest, BackwardBf16IsWithinOneUlpOfTheRoundedReference) {
  // Each bf16 output is one rounding of a float computation: dinp + dx, dweight + Σ, dbias + Σ.
  for (const BackwardCase k : {BackwardCase{13, 37, 64, 5}, BackwardCase{3, 768, 256, 512}}) {
    const int64_t n = k.n, c = k.c;
    SCOPED_TRACE(::testing::Message() << "n " << n << " c " << c);
    const auto d0 = MakeLayerNormBackward(n, c, 77);
    const auto dout_b = ToBf16(d0.dout), x_b = ToBf16(d0.x), w_b = ToBf16(d0.w),
               dinp0_b = ToBf16(d0.dinp0), dw0_b = ToBf16(d0.dw0), db0_b = ToBf16(d0.db0);
    LayerNormBackwardData d = d0;  // the reference starts from the same bf16 values
    d.dout = ToDouble(dout_b), d.x = ToDouble(x_b), d.w = ToDouble(w_b);
    d.dinp0 = ToDouble(dinp0_b), d.dw0 = ToDouble(dw0_b), d.db0 = ToDouble(db0_b);
    const auto ref = LayerNormBackwardRef(d, n, c);
    const auto mean = ToF(d.mean), rstd = ToF(d.rstd);
    auto dinp = dinp0_b, dw = dw0_b, db = db0_b;
    auto scratch = Scratch(n, c, k.max_blocks);
    ASSERT_TRUE(layernorm_backward(dinp.data(), dw.data(), db.data(), scratch.data(), dout_b.data(),
                                   x_b.data(), w_b.data(), mean.data(), rstd.data(), n, c, nullptr,
                                   k.block, k.max_blocks)
                    .ok());
    ExpectWithinOneBf16Ulp(dinp, ref.dinp, "dinp");
    ExpectWithinOneBf16Ulp(dw, ref.dw, "dweight");
    ExpectWithinOneBf16Ulp(db, ref.db, "dbias");
  }
}

// Past kLayerNormBackwardMaxSharedC the running sums live in scratch, not shared memory. One
// schedule: the sum kernel's ~400 blocks make this the slowest case.
TEST(LayerNormCudaLargeC, BackwardFp32WithSumsInScratch) {
  const int64_t n = 3, c = kLayerNormBackwardMaxSharedC + 5;
  const int max_blocks = 2;
  const auto d = MakeLayerNormBackward(n, c, 5);
  const auto ref = LayerNormBackwardRef(d, n, c);
  const auto dout = ToF(d.dout), x = ToF(d.x), w = ToF(d.w), mean = ToF(d.mean), rstd = ToF(d.rstd);
  auto dinp = ToF(d.dinp0), dw = ToF(d.dw0), db = ToF(d.db0);
  auto scratch = Scratch(n, c, max_blocks);
  ASSERT_TRUE(layernorm_backward(dinp.data(), dw.data(), db.data(), scratch.data(), dout.data(),
                                 x.data(), w.data(), mean.data(), rstd.data(), n, c, nullptr,
                                 kLayerNormBackwardBlock, max_blocks)
                  .ok());
  ExpectClose(dinp, ref.dinp, 1e-5, "dinp", 1.0);
  ExpectClose(dw, ref.dw, 1e-5, "dweight", 1.0);
  ExpectClose(db, ref.db, 1e-5, "dbias", 1.0);
}

// Every output, fp32 and bf16, bit-identical under the three schedules (no order-dependent
// accumulation anywhere).
template <typename Tx>
std::vector<std::vector<unsigned char>> RunAll(simt::Schedule schedule) {
  simt::ScopedSchedule scoped(schedule, /*seed=*/3);
  const int64_t n = 23, c = 45;
  const int max_blocks = 4;
  auto conv = [](const std::vector<double>& v) {
    std::vector<Tx> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = FromFloat<Tx>(static_cast<float>(v[i]));
    return out;
  };
  const auto d = MakeLayerNormBackward(n, c, 9);
  const auto in1 = conv(d.x), in2 = conv(RandomVector(n * c, 10)), w = conv(d.w),
             b = conv(RandomVector(c, 11)), dout = conv(d.dout);
  std::vector<Tx> res(n * c), out(n * c), dinp = conv(d.dinp0), dw = conv(d.dw0), db = conv(d.db0);
  std::vector<float> mean(n), rstd(n);
  auto scratch = Scratch(n, c, max_blocks);
  EXPECT_TRUE(fused_residual_layernorm_forward(res.data(), out.data(), mean.data(), rstd.data(),
                                               in1.data(), in2.data(), w.data(), b.data(), n, c,
                                               nullptr, 64)
                  .ok());
  EXPECT_TRUE(layernorm_backward(dinp.data(), dw.data(), db.data(), scratch.data(), dout.data(),
                                 res.data(), w.data(), mean.data(), rstd.data(), n, c, nullptr, 64,
                                 max_blocks)
                  .ok());
  EXPECT_TRUE(residual_backward(dinp.data(), dinp.data(), dout.data(), n * c, nullptr, 64).ok());
  std::vector<std::vector<unsigned char>> all;
  auto add = [&all](const auto& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    all.emplace_back(p, p + v.size() * sizeof(v[0]));
  };
  add(res), add(out), add(mean), add(rstd), add(dinp), add(dw), add(db);
  return all;
}

TEST(LayerNormCudaDeterminism, BitIdenticalAcrossSchedules) {
  const auto f = RunAll<float>(simt::Schedule::kForward);
  const auto h = RunAll<__nv_bfloat16>(simt::Schedule::kForward);
  for (simt::Schedule s : {simt::Schedule::kReverse, simt::Schedule::kShuffled}) {
    EXPECT_EQ(f, RunAll<float>(s)) << "fp32, " << simt::ScheduleName(s);
    EXPECT_EQ(h, RunAll<__nv_bfloat16>(s)) << "bf16, " << simt::ScheduleName(s);
  }
}

TEST(LayerNormCudaArguments, RejectsBadShapesAndBlocks) {
  std::vector<float> buf(64), mean(2), rstd(2), scratch(64);
  const float* in = buf.data();
  EXPECT_EQ(
      layernorm_forward(buf.data(), mean.data(), rstd.data(), in, in, in, 2, 4, nullptr, 48).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      layernorm_forward(buf.data(), mean.data(), rstd.data(), in, in, in, 2, 0, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(layernorm_backward(buf.data(), buf.data(), buf.data(), scratch.data(), in, in, in,
                               mean.data(), rstd.data(), 2, 4, nullptr, 2048)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // No rows: nothing to do.
  EXPECT_TRUE(
      layernorm_forward(buf.data(), mean.data(), rstd.data(), in, in, in, 0, 4, nullptr).ok());
}

}  // namespace
}  // namespace troupe::kernels::cuda
