// Every CUDA kernel of kernels/cuda/*.cuh compiled by nvcc and run on a real GPU (label gpu):
// embedding, residual, LayerNorm (and fused residual + LayerNorm), GELU, attention, cross-entropy,
// AdamW and the gradient-norm chunk sums, forward and backward, fp32 and bf16, against the CPU
// reference (troupe::kernels) with the shapes and tolerances of the SIMT tests (<op>_test.cc),
// plus GPT-2 small shapes (C = 768, T = 1024, NH = 12, V = 50257, 124M parameters) that the SIMT
// layer is too slow for. Every case runs twice, on fresh device buffers, and every output must be
// bit-identical between the two runs. Without a usable GPU every test skips naming the CUDA error;
// scripts/gpu-check runs it, also under compute-sanitizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "adamw.cuh"
#include "attention.cuh"
#include "bf16_test_util.h"
#include "crossentropy.cuh"
#include "embedding.cuh"
#include "gelu.cuh"
#include "gpu_test_util.h"
#include "kernel_cases.h"
#include "layernorm.cuh"
#include "norm.cuh"
#include "test_util.h"
#include "troupe/kernels/adamw.h"
#include "troupe/kernels/attention.h"
#include "troupe/kernels/crossentropy.h"
#include "troupe/kernels/embedding.h"
#include "troupe/kernels/gelu.h"
#include "troupe/kernels/layernorm.h"
#include "troupe/kernels/norm.h"
#include "troupe/kernels/parallel.h"
#include "troupe/kernels/residual.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomTokens;
using kernels::testing::RandomVector;
using testing::DeviceBuffers;
using testing::ExpectClose;
using testing::RunTwice;
using testing::ToBf16;
using testing::ToDouble;
// kernel_cases.h
using testing::Abs;
using testing::Activations;
using testing::AdamWScalarSets;
using testing::Around1;
using testing::AttentionReference;
using testing::AttentionShape;
using testing::BackwardFromOut;
using testing::ComputeAttentionReference;
using testing::EmbeddingBf16Case;
using testing::EmbeddingFp32Case;
using testing::EmbeddingShape;
using testing::ExpectBackwardFromOutIsTheCpuGradient;
using testing::ExpectChunkSumsMatch;
using testing::ExpectEmbeddingFp32Matches;
using testing::ExpectSameBits;
using testing::ExpectWithinRoundingBound;
using testing::kAttentionShapes;
using testing::kEmbeddingShapes;
using testing::LayerNormBackwardData;
using testing::LayerNormRef;
using testing::LayerNormRefOut;
using testing::MakeEmbeddingBf16Case;
using testing::MakeEmbeddingFp32Case;
using testing::MakeLayerNormBackward;
using testing::SameBits;
using testing::SpreadFloats;
using testing::ToD;
using testing::ToF;
using bf16 = __nv_bfloat16;

// GPT-2 small. Batches of 4 sequences (2 for attention, 256 rows for cross-entropy) keep the
// double-precision CPU references at a few seconds.
constexpr int64_t kGpt2B = 4, kGpt2T = 1024, kGpt2C = 768, kGpt2NH = 12, kGpt2V = 50257;
constexpr int64_t kGpt2Params = 124439808;

// Skips without a usable GPU. The CPU references use every core: their results do not depend on
// the thread count (parallel.h).
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_SKIP_WITHOUT_GPU();
    SetNumThreads(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)));
  }
  void TearDown() override { SetNumThreads(1); }
};

// float or bf16 storage of double values (one rounding), and back.
template <typename Tx>
std::vector<Tx> ToTx(const std::vector<double>& v) {
  if constexpr (std::is_same_v<Tx, float>) {
    return ToF(v);
  } else {
    return ToBf16(v);
  }
}

template <typename Tx>
std::vector<double> AsDouble(const std::vector<Tx>& v) {
  if constexpr (std::is_same_v<Tx, float>) {
    return ToD(v);
  } else {
    return ToDouble(v);
  }
}

// A bf16 output that is one rounding of a float computation: within 1 bf16 ulp of the double
// reference (from the same bf16 inputs) rounded to bf16, as in the SIMT tests, except where the
// output cancels far below the size of its terms (`floor`, the fp32 checks' floor): there the
// float computation before the rounding is itself off by ~1e-7 of the terms, many bf16 ulps of
// the output, and the fp32 bound applies instead, |got − ref| <= 1e-5 · max(|ref|, floor). The
// SIMT tests' few thousand elements never cancel that deeply; GPT-2-sized outputs do (GELU's dinp
// 5.7e-7 from O(1) terms came out 7.7e-7 through the SIMT layer: 56 ulps, an error of 2e-7).
void ExpectBf16Close(const std::vector<bf16>& got, const std::vector<double>& ref, const char* what,
                     double floor) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t ulps =
        testing::Bf16UlpDistance(got[i], __float2bfloat16(static_cast<float>(ref[i])));
    const double err = std::fabs(__bfloat162float(got[i]) - ref[i]);
    if (ulps <= 1 || err <= 1e-5 * std::fmax(std::fabs(ref[i]), floor)) continue;
    ADD_FAILURE() << what << ": element " << i << " is " << __bfloat162float(got[i])
                  << ", reference " << ref[i] << " (" << ulps << " bf16 ulps, error " << err
                  << ", floor " << floor << ")";
    return;
  }
}

// The floor of a sum over n rows of O(1) terms of random sign (LayerNorm's dweight and dbias): the
// partial sums, and with them the float rounding error, grow like sqrt(n); 1 up to n = 64 (the
// SIMT tests' sizes).
double RowSumFloor(int64_t n) { return std::max(1.0, std::sqrt(static_cast<double>(n)) / 8); }

// ---- GELU (gelu_test.cc) -------------------------------------------------------------------

// out = gelu(inp) and dinp0 + gelu'(inp) · dout.
template <typename Tx>
absl::StatusOr<std::tuple<std::vector<Tx>, std::vector<Tx>>> GeluOnGpu(const std::vector<Tx>& inp,
                                                                       const std::vector<Tx>& dout,
                                                                       const std::vector<Tx>& dinp0,
                                                                       int block) {
  return RunTwice([&](DeviceBuffers& d) {
    const int64_t n = static_cast<int64_t>(inp.size());
    const Tx* inp_d = d.Upload(inp);
    const Tx* dout_d = d.Upload(dout);
    Tx* dinp_d = d.Upload(dinp0);
    Tx* out_d = d.Alloc<Tx>(n);
    d.Launch([&] { return gelu_forward(out_d, inp_d, n, nullptr, block); });
    d.Launch([&] { return gelu_backward(dinp_d, inp_d, dout_d, n, nullptr, block); });
    auto out = d.Download(out_d);
    auto dinp = d.Download(dinp_d);
    return std::make_tuple(std::move(out), std::move(dinp));
  });
}

void CheckGeluFp32(int64_t n, std::initializer_list<int> blocks) {
  const auto inp = RandomVector(n, n + 1, 4.0), dout = RandomVector(n, n + 2);
  const auto dinp0 = RandomVector(n, n + 3);
  std::vector<double> out_ref(n), dinp_ref = dinp0;
  GeluForward<double>(out_ref.data(), inp.data(), n);
  GeluBackward<double>(dinp_ref.data(), inp.data(), dout.data(), n);
  for (int block : blocks) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " block=" << block);
    const auto r = GeluOnGpu(ToF(inp), ToF(dout), ToF(dinp0), block);
    ASSERT_TRUE(r.ok()) << r.status();
    const auto& [out, dinp] = *r;
    ExpectClose(out, out_ref, 1e-5, "out");
    ExpectClose(dinp, dinp_ref, 1e-5, "dinp", /*floor=*/1.0);  // accumulated onto O(1) values
  }
}

void CheckGeluBf16(int64_t n) {
  SCOPED_TRACE(::testing::Message() << "n=" << n);
  const auto inp_b = ToBf16(RandomVector(n, 5, 4.0)), dout_b = ToBf16(RandomVector(n, 6));
  const auto dinp0_b = ToBf16(RandomVector(n, 7));
  // The reference starts from the same bf16 values, in double.
  const auto inp = ToDouble(inp_b), dout = ToDouble(dout_b);
  std::vector<double> out_ref(n), dinp_ref = ToDouble(dinp0_b);
  GeluForward<double>(out_ref.data(), inp.data(), n);
  GeluBackward<double>(dinp_ref.data(), inp.data(), dout.data(), n);
  const auto r = GeluOnGpu(inp_b, dout_b, dinp0_b, kGeluBlock);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& [out, dinp] = *r;
  ExpectBf16Close(out, out_ref, "out", /*floor=*/1e-3);
  ExpectBf16Close(dinp, dinp_ref, "dinp", /*floor=*/1.0);
}

class GeluGpuTest : public GpuTest {};

TEST_F(GeluGpuTest, Fp32MatchesTheCpuReference) {
  for (int64_t n : {1, 31, 257, 5000}) CheckGeluFp32(n, {32, 96, 256});
}

TEST_F(GeluGpuTest, Bf16IsWithinOneUlpOfTheRoundedReference) { CheckGeluBf16(3001); }

TEST_F(GeluGpuTest, Gpt2MlpActivations) {
  const int64_t n = kGpt2B * kGpt2T * 4 * kGpt2C;
  CheckGeluFp32(n, {kGeluBlock});
  CheckGeluBf16(n);
}

// ---- Residual (layernorm_test.cc) ----------------------------------------------------------

// out = a + b; da0 + dout, db0 + dout; and dab0 + 2·dout (da and db the same buffer).
template <typename Tx>
absl::StatusOr<std::tuple<std::vector<Tx>, std::vector<Tx>, std::vector<Tx>, std::vector<Tx>>>
ResidualOnGpu(const std::vector<Tx>& a, const std::vector<Tx>& b, const std::vector<Tx>& dout,
              const std::vector<Tx>& da0, const std::vector<Tx>& db0, int block) {
  return RunTwice([&](DeviceBuffers& d) {
    const int64_t n = static_cast<int64_t>(a.size());
    const Tx* a_d = d.Upload(a);
    const Tx* b_d = d.Upload(b);
    const Tx* dout_d = d.Upload(dout);
    Tx* da_d = d.Upload(da0);
    Tx* db_d = d.Upload(db0);
    Tx* dab_d = d.Upload(da0);
    Tx* out_d = d.Alloc<Tx>(n);
    d.Launch([&] { return residual_forward(out_d, a_d, b_d, n, nullptr, block); });
    d.Launch([&] { return residual_backward(da_d, db_d, dout_d, n, nullptr, block); });
    d.Launch([&] { return residual_backward(dab_d, dab_d, dout_d, n, nullptr, block); });
    auto out = d.Download(out_d);
    auto da = d.Download(da_d);
    auto db = d.Download(db_d);
    auto dab = d.Download(dab_d);
    return std::make_tuple(std::move(out), std::move(da), std::move(db), std::move(dab));
  });
}

template <typename Tx>
void CheckResidual(int64_t n, std::initializer_list<int> blocks) {
  constexpr bool kFp32 = std::is_same_v<Tx, float>;
  // The reference starts from the inputs as stored (rounded to Tx), in double.
  const auto a = AsDouble(ToTx<Tx>(RandomVector(n, n + 1))),
             b = AsDouble(ToTx<Tx>(RandomVector(n, n + 2)));
  const auto dout = AsDouble(ToTx<Tx>(RandomVector(n, n + 3))),
             da0 = AsDouble(ToTx<Tx>(RandomVector(n, n + 4))),
             db0 = AsDouble(ToTx<Tx>(RandomVector(n, n + 5)));
  std::vector<double> out_ref(n), da_ref = da0, db_ref = db0, dab_ref = da0;
  ResidualForward<double>(out_ref.data(), a.data(), b.data(), n);
  ResidualBackward<double>(da_ref.data(), db_ref.data(), dout.data(), n);
  ResidualBackward<double>(dab_ref.data(), dab_ref.data(), dout.data(), n);
  for (int block : blocks) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " block=" << block << " fp32=" << kFp32);
    const auto r = ResidualOnGpu(ToTx<Tx>(a), ToTx<Tx>(b), ToTx<Tx>(dout), ToTx<Tx>(da0),
                                 ToTx<Tx>(db0), block);
    ASSERT_TRUE(r.ok()) << r.status();
    const auto& [out, da, db, dab] = *r;
    if constexpr (kFp32) {
      ExpectClose(out, out_ref, 1e-5, "out", /*floor=*/1.0);  // sums of O(1) values
      ExpectClose(da, da_ref, 1e-5, "da", 1.0);
      ExpectClose(db, db_ref, 1e-5, "db", 1.0);
      ExpectClose(dab, dab_ref, 1e-5, "da = db", 1.0);
    } else {
      ExpectBf16Close(out, out_ref, "out", /*floor=*/1.0);
      ExpectBf16Close(da, da_ref, "da", 1.0);
      ExpectBf16Close(db, db_ref, "db", 1.0);
      // da = db: two roundings (dab0 + dout, then + dout again), which can be far apart in ulps of
      // the result where dab0 and 2·dout cancel: the same two steps replayed on the host instead.
      std::vector<bf16> dab_replay = ToBf16(da0);
      for (int64_t i = 0; i < n; ++i) {
        const float g = static_cast<float>(dout[i]);
        for (int k = 0; k < 2; ++k) {
          dab_replay[i] = __float2bfloat16(__bfloat162float(dab_replay[i]) + g);
        }
      }
      EXPECT_TRUE(SameBits(dab, dab_replay)) << "da = db";
    }
  }
}

class ResidualGpuTest : public GpuTest {};

TEST_F(ResidualGpuTest, Fp32MatchesTheCpuReference) {
  for (int64_t n : {1, 31, 257, 1000}) CheckResidual<float>(n, {32, 96, 256});
}

TEST_F(ResidualGpuTest, Bf16IsWithinOneUlpOfTheRoundedReference) {
  CheckResidual<bf16>(1001, {kResidualBlock});
}

TEST_F(ResidualGpuTest, Gpt2ResidualStream) {
  const int64_t n = kGpt2B * kGpt2T * kGpt2C;
  CheckResidual<float>(n, {kResidualBlock});
  CheckResidual<bf16>(n, {kResidualBlock});
}

// ---- LayerNorm forward, fused residual + LayerNorm (layernorm_test.cc) ---------------------

template <typename Tx>
struct LayerNormForwardGpuOut {
  std::vector<Tx> out;  // layernorm_forward(x)
  std::vector<float> mean, rstd;
  std::vector<Tx> res, out2;  // fused_residual_layernorm_forward(inp1, inp2)
  std::vector<float> mean2, rstd2;
  std::vector<Tx> res3, out3;  // residual_forward then layernorm_forward
  std::vector<float> mean3, rstd3;
  std::vector<Tx> inplace, out4;  // fused, residual written over inp1
};

template <typename Tx>
absl::StatusOr<LayerNormForwardGpuOut<Tx>> LayerNormForwardOnGpu(
    const std::vector<Tx>& x, const std::vector<Tx>& w, const std::vector<Tx>& b,
    const std::vector<Tx>& inp1, const std::vector<Tx>& inp2, int64_t n, int64_t c, int block) {
  return RunTwice([&](DeviceBuffers& d) {
    const Tx* x_d = d.Upload(x);
    const Tx* w_d = d.Upload(w);
    const Tx* b_d = d.Upload(b);
    const Tx* inp1_d = d.Upload(inp1);
    const Tx* inp2_d = d.Upload(inp2);
    Tx* inplace_d = d.Upload(inp1);
    Tx* out_d = d.Alloc<Tx>(n * c);
    Tx* res_d = d.Alloc<Tx>(n * c);
    Tx* out2_d = d.Alloc<Tx>(n * c);
    Tx* res3_d = d.Alloc<Tx>(n * c);
    Tx* out3_d = d.Alloc<Tx>(n * c);
    Tx* out4_d = d.Alloc<Tx>(n * c);
    float* mean_d = d.Alloc<float>(n);
    float* rstd_d = d.Alloc<float>(n);
    float* mean2_d = d.Alloc<float>(n);
    float* rstd2_d = d.Alloc<float>(n);
    float* mean3_d = d.Alloc<float>(n);
    float* rstd3_d = d.Alloc<float>(n);
    float* mean4_d = d.Alloc<float>(n);
    float* rstd4_d = d.Alloc<float>(n);
    d.Launch([&] {
      return layernorm_forward(out_d, mean_d, rstd_d, x_d, w_d, b_d, n, c, nullptr, block);
    });
    d.Launch([&] {
      return fused_residual_layernorm_forward(res_d, out2_d, mean2_d, rstd2_d, inp1_d, inp2_d, w_d,
                                              b_d, n, c, nullptr, block);
    });
    d.Launch([&] { return residual_forward(res3_d, inp1_d, inp2_d, n * c, nullptr); });
    d.Launch([&] {
      return layernorm_forward(out3_d, mean3_d, rstd3_d, res3_d, w_d, b_d, n, c, nullptr, block);
    });
    d.Launch([&] {
      return fused_residual_layernorm_forward(inplace_d, out4_d, mean4_d, rstd4_d, inplace_d,
                                              inp2_d, w_d, b_d, n, c, nullptr, block);
    });
    LayerNormForwardGpuOut<Tx> o;
    o.out = d.Download(out_d);
    o.mean = d.Download(mean_d);
    o.rstd = d.Download(rstd_d);
    o.res = d.Download(res_d);
    o.out2 = d.Download(out2_d);
    o.mean2 = d.Download(mean2_d);
    o.rstd2 = d.Download(rstd2_d);
    o.res3 = d.Download(res3_d);
    o.out3 = d.Download(out3_d);
    o.mean3 = d.Download(mean3_d);
    o.rstd3 = d.Download(rstd3_d);
    o.inplace = d.Download(inplace_d);
    o.out4 = d.Download(out4_d);
    return o;
  });
}

template <typename Tx>
void CheckLayerNormForward(int64_t n, int64_t c, std::initializer_list<int> blocks, uint64_t seed) {
  constexpr bool kFp32 = std::is_same_v<Tx, float>;
  // The reference starts from the inputs as stored, in double.
  const auto x = ToTx<Tx>(Activations(n * c, seed)), w = ToTx<Tx>(Around1(c, seed + 1)),
             b = ToTx<Tx>(RandomVector(c, seed + 2));
  const auto inp1 = ToTx<Tx>(Activations(n * c, seed + 3)),
             inp2 = ToTx<Tx>(RandomVector(n * c, seed + 4));
  const auto ref = LayerNormRef(AsDouble(x), AsDouble(w), AsDouble(b), n, c);
  std::vector<double> res_ref(n * c);
  ResidualForward<double>(res_ref.data(), AsDouble(inp1).data(), AsDouble(inp2).data(), n * c);
  // The LayerNorm of the fused kernel normalises the residual as stored (rounded to Tx).
  const auto fused_ref = LayerNormRef(AsDouble(ToTx<Tx>(res_ref)), AsDouble(w), AsDouble(b), n, c);
  for (int block : blocks) {
    SCOPED_TRACE(::testing::Message()
                 << "n=" << n << " c=" << c << " block=" << block << " fp32=" << kFp32);
    const auto r = LayerNormForwardOnGpu(x, w, b, inp1, inp2, n, c, block);
    ASSERT_TRUE(r.ok()) << r.status();
    const LayerNormForwardGpuOut<Tx>& o = *r;
    if constexpr (kFp32) {
      // out = norm·w + b: sums of O(1) terms, so the error is judged against 1 where they cancel.
      ExpectClose(o.out, ref.out, 1e-5, "out", /*floor=*/1.0);
      ExpectClose(o.res, res_ref, 1e-5, "residual", 1.0);
      ExpectClose(o.out2, fused_ref.out, 1e-5, "fused out", 1.0);
    } else {
      ExpectBf16Close(o.out, ref.out, "out", /*floor=*/1.0);
      EXPECT_TRUE(SameBits(o.res, ToBf16(res_ref))) << "residual is not a+b rounded once";
      ExpectBf16Close(o.out2, fused_ref.out, "fused out", 1.0);
    }
    ExpectClose(o.mean, ref.mean, 1e-5, "mean", 1.0);
    ExpectClose(o.rstd, ref.rstd, 1e-5, "rstd");
    ExpectClose(o.mean2, fused_ref.mean, 1e-5, "fused mean", 1.0);
    ExpectClose(o.rstd2, fused_ref.rstd, 1e-5, "fused rstd");
    EXPECT_TRUE(SameBits(o.res, o.res3) && SameBits(o.out2, o.out3) && SameBits(o.mean2, o.mean3) &&
                SameBits(o.rstd2, o.rstd3))
        << "fused differs from residual_forward + layernorm_forward";
    EXPECT_TRUE(SameBits(o.inplace, o.res) && SameBits(o.out4, o.out2)) << "in place";
  }
}

class LayerNormGpuTest : public GpuTest {};

TEST_F(LayerNormGpuTest, ForwardAndFusedFp32MatchTheCpuReference) {
  for (const auto& [n, c] :
       {std::pair<int64_t, int64_t>{1, 1}, {3, 3}, {5, 37}, {33, 100}, {4, 768}}) {
    CheckLayerNormForward<float>(n, c, {32, 96, 256}, c + 1);
  }
}

TEST_F(LayerNormGpuTest, ForwardAndFusedBf16AreWithinOneUlpOfTheRoundedReference) {
  CheckLayerNormForward<bf16>(7, 37, {64, kLayerNormForwardBlock}, 11);
  CheckLayerNormForward<bf16>(3, 768, {64, kLayerNormForwardBlock}, 11);
}

TEST_F(LayerNormGpuTest, Gpt2ForwardAndFused) {
  CheckLayerNormForward<float>(kGpt2B * kGpt2T, kGpt2C, {kLayerNormForwardBlock}, 21);
  CheckLayerNormForward<bf16>(kGpt2B * kGpt2T, kGpt2C, {kLayerNormForwardBlock}, 22);
}

// ---- LayerNorm backward (layernorm_test.cc) ------------------------------------------------

// dinp0 + dinp, dw0 + dweight, db0 + dbias.
template <typename Tx>
absl::StatusOr<std::tuple<std::vector<Tx>, std::vector<Tx>, std::vector<Tx>>>
LayerNormBackwardOnGpu(const LayerNormBackwardData& data, int64_t n, int64_t c, int block,
                       int max_blocks) {
  const auto dout = ToTx<Tx>(data.dout), x = ToTx<Tx>(data.x), w = ToTx<Tx>(data.w);
  const auto dinp0 = ToTx<Tx>(data.dinp0), dw0 = ToTx<Tx>(data.dw0), db0 = ToTx<Tx>(data.db0);
  const auto mean = ToF(data.mean), rstd = ToF(data.rstd);
  return RunTwice([&](DeviceBuffers& d) {
    const Tx* dout_d = d.Upload(dout);
    const Tx* x_d = d.Upload(x);
    const Tx* w_d = d.Upload(w);
    const float* mean_d = d.Upload(mean);
    const float* rstd_d = d.Upload(rstd);
    Tx* dinp_d = d.Upload(dinp0);
    Tx* dw_d = d.Upload(dw0);
    Tx* db_d = d.Upload(db0);
    // Full of NaN (Alloc): the backward must not depend on what the scratch holds on entry.
    float* scratch_d = d.Alloc<float>(layernorm_backward_scratch_floats(n, c, max_blocks));
    d.Launch([&] {
      return layernorm_backward(dinp_d, dw_d, db_d, scratch_d, dout_d, x_d, w_d, mean_d, rstd_d, n,
                                c, nullptr, block, max_blocks);
    });
    auto dinp = d.Download(dinp_d);
    auto dw = d.Download(dw_d);
    auto db = d.Download(db_d);
    return std::make_tuple(std::move(dinp), std::move(dw), std::move(db));
  });
}

template <typename Tx>
void CheckLayerNormBackward(int64_t n, int64_t c, int block, int max_blocks, uint64_t seed) {
  constexpr bool kFp32 = std::is_same_v<Tx, float>;
  SCOPED_TRACE(::testing::Message() << "n=" << n << " c=" << c << " block=" << block
                                    << " max_blocks=" << max_blocks << " fp32=" << kFp32);
  LayerNormBackwardData d = MakeLayerNormBackward(n, c, seed);
  // The reference starts from the values as stored (mean and rstd are float either way).
  for (auto* v : {&d.dout, &d.x, &d.w, &d.dinp0, &d.dw0, &d.db0}) *v = AsDouble(ToTx<Tx>(*v));
  std::vector<double> dinp_ref = d.dinp0, dw_ref = d.dw0, db_ref = d.db0;
  LayerNormBackward<double>(dinp_ref.data(), dw_ref.data(), db_ref.data(), d.dout.data(),
                            d.x.data(), d.w.data(), d.mean.data(), d.rstd.data(), n, c);
  const auto r = LayerNormBackwardOnGpu<Tx>(d, n, c, block, max_blocks);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& [dinp, dw, db] = *r;
  if constexpr (kFp32) {
    // All three accumulate onto O(1) values; dw and db sum n terms of O(1) (RowSumFloor).
    ExpectClose(dinp, dinp_ref, 1e-5, "dinp", /*floor=*/1.0);
    ExpectClose(dw, dw_ref, 1e-5, "dweight", RowSumFloor(n));
    ExpectClose(db, db_ref, 1e-5, "dbias", RowSumFloor(n));
  } else {
    // Each bf16 output is one rounding of a float computation: dinp + dx, dweight + Σ, dbias + Σ.
    ExpectBf16Close(dinp, dinp_ref, "dinp", /*floor=*/1.0);
    ExpectBf16Close(dw, dw_ref, "dweight", RowSumFloor(n));
    ExpectBf16Close(db, db_ref, "dbias", RowSumFloor(n));
  }
}

TEST_F(LayerNormGpuTest, BackwardFp32MatchesTheCpuReference) {
  struct Case {
    int64_t n, c;
    int block, max_blocks;  // max_blocks < n: several rows per block
  };
  for (const Case k :
       {Case{1, 1, 32, 512}, Case{3, 3, 32, 2}, Case{5, 37, 64, 512}, Case{37, 37, 96, 4},
        Case{9, 300, 256, 3}, Case{2, 768, 256, 512}, Case{40, 5, 32, 512}}) {
    CheckLayerNormBackward<float>(k.n, k.c, k.block, k.max_blocks, k.n * 100 + k.c);
  }
}

TEST_F(LayerNormGpuTest, BackwardBf16IsWithinOneUlpOfTheRoundedReference) {
  CheckLayerNormBackward<bf16>(13, 37, 64, 5, 77);
  CheckLayerNormBackward<bf16>(3, 768, 256, 512, 77);
}

// Past kLayerNormBackwardMaxSharedC the running sums live in scratch, not shared memory.
TEST_F(LayerNormGpuTest, BackwardWithSumsInScratch) {
  CheckLayerNormBackward<float>(3, kLayerNormBackwardMaxSharedC + 5, kLayerNormBackwardBlock, 2, 5);
  CheckLayerNormBackward<float>(1000, kLayerNormBackwardMaxSharedC + 5, kLayerNormBackwardBlock,
                                kLayerNormBackwardMaxBlocks, 6);
}

// 4096 rows on the default 512 blocks: 8 rows per block.
TEST_F(LayerNormGpuTest, Gpt2Backward) {
  CheckLayerNormBackward<float>(kGpt2B * kGpt2T, kGpt2C, kLayerNormBackwardBlock,
                                kLayerNormBackwardMaxBlocks, 31);
  CheckLayerNormBackward<bf16>(kGpt2B * kGpt2T, kGpt2C, kLayerNormBackwardBlock,
                               kLayerNormBackwardMaxBlocks, 32);
}

// ---- Embedding (embedding_test.cc) ---------------------------------------------------------

// out, dwte0 + dwte, dwpe0 + dwpe.
template <typename Tx>
absl::StatusOr<std::tuple<std::vector<Tx>, std::vector<Tx>, std::vector<Tx>>> EmbeddingOnGpu(
    const EmbeddingShape& s, const std::vector<int32_t>& tokens, const std::vector<Tx>& wte,
    const std::vector<Tx>& wpe, const std::vector<Tx>& dout, const std::vector<Tx>& dwte0,
    const std::vector<Tx>& dwpe0, int block) {
  return RunTwice([&](DeviceBuffers& d) {
    const int32_t* tokens_d = d.Upload(tokens);
    const Tx* wte_d = d.Upload(wte);
    const Tx* wpe_d = d.Upload(wpe);
    const Tx* dout_d = d.Upload(dout);
    Tx* dwte_d = d.Upload(dwte0);
    Tx* dwpe_d = d.Upload(dwpe0);
    Tx* out_d = d.Alloc<Tx>(s.b * s.t * s.c);
    d.Launch([&] {
      return embedding_forward(out_d, tokens_d, wte_d, wpe_d, s.b, s.t, s.c, nullptr, block);
    });
    d.Launch([&] {
      return embedding_backward(dwte_d, dwpe_d, dout_d, tokens_d, s.b, s.t, s.c, nullptr, block);
    });
    auto out = d.Download(out_d);
    auto dwte = d.Download(dwte_d);
    auto dwpe = d.Download(dwpe_d);
    return std::make_tuple(std::move(out), std::move(dwte), std::move(dwpe));
  });
}

void CheckEmbeddingFp32(const EmbeddingShape& s, std::initializer_list<int> blocks) {
  const EmbeddingFp32Case k = MakeEmbeddingFp32Case(s);
  for (int block : blocks) {
    SCOPED_TRACE(::testing::Message()
                 << "b=" << s.b << " t=" << s.t << " c=" << s.c << " block=" << block);
    const auto r = EmbeddingOnGpu(s, k.tokens, k.wte, k.wpe, k.dout, k.dwte0, k.dwpe0, block);
    ASSERT_TRUE(r.ok()) << r.status();
    const auto& [out, dwte, dwpe] = *r;
    ExpectEmbeddingFp32Matches(k, out, dwte, dwpe);
  }
}

// bf16: the forward is one rounding of a float sum of two bf16 values. The backward rounds to bf16
// after every addition, in (b, t) order: it must equal that sequence replayed on the host, bit for
// bit, and lie within the bound of that many roundings of the double reference:
// |got − exact| ≤ 2^-8 · Σ |partial sums| (embedding_test.cc says why).
void CheckEmbeddingBf16(const EmbeddingShape& s, std::initializer_list<int> blocks) {
  const EmbeddingBf16Case k = MakeEmbeddingBf16Case(s);
  for (int block : blocks) {
    SCOPED_TRACE(::testing::Message()
                 << "b=" << s.b << " t=" << s.t << " c=" << s.c << " block=" << block);
    const auto r = EmbeddingOnGpu(s, k.tokens, k.wte, k.wpe, k.dout, k.dwte0, k.dwpe0, block);
    ASSERT_TRUE(r.ok()) << r.status();
    const auto& [out, dwte, dwpe] = *r;
    ExpectBf16Close(out, k.out_ref, "out", /*floor=*/1.0);
    EXPECT_TRUE(SameBits(dwte, k.replay.dwte)) << "dwte";
    EXPECT_TRUE(SameBits(dwpe, k.replay.dwpe)) << "dwpe";
    ExpectWithinRoundingBound(dwte, k.dwte_ref, k.replay.dwte_mass, "dwte");
    ExpectWithinRoundingBound(dwpe, k.dwpe_ref, k.replay.dwpe_mass, "dwpe");
  }
}

class EmbeddingGpuTest : public GpuTest {};

TEST_F(EmbeddingGpuTest, Fp32IsBitIdenticalToTheFloatCpuKernel) {
  for (const EmbeddingShape& s : kEmbeddingShapes) CheckEmbeddingFp32(s, {32, 96, 256});
}

TEST_F(EmbeddingGpuTest, Bf16MatchesTheRoundedReference) {
  for (const EmbeddingShape& s : kEmbeddingShapes) CheckEmbeddingBf16(s, {32, 96});
}

TEST_F(EmbeddingGpuTest, Gpt2TokenAndPositionEmbedding) {
  const EmbeddingShape s{kGpt2B, kGpt2T, kGpt2C, static_cast<int32_t>(kGpt2V)};
  CheckEmbeddingFp32(s, {kEmbeddingBlock});
  CheckEmbeddingBf16(s, {kEmbeddingBlock});
}

// ---- Attention (attention_test.cc) ---------------------------------------------------------

constexpr AttentionShape kGpt2Attention{2, kGpt2T, kGpt2C, kGpt2NH};

// out sums over up to T keys and dqkv over up to T queries: the float rounding error of such a sum
// grows like sqrt(T), and the floors of the SIMT tests (T <= 70) with it past T = 64 (4x at
// T = 1024, where dqkv's worst error through the SIMT layer is 1e-6, the whole fp32 tolerance at
// the unscaled floor 0.1).
double AttentionFloorScale(int64_t t) { return std::max(1.0, std::sqrt(t / 64.0)); }

template <typename Tx>
struct AttentionGpuOut {
  std::vector<Tx> out, dqkv;
  std::vector<float> lse;
};

// Forward then backward (from the forward's own out and lse), as training runs them.
template <typename Tx>
absl::StatusOr<AttentionGpuOut<Tx>> AttentionOnGpu(const AttentionShape& s,
                                                   const std::vector<Tx>& qkv,
                                                   const std::vector<Tx>& dout,
                                                   const std::vector<Tx>& dqkv0, int group) {
  return RunTwice([&](DeviceBuffers& d) {
    const Tx* qkv_d = d.Upload(qkv);
    const Tx* dout_d = d.Upload(dout);
    Tx* dqkv_d = d.Upload(dqkv0);
    Tx* out_d = d.Alloc<Tx>(s.b * s.t * s.c);
    float* lse_d = d.Alloc<float>(s.b * s.nh * s.t);
    float* workspace_d =
        d.Alloc<float>(attention_workspace_bytes(s.b, s.t, s.c, s.nh) / sizeof(float));
    d.Launch([&] {
      return attention_forward(out_d, lse_d, qkv_d, s.b, s.t, s.c, s.nh, nullptr, group);
    });
    d.Launch([&] {
      return attention_backward(dqkv_d, dout_d, qkv_d, out_d, lse_d, workspace_d, s.b, s.t, s.c,
                                s.nh, nullptr, group);
    });
    AttentionGpuOut<Tx> o;
    o.out = d.Download(out_d);
    o.lse = d.Download(lse_d);
    o.dqkv = d.Download(dqkv_d);
    return o;
  });
}

void CheckAttentionFp32(const AttentionShape& s, std::initializer_list<int> groups,
                        std::initializer_list<bool> zero_dqkv0s, uint64_t seed) {
  // Scale 2: scores of a few units, so that the softmax is far from uniform.
  const auto qkv = RandomVector(s.b * s.t * 3 * s.c, seed, 2.0);
  const auto dout = RandomVector(s.b * s.t * s.c, seed + 1);
  for (bool zero_dqkv0 : zero_dqkv0s) {
    // From zero: the gradient itself; from random values: that backward accumulates.
    const auto dqkv0 =
        zero_dqkv0 ? std::vector<double>(qkv.size(), 0.0) : RandomVector(qkv.size(), seed + 2);
    const AttentionReference ref = ComputeAttentionReference(s, qkv, dout, dqkv0);
    for (int group : groups) {
      SCOPED_TRACE(::testing::Message()
                   << "B=" << s.b << " T=" << s.t << " C=" << s.c << " NH=" << s.nh
                   << " group=" << group << " zero_dqkv0=" << zero_dqkv0);
      const auto r = AttentionOnGpu(s, ToF(qkv), ToF(dout), ToF(dqkv0), group);
      ASSERT_TRUE(r.ok()) << r.status();
      // out is a convex combination of values of size ~1: floor 0.5 against cancellation.
      ExpectClose(r->out, ref.out, 1e-5, "out", /*floor=*/0.5 * AttentionFloorScale(s.t));
      ExpectClose(r->lse, ref.lse, 1e-5, "lse", /*floor=*/1.0);
      // Gradients sum up to T terms of size ~1 that cancel.
      ExpectClose(r->dqkv, ref.dqkv, 1e-5, "dqkv", /*floor=*/0.1 * AttentionFloorScale(s.t));
    }
  }
}

// out is one rounding of a float computation from bf16 inputs: within 1 ulp of the rounded
// double reference. The backward computes D from the bf16 out it is given (as flash attention
// does), so its reference is the double gradient for that same out (BackwardFromOut): one
// rounding of float sums again, within 1 ulp. That gradient differs from the exact one by the
// rounding of out: relative ~2^-9 (checked norm-wise at 2^-7).
void CheckAttentionBf16(const AttentionShape& s, uint64_t seed) {
  for (bool zero_dqkv0 : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.b << " T=" << s.t << " C=" << s.c
                                      << " NH=" << s.nh << " zero_dqkv0=" << zero_dqkv0);
    const auto qkv_b = ToBf16(RandomVector(s.b * s.t * 3 * s.c, seed, 2.0));
    const auto dout_b = ToBf16(RandomVector(s.b * s.t * s.c, seed + 1));
    const auto dqkv0_b = ToBf16(zero_dqkv0 ? std::vector<double>(qkv_b.size(), 0.0)
                                           : RandomVector(qkv_b.size(), seed + 2));
    // The reference starts from the same bf16 values, in double.
    const auto qkv = ToDouble(qkv_b), dout = ToDouble(dout_b), dqkv0 = ToDouble(dqkv0_b);
    const AttentionReference ref = ComputeAttentionReference(s, qkv, dout, dqkv0);
    const auto r = AttentionOnGpu(s, qkv_b, dout_b, dqkv0_b, /*group=*/0);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectBf16Close(r->out, ref.out, "out", /*floor=*/0.5 * AttentionFloorScale(s.t));
    ExpectClose(r->lse, ref.lse, 1e-5, "lse", /*floor=*/1.0);
    std::vector<double> dqkv_ref = dqkv0;
    BackwardFromOut(s, dqkv_ref, dout, qkv, ToDouble(r->out));
    ExpectBf16Close(r->dqkv, dqkv_ref, "dqkv", /*floor=*/0.1 * AttentionFloorScale(s.t));
    if (zero_dqkv0) {
      EXPECT_LT(kernels::testing::RelErr(ToDouble(r->dqkv), ref.dqkv), 1.0 / 128);
    }
  }
}

// No atomics, and every sum in a fixed order that does not depend on the threads per row: the
// same bits for every group.
void CheckAttentionSameBitsAcrossGroups(const AttentionShape& s,
                                        std::initializer_list<int> groups) {
  SCOPED_TRACE(::testing::Message()
               << "B=" << s.b << " T=" << s.t << " C=" << s.c << " NH=" << s.nh);
  const auto qkv = ToF(RandomVector(s.b * s.t * 3 * s.c, 7, 2.0));
  const auto dout = ToF(RandomVector(s.b * s.t * s.c, 8));
  const auto dqkv0 = ToF(RandomVector(qkv.size(), 9));
  absl::StatusOr<AttentionGpuOut<float>> first;
  for (int group : groups) {
    const auto r = AttentionOnGpu(s, qkv, dout, dqkv0, group);
    ASSERT_TRUE(r.ok()) << r.status();
    if (!first.ok()) {
      first = r;
      continue;
    }
    EXPECT_TRUE(SameBits(r->out, first->out)) << "out, group " << group;
    EXPECT_TRUE(SameBits(r->lse, first->lse)) << "lse, group " << group;
    EXPECT_TRUE(SameBits(r->dqkv, first->dqkv)) << "dqkv, group " << group;
  }
}

// The groups (threads per row) a shape is run with: the default, and a wider one.
std::vector<int> Groups(const AttentionShape& s) {
  const int def = AttentionDefaultGroup(s.c / s.nh);
  return {0, def == 1 ? 4 : 2 * def};
}

class AttentionGpuTest : public GpuTest {};

TEST_F(AttentionGpuTest, Fp32MatchesTheCpuReference) {
  uint64_t seed = 1;
  for (const AttentionShape& s : kAttentionShapes) {
    const std::vector<int> groups = Groups(s);
    CheckAttentionFp32(s, {groups[0], groups[1]}, {true, false}, seed += 3);
  }
}

TEST_F(AttentionGpuTest, Bf16IsWithinOneUlpOfTheRoundedReference) {
  uint64_t seed = 100;
  for (const AttentionShape& s :
       {AttentionShape{2, 33, 16, 2}, AttentionShape{1, 70, 64, 1}, AttentionShape{1, 7, 3, 3}}) {
    CheckAttentionBf16(s, seed += 3);
  }
}

TEST_F(AttentionGpuTest, SameBitsForEveryGroup) {
  CheckAttentionSameBitsAcrossGroups({2, 37, 32, 2}, {2, 8, 32});
  CheckAttentionSameBitsAcrossGroups(kGpt2Attention, {8, 16, 32});
}

TEST_F(AttentionGpuTest, Gpt2Fp32) { CheckAttentionFp32(kGpt2Attention, {0}, {true}, 41); }

TEST_F(AttentionGpuTest, Gpt2Bf16) { CheckAttentionBf16(kGpt2Attention, 51); }

// The flash-attention-2 reference above agrees with the CPU kernel when given the exact out (no
// GPU needed).
TEST(AttentionGpuReferenceTest, BackwardFromOutIsTheCpuGradient) {
  ExpectBackwardFromOutIsTheCpuGradient();
}

// ---- Cross-entropy (crossentropy_test.cc) --------------------------------------------------

// Row r is shifted by kOffsets[r % 3]: exp of the shifted logits over- or underflows float (for
// V = 50257, Σ exp(x) with x ≈ 50 reaches 1e26; with x ≈ -50, exp(x) ≈ 2e-22), so the results
// rely on the max shift.
constexpr double kOffsets[] = {0.0, 50.0, -50.0};

// Logits [n, v], random with scale 4 plus each row's offset, rounded to Tx.
template <typename Tx>
std::vector<Tx> MakeLogits(int64_t n, int64_t v, uint64_t seed) {
  auto x = RandomVector(n * v, seed, 4.0);
  for (int64_t i = 0; i < n * v; ++i) {
    x[i] = static_cast<float>(x[i] + kOffsets[(i / v) % 3]);  // rounded to float first
  }
  return ToTx<Tx>(x);
}

struct CrossEntropyReference {
  std::vector<double> losses, lse, probs;
};

CrossEntropyReference CrossEntropyCpu(const std::vector<double>& logits,
                                      const std::vector<int32_t>& targets, int64_t n, int64_t v) {
  CrossEntropyReference r{std::vector<double>(n), std::vector<double>(n),
                          std::vector<double>(n * v)};
  CrossEntropyForward<double>(r.losses.data(), r.probs.data(), logits.data(), targets.data(), n, v);
  for (int64_t i = 0; i < n; ++i) r.lse[i] = r.losses[i] + logits[i * v + targets[i]];
  return r;
}

// dlogits0 + the CPU backward, in double.
std::vector<double> CrossEntropyBackwardCpu(const CrossEntropyReference& r,
                                            const std::vector<int32_t>& targets,
                                            std::vector<double> dlogits0, double dloss, int64_t n,
                                            int64_t v) {
  CrossEntropyBackward<double>(dlogits0.data(), r.probs.data(), targets.data(), dloss, n, v);
  return dlogits0;
}

template <typename Tx>
struct CrossEntropyGpuOut {
  std::vector<float> losses, lse, losses_without_lse;
  std::vector<Tx> dlogits, grad;  // dlogits0 + the gradient; the gradient onto zeros
};

template <typename Tx>
absl::StatusOr<CrossEntropyGpuOut<Tx>> CrossEntropyOnGpu(const std::vector<Tx>& logits,
                                                         const std::vector<int32_t>& targets,
                                                         const std::vector<Tx>& dlogits0,
                                                         float dloss, int64_t n, int64_t v,
                                                         int block) {
  const std::vector<Tx> zeros = ToTx<Tx>(std::vector<double>(n * v, 0.0));
  return RunTwice([&](DeviceBuffers& d) {
    const Tx* logits_d = d.Upload(logits);
    const int32_t* targets_d = d.Upload(targets);
    Tx* dlogits_d = d.Upload(dlogits0);
    Tx* grad_d = d.Upload(zeros);
    float* losses_d = d.Alloc<float>(n);
    float* lse_d = d.Alloc<float>(n);
    float* losses2_d = d.Alloc<float>(n);
    d.Launch([&] {
      return crossentropy_forward(losses_d, lse_d, logits_d, targets_d, n, v, nullptr, block);
    });
    // lse is optional (evaluation): the same losses without it.
    d.Launch([&] {
      return crossentropy_forward(losses2_d, static_cast<float*>(nullptr), logits_d, targets_d, n,
                                  v, nullptr, block);
    });
    d.Launch([&] {
      return crossentropy_backward(dlogits_d, logits_d, lse_d, targets_d, dloss, n, v, nullptr,
                                   block);
    });
    d.Launch([&] {
      return crossentropy_backward(grad_d, logits_d, lse_d, targets_d, dloss, n, v, nullptr, block);
    });
    CrossEntropyGpuOut<Tx> o;
    o.losses = d.Download(losses_d);
    o.lse = d.Download(lse_d);
    o.losses_without_lse = d.Download(losses2_d);
    o.dlogits = d.Download(dlogits_d);
    o.grad = d.Download(grad_d);
    return o;
  });
}

template <typename Tx>
void CheckCrossEntropy(int64_t n, int64_t v, std::initializer_list<int> blocks, uint64_t seed) {
  constexpr bool kFp32 = std::is_same_v<Tx, float>;
  const float dloss = 1.0f / static_cast<float>(n);
  const auto logits = MakeLogits<Tx>(n, v, seed);
  const auto targets = RandomTokens(n, static_cast<int32_t>(v), seed + 1);
  // The reference starts from the logits as stored, in double.
  const CrossEntropyReference ref = CrossEntropyCpu(AsDouble(logits), targets, n, v);
  const auto dlogits0 = ToTx<Tx>(RandomVector(n * v, seed + 2));
  const auto dlogits_ref = CrossEntropyBackwardCpu(ref, targets, AsDouble(dlogits0), dloss, n, v);
  const auto grad_ref =
      CrossEntropyBackwardCpu(ref, targets, std::vector<double>(n * v), dloss, n, v);
  for (int block : blocks) {
    SCOPED_TRACE(::testing::Message()
                 << "n=" << n << " v=" << v << " block=" << block << " fp32=" << kFp32);
    const auto r = CrossEntropyOnGpu(logits, targets, dlogits0, dloss, n, v, block);
    ASSERT_TRUE(r.ok()) << r.status();
    // A loss is lse − x[target], a difference of values of the size of the logits.
    ExpectClose(r->losses, ref.losses, 1e-5, "losses", /*floor=*/1.0);
    ExpectClose(r->lse, ref.lse, 1e-5, "lse");
    EXPECT_TRUE(SameBits(r->losses, r->losses_without_lse)) << "losses depend on lse being saved";
    if constexpr (kFp32) {
      // Accumulation onto O(1) values.
      ExpectClose(r->dlogits, dlogits_ref, 1e-5, "dlogits", /*floor=*/1.0);
      // The gradient alone: p · dloss is checked relative to itself however small p is (exp has
      // a small relative error); p − 1 at the target cancels, so it is checked relative to dloss.
      std::vector<float> off, at;
      std::vector<double> off_ref, at_ref;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < v; ++j) {
          const bool is_target = j == targets[i];
          (is_target ? at : off).push_back(r->grad[i * v + j]);
          (is_target ? at_ref : off_ref).push_back(grad_ref[i * v + j]);
        }
      }
      ExpectClose(off, off_ref, 1e-5, "softmax · dloss", /*floor=*/1e-30);
      ExpectClose(at, at_ref, 1e-5, "(softmax − 1) · dloss", /*floor=*/dloss);
    } else {
      // Each bf16 output is one rounding of a float computed to ~1e-6 relative.
      ExpectBf16Close(r->dlogits, dlogits_ref, "dlogits", /*floor=*/1.0);
      ExpectBf16Close(r->grad, grad_ref, "(softmax − onehot) · dloss", /*floor=*/dloss);
    }
  }
}

class CrossEntropyGpuTest : public GpuTest {};

TEST_F(CrossEntropyGpuTest, Fp32MatchesTheCpuReference) {
  for (int64_t v : {1, 7, 65, 50257}) CheckCrossEntropy<float>(3, v, {32, 96, 1024}, v);
}

TEST_F(CrossEntropyGpuTest, Bf16LogitsMatchTheReferenceOfTheRoundedLogits) {
  for (int64_t v : {1, 7, 65, 50257}) {
    CheckCrossEntropy<bf16>(3, v, {64, kCrossEntropyBlock}, v + 10);
  }
}

// 256 rows of the GPT-2 vocabulary (a whole batch, B·T = 4096 rows, would make the double
// reference's probabilities 1.6 GB).
TEST_F(CrossEntropyGpuTest, Gpt2Vocabulary) {
  CheckCrossEntropy<float>(256, kGpt2V, {kCrossEntropyBlock}, 61);
  CheckCrossEntropy<bf16>(256, kGpt2V, {kCrossEntropyBlock}, 62);
}

// ---- AdamW (adamw_test.cc) -----------------------------------------------------------------

// Two consecutive steps (the second with fresh gradients) on the CPU kernel and on the GPU from
// the same state: param, m, v and the bf16 copy must be the same bits (adamw.cuh says why).
template <typename Tg>
void ExpectAdamWMatchesCpuKernel(int64_t n, int block, const AdamWScalars& s, bool start_at_zero,
                                 bool with_copy) {
  SCOPED_TRACE(::testing::Message()
               << "n=" << n << " block=" << block << " lr=" << s.lr << " zero=" << start_at_zero
               << " copy=" << with_copy << " fp32 grads=" << (std::is_same_v<Tg, float>));
  const auto param0 = ToF(RandomVector(n, n + 1));
  const auto m0 = start_at_zero ? std::vector<float>(n, 0.0f) : ToF(RandomVector(n, n + 2, 1e-2));
  const auto v0 =
      start_at_zero ? std::vector<float>(n, 0.0f) : Abs(ToF(RandomVector(n, n + 3, 1e-4)));
  const std::vector<bf16> copy0(n, __float2bfloat16(-7.0f));
  // Gradients as the kernel stores them, and as the CPU kernel reads them (float).
  std::vector<std::vector<Tg>> grads;
  std::vector<float> p_cpu = param0, m_cpu = m0, v_cpu = v0;
  for (int step = 0; step < 2; ++step) {
    grads.push_back(ToTx<Tg>(RandomVector(n, 100 * n + step, 3.0)));
    const std::vector<float> grad_f = ToF(AsDouble(grads.back()));
    AdamWUpdate(p_cpu.data(), grad_f.data(), m_cpu.data(), v_cpu.data(), n, s);
  }
  const auto r = RunTwice([&](DeviceBuffers& d) {
    float* p_d = d.Upload(param0);
    float* m_d = d.Upload(m0);
    float* v_d = d.Upload(v0);
    bf16* copy_d = d.Upload(copy0);
    const Tg* grad0_d = d.Upload(grads[0]);
    const Tg* grad1_d = d.Upload(grads[1]);
    for (const Tg* grad_d : {grad0_d, grad1_d}) {
      d.Launch([&] {
        return adamw_update(p_d, with_copy ? copy_d : nullptr, grad_d, m_d, v_d, n, s, nullptr,
                            block);
      });
    }
    auto p = d.Download(p_d);
    auto m = d.Download(m_d);
    auto v = d.Download(v_d);
    auto copy = d.Download(copy_d);
    return std::make_tuple(std::move(p), std::move(m), std::move(v), std::move(copy));
  });
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& [p, m, v, copy] = *r;
  ExpectSameBits(p, p_cpu, "param", "CPU kernel");
  ExpectSameBits(m, m_cpu, "m", "CPU kernel");
  ExpectSameBits(v, v_cpu, "v", "CPU kernel");
  ASSERT_EQ(copy.size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const bf16 want = with_copy ? __float2bfloat16(p_cpu[i]) : copy0[i];
    ASSERT_EQ(testing::Bf16UlpDistance(copy[i], want), 0)
        << "param_bf16[" << i << "] is " << __bfloat162float(copy[i]) << ", want "
        << __bfloat162float(want);
  }
}

class AdamWGpuTest : public GpuTest {};

TEST_F(AdamWGpuTest, Fp32MatchesTheCpuKernelBitForBit) {
  for (int64_t n : {1, 31, 257, 5000}) {
    for (int block : {32, 96, 256}) {
      for (const AdamWScalars& s : AdamWScalarSets()) {
        for (bool zero : {true, false}) {
          ExpectAdamWMatchesCpuKernel<float>(n, block, s, zero, /*with_copy=*/true);
        }
      }
    }
  }
}

TEST_F(AdamWGpuTest, WithoutTheBf16CopyUpdatesTheSameAndWritesNoCopy) {
  for (const AdamWScalars& s : AdamWScalarSets()) {
    ExpectAdamWMatchesCpuKernel<float>(1000, 128, s, /*start_at_zero=*/false, /*with_copy=*/false);
  }
}

TEST_F(AdamWGpuTest, Bf16GradientsMatchTheCpuKernelOnTheirFloatValues) {
  for (int64_t n : {1, 300, 3001}) {
    for (const AdamWScalars& s : AdamWScalarSets()) {
      ExpectAdamWMatchesCpuKernel<bf16>(n, 96, s, /*start_at_zero=*/false, /*with_copy=*/true);
    }
  }
}

// The largest GPT-2 tensor (wte, V·C).
TEST_F(AdamWGpuTest, Gpt2TokenEmbeddingTable) {
  const AdamWScalars late = AdamWScalarSets()[1];
  ExpectAdamWMatchesCpuKernel<float>(kGpt2V * kGpt2C, kAdamWBlock, late, false, true);
  ExpectAdamWMatchesCpuKernel<bf16>(kGpt2V * kGpt2C, kAdamWBlock, late, false, true);
}

// ---- Gradient-norm chunk sums (norm_test.cc) -----------------------------------------------

// Every chunk sum has the CPU's bits, nothing is written past the last chunk, and the norm from
// TreeSum agrees bit for bit. Tx: the buffer's storage; the CPU reads its float values.
template <typename Tx>
void CheckChunkSquareSums(int64_t n, std::initializer_list<int> blocks) {
  const std::vector<float> xf = SpreadFloats(n, n + (std::is_same_v<Tx, float> ? 1 : 2));
  std::vector<Tx> x(n);
  std::vector<float> x_cpu(n);  // the float values of x
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<Tx, float>) {
      x[i] = x_cpu[i] = xf[i];
    } else {
      x[i] = __float2bfloat16(xf[i]);
      x_cpu[i] = __bfloat162float(x[i]);
    }
  }
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> want(chunks);
  ChunkSquareSums(x_cpu.data(), n, want.data());
  for (int block : blocks) {
    SCOPED_TRACE(::testing::Message()
                 << "n=" << n << " block=" << block << " fp32=" << (std::is_same_v<Tx, float>));
    const auto r = RunTwice([&](DeviceBuffers& d) {
      const Tx* x_d = d.Upload(x);
      double* got_d = d.Alloc<double>(chunks + 1);  // 0xFF bytes: a NaN
      d.Launch([&] { return chunk_square_sums(got_d, x_d, n, nullptr, block); });
      return d.Download(got_d);
    });
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectChunkSumsMatch(*r, want);
  }
}

constexpr int64_t kNormSizes[] = {1, 4095, 4096, 4097, 3 * 4096 + 5, 37 * 4096 + 100};

class NormGpuTest : public GpuTest {};

TEST_F(NormGpuTest, ChunkSumsMatchTheCpuBitForBit) {
  for (int64_t n : kNormSizes) CheckChunkSquareSums<float>(n, {32, 96, 256});
}

TEST_F(NormGpuTest, Bf16BufferMatchesTheCpuOnItsFloatValues) {
  for (int64_t n : kNormSizes) CheckChunkSquareSums<bf16>(n, {64});
}

// All of GPT-2 small's gradients as one buffer.
TEST_F(NormGpuTest, Gpt2AllGradients) {
  CheckChunkSquareSums<float>(kGpt2Params, {kChunkSquareSumsBlock});
  CheckChunkSquareSums<bf16>(kGpt2Params, {kChunkSquareSumsBlock});
}

}  // namespace
}  // namespace troupe::kernels::cuda
