// Test cases and double-precision references shared by the SIMT tests of the CUDA kernels
// (<op>_test.cc, g++) and the GPU test kernels_gpu_test.cu (nvcc): input generators, shapes,
// reference computations and small comparison helpers. Plain host C++ (no kernels), so that both
// compilers take it; everything is inline. Private to kernels/cuda/ tests.
//
// Conventions: references are computed in double from the inputs as stored; seeds are explicit so
// that both tests draw the same cases. Example:
//
//   const AttentionShape s{2, 33, 16, 2};
//   const auto qkv = RandomVector(s.b * s.t * 3 * s.c, 1, 2.0);
//   const AttentionReference ref = ComputeAttentionReference(s, qkv, dout, dqkv0);
#ifndef TROUPE_KERNELS_CUDA_KERNEL_CASES_H_
#define TROUPE_KERNELS_CUDA_KERNEL_CASES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "bf16_test_util.h"  // ExpectClose
#include "bits_test_util.h"  // ToF, ToD, SameBits, Bits, ExpectSameBits, SpreadFloats
#include "device.cuh"        // __nv_bfloat16 under nvcc and under the SIMT layer
#include "test_util.h"
#include "troupe/kernels/adamw.h"
#include "troupe/kernels/attention.h"
#include "troupe/kernels/embedding.h"
#include "troupe/kernels/layernorm.h"
#include "troupe/kernels/norm.h"
#include "troupe/kernels/parallel.h"

namespace troupe::kernels::cuda::testing {

// ---- LayerNorm ----------------------------------------------------------------------------------

// Activations with a mean far from zero (so that a one-pass variance would lose digits), weights
// and biases around 1.
inline std::vector<double> Activations(int64_t size, uint64_t seed) {
  auto x = kernels::testing::RandomVector(size, seed, 2.0);
  for (auto& v : x) v += 3.0;
  return x;
}

inline std::vector<double> Around1(int64_t size, uint64_t seed) {
  auto w = kernels::testing::RandomVector(size, seed, 0.5);
  for (auto& v : w) v += 1.0;
  return w;
}

struct LayerNormRefOut {
  std::vector<double> out, mean, rstd;
};

inline LayerNormRefOut LayerNormRef(const std::vector<double>& x, const std::vector<double>& w,
                                    const std::vector<double>& b, int64_t n, int64_t c) {
  LayerNormRefOut r{std::vector<double>(n * c), std::vector<double>(n), std::vector<double>(n)};
  LayerNormForward<double>(r.out.data(), r.mean.data(), r.rstd.data(), x.data(), w.data(), b.data(),
                           n, c);
  return r;
}

// Backward inputs in double; mean and rstd as the forward's float outputs would be.
struct LayerNormBackwardData {
  std::vector<double> dout, x, w, mean, rstd, dinp0, dw0, db0;
};

inline LayerNormBackwardData MakeLayerNormBackward(int64_t n, int64_t c, uint64_t seed) {
  using kernels::testing::RandomVector;
  LayerNormBackwardData d;
  // x as float: with C = 1, rstd = 1/sqrt(eps) ≈ 316 magnifies any mismatch of x and the mean.
  d.x = ToD(ToF(Activations(n * c, seed)));
  d.w = Around1(c, seed + 1);
  d.dout = RandomVector(n * c, seed + 2);
  d.dinp0 = RandomVector(n * c, seed + 3);
  d.dw0 = RandomVector(c, seed + 4);
  d.db0 = RandomVector(c, seed + 5);
  const auto fwd = LayerNormRef(d.x, d.w, RandomVector(c, seed + 6), n, c);
  d.mean = ToD(ToF(fwd.mean));
  d.rstd = ToD(ToF(fwd.rstd));
  return d;
}

// ---- Embedding ----------------------------------------------------------------------------------

struct EmbeddingShape {
  int64_t b, t, c;
  int32_t vocab;  // small vocabularies repeat tokens, also within a group of kEmbeddingUnroll
};

// t < kEmbeddingUnroll takes only the one-at-a-time path; vocab 3 mostly repeated groups, vocab
// 64 mostly distinct ones.
inline constexpr EmbeddingShape kEmbeddingShapes[] = {{2, 5, 1, 3},  {3, 7, 33, 4}, {2, 9, 100, 64},
                                                      {1, 3, 7, 2},  {4, 1, 5, 3},  {3, 2, 40, 64},
                                                      {5, 11, 65, 3}};

// The bf16 embedding backward replayed on the host: it rounds to bf16 after every addition, in
// (b, t) order, onto dwte0 and dwpe0; `*_mass` is Σ |partial sums| per element (the bound of that
// many roundings is 2^-8 times it).
struct EmbeddingBf16Replay {
  std::vector<__nv_bfloat16> dwte, dwpe;
  std::vector<double> dwte_mass, dwpe_mass;
};

inline EmbeddingBf16Replay ReplayEmbeddingBf16Backward(const EmbeddingShape& s,
                                                       const std::vector<int32_t>& tokens,
                                                       const std::vector<__nv_bfloat16>& dout,
                                                       const std::vector<__nv_bfloat16>& dwte0,
                                                       const std::vector<__nv_bfloat16>& dwpe0) {
  const int64_t bt = s.b * s.t, c = s.c;
  EmbeddingBf16Replay r{dwte0, dwpe0, std::vector<double>(s.vocab * c, 0.0),
                        std::vector<double>(s.t * c, 0.0)};
  for (int64_t i = 0; i < bt; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      const float g = __bfloat162float(dout[i * c + j]);
      const int64_t te = tokens[i] * c + j, pe = (i % s.t) * c + j;
      r.dwte[te] = __float2bfloat16(__bfloat162float(r.dwte[te]) + g);
      r.dwpe[pe] = __float2bfloat16(__bfloat162float(r.dwpe[pe]) + g);
      r.dwte_mass[te] += std::fabs(__bfloat162float(r.dwte[te]));
      r.dwpe_mass[pe] += std::fabs(__bfloat162float(r.dwpe[pe]));
    }
  }
  return r;
}

// The fp32 case of shape s: float inputs, the double reference of the same values, and the float
// CPU kernel's outputs (which the CUDA kernels, adding in the same order, must equal bit for bit).
struct EmbeddingFp32Case {
  std::vector<int32_t> tokens;
  std::vector<float> wte, wpe, dout, dwte0, dwpe0;
  std::vector<double> out_ref, dwte_ref, dwpe_ref;
  std::vector<float> out_cpu, dwte_cpu, dwpe_cpu;
};

inline EmbeddingFp32Case MakeEmbeddingFp32Case(const EmbeddingShape& s) {
  using kernels::testing::RandomVector;
  const int64_t bt = s.b * s.t;
  EmbeddingFp32Case k;
  k.tokens = kernels::testing::RandomTokens(bt, s.vocab, s.c + s.t);
  const auto wte = RandomVector(s.vocab * s.c, 1), wpe = RandomVector(s.t * s.c, 2);
  const auto dout = RandomVector(bt * s.c, 3);
  const auto dwte0 = RandomVector(s.vocab * s.c, 4), dwpe0 = RandomVector(s.t * s.c, 5);
  k.out_ref.resize(bt * s.c);
  k.dwte_ref = dwte0;
  k.dwpe_ref = dwpe0;
  EmbeddingForward<double>(k.out_ref.data(), k.tokens.data(), wte.data(), wpe.data(), s.b, s.t,
                           s.c);
  EmbeddingBackward<double>(k.dwte_ref.data(), k.dwpe_ref.data(), dout.data(), k.tokens.data(), s.b,
                            s.t, s.c);
  k.wte = ToF(wte), k.wpe = ToF(wpe), k.dout = ToF(dout), k.dwte0 = ToF(dwte0);
  k.dwpe0 = ToF(dwpe0);
  k.out_cpu.resize(bt * s.c);
  k.dwte_cpu = k.dwte0;
  k.dwpe_cpu = k.dwpe0;
  EmbeddingForward<float>(k.out_cpu.data(), k.tokens.data(), k.wte.data(), k.wpe.data(), s.b, s.t,
                          s.c);
  EmbeddingBackward<float>(k.dwte_cpu.data(), k.dwpe_cpu.data(), k.dout.data(), k.tokens.data(),
                           s.b, s.t, s.c);
  return k;
}

// Outputs of the CUDA kernels on case k: the float CPU kernel's bits (it adds in the same order),
// and within 1e-5 of the double reference.
inline void ExpectEmbeddingFp32Matches(const EmbeddingFp32Case& k, const std::vector<float>& out,
                                       const std::vector<float>& dwte,
                                       const std::vector<float>& dwpe) {
  EXPECT_TRUE(SameBits(out, k.out_cpu)) << "out";
  EXPECT_TRUE(SameBits(dwte, k.dwte_cpu)) << "dwte";
  EXPECT_TRUE(SameBits(dwpe, k.dwpe_cpu)) << "dwpe";
  ExpectClose(out, k.out_ref, 1e-5, "out", /*floor=*/1.0);     // a sum of two O(1) values
  ExpectClose(dwte, k.dwte_ref, 1e-5, "dwte", /*floor=*/1.0);  // sums onto O(1) values
  ExpectClose(dwpe, k.dwpe_ref, 1e-5, "dwpe", /*floor=*/1.0);
}

// The bf16 case of shape s: bf16 inputs, the double reference from the same bf16 values, and the
// replay of the backward's roundings.
struct EmbeddingBf16Case {
  std::vector<int32_t> tokens;
  std::vector<__nv_bfloat16> wte, wpe, dout, dwte0, dwpe0;
  std::vector<double> out_ref, dwte_ref, dwpe_ref;
  EmbeddingBf16Replay replay;
};

inline EmbeddingBf16Case MakeEmbeddingBf16Case(const EmbeddingShape& s) {
  using kernels::testing::RandomVector;
  const int64_t bt = s.b * s.t, c = s.c;
  EmbeddingBf16Case k;
  k.tokens = kernels::testing::RandomTokens(bt, s.vocab, s.c + s.t + 1);
  k.wte = ToBf16(RandomVector(s.vocab * c, 11));
  k.wpe = ToBf16(RandomVector(s.t * c, 12));
  k.dout = ToBf16(RandomVector(bt * c, 13));
  k.dwte0 = ToBf16(RandomVector(s.vocab * c, 14));
  k.dwpe0 = ToBf16(RandomVector(s.t * c, 15));
  const auto wte = ToDouble(k.wte), wpe = ToDouble(k.wpe), dout = ToDouble(k.dout);
  k.out_ref.resize(bt * c);
  k.dwte_ref = ToDouble(k.dwte0);
  k.dwpe_ref = ToDouble(k.dwpe0);
  EmbeddingForward<double>(k.out_ref.data(), k.tokens.data(), wte.data(), wpe.data(), s.b, s.t, c);
  EmbeddingBackward<double>(k.dwte_ref.data(), k.dwpe_ref.data(), dout.data(), k.tokens.data(), s.b,
                            s.t, c);
  k.replay = ReplayEmbeddingBf16Backward(s, k.tokens, k.dout, k.dwte0, k.dwpe0);
  return k;
}

// Each element of `got` within the bound of `mass` roundings: |got − ref| <= 2^-8 · mass (plus 1%
// for the double reference's own rounding).
inline void ExpectWithinRoundingBound(const std::vector<__nv_bfloat16>& got,
                                      const std::vector<double>& ref,
                                      const std::vector<double>& mass, const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    const double bound = 1.01 * std::ldexp(mass[k], -8);
    ASSERT_LE(std::fabs(__bfloat162float(got[k]) - ref[k]), bound)
        << what << "[" << k << "] is " << __bfloat162float(got[k]) << ", reference " << ref[k];
  }
}

// ---- Attention ----------------------------------------------------------------------------------

struct AttentionShape {
  int64_t b, t, c, nh;
};

// Head sizes 1, 8, 16, 64 and 128; T not a multiple of the 16-row tile (except 16 itself, and
// 1 and 7 smaller than one tile); several B and NH.
inline constexpr AttentionShape kAttentionShapes[] = {
    {2, 33, 3, 3},  {1, 70, 2, 2},   {2, 7, 16, 2},  {1, 70, 24, 3}, {3, 33, 32, 2}, {1, 1, 16, 1},
    {1, 16, 16, 1}, {1, 70, 128, 2}, {2, 33, 64, 1}, {1, 7, 64, 1},  {1, 17, 128, 1}};

// Scaled scores q_i·k_j / sqrt(hs) of row i of head (b, h), j <= i, in double.
inline std::vector<double> Scores(const AttentionShape& s, const std::vector<double>& qkv,
                                  int64_t b, int64_t h, int64_t i) {
  const int64_t hs = s.c / s.nh;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> score(i + 1);
  for (int64_t j = 0; j <= i; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < hs; ++c) {
      dot += qkv[(b * s.t + i) * 3 * s.c + h * hs + c] *
             qkv[(b * s.t + j) * 3 * s.c + s.c + h * hs + c];
    }
    score[j] = dot * scale;
  }
  return score;
}

inline double LogSumExp(const std::vector<double>& x) {
  const double mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (double v : x) sum += std::exp(v - mx);
  return mx + std::log(sum);
}

struct AttentionReference {
  std::vector<double> out, lse, dqkv;
};

// The CPU kernel in double, plus lse = log Σ_{j<=i} exp(q_i·k_j / sqrt(hs)) per (b, h, i). Heads
// run in parallel (ParallelFor); each writes its own lse, so the result does not depend on the
// thread count.
inline AttentionReference ComputeAttentionReference(const AttentionShape& s,
                                                    const std::vector<double>& qkv,
                                                    const std::vector<double>& dout,
                                                    const std::vector<double>& dqkv0) {
  AttentionReference ref;
  ref.out.resize(s.b * s.t * s.c);
  std::vector<double> att(s.b * s.nh * s.t * s.t);
  AttentionForward<double>(ref.out.data(), att.data(), qkv.data(), s.b, s.t, s.c, s.nh);
  // The CPU kernel overwrites dqkv; the GPU kernels add to dqkv0.
  ref.dqkv.resize(dqkv0.size());
  AttentionBackward<double>(ref.dqkv.data(), dout.data(), qkv.data(), att.data(), s.b, s.t, s.c,
                            s.nh);
  for (size_t i = 0; i < dqkv0.size(); ++i) ref.dqkv[i] += dqkv0[i];
  ref.lse.resize(s.b * s.nh * s.t);
  ParallelFor(s.b * s.nh, [&](int64_t bh) {
    for (int64_t i = 0; i < s.t; ++i) {
      ref.lse[bh * s.t + i] = LogSumExp(Scores(s, qkv, bh / s.nh, bh % s.nh, i));
    }
  });
  return ref;
}

// dqkv += the gradient in the kernels' flash-attention-2 form, in double: dS = P ∘ (dout·vᵀ − D)
// with D_i = Σ_c dout_ic out_ic from the `out` given. With the exact out this is the CPU kernel's
// gradient; with the forward's bf16 out it is the function the bf16 backward computes. Heads
// (b, h) write disjoint elements of dqkv, so they run in parallel with the same result.
inline void BackwardFromOut(const AttentionShape& s, std::vector<double>& dqkv,
                            const std::vector<double>& dout, const std::vector<double>& qkv,
                            const std::vector<double>& out) {
  const int64_t hs = s.c / s.nh, row = 3 * s.c;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  ParallelFor(s.b * s.nh, [&](int64_t bh) {
    const int64_t b = bh / s.nh, h = bh % s.nh;
    for (int64_t i = 0; i < s.t; ++i) {
      const std::vector<double> score = Scores(s, qkv, b, h, i);
      const double lse = LogSumExp(score);
      const double* dout_i = &dout[(b * s.t + i) * s.c + h * hs];
      const double* out_i = &out[(b * s.t + i) * s.c + h * hs];
      double d = 0;
      for (int64_t c = 0; c < hs; ++c) d += dout_i[c] * out_i[c];
      const int64_t qi = (b * s.t + i) * row + h * hs;
      for (int64_t j = 0; j <= i; ++j) {
        const int64_t kj = (b * s.t + j) * row + s.c + h * hs, vj = kj + s.c;
        const double p = std::exp(score[j] - lse);
        double dp = 0;
        for (int64_t c = 0; c < hs; ++c) dp += dout_i[c] * qkv[vj + c];
        const double ds = p * (dp - d);
        for (int64_t c = 0; c < hs; ++c) {
          dqkv[qi + c] += scale * ds * qkv[kj + c];
          dqkv[kj + c] += scale * ds * qkv[qi + c];
          dqkv[vj + c] += p * dout_i[c];
        }
      }
    }
  });
}

// The test's flash-attention-2 reference (BackwardFromOut) agrees with the CPU kernel when given
// the exact out. Needs no GPU.
inline void ExpectBackwardFromOutIsTheCpuGradient() {
  using kernels::testing::RandomVector;
  for (const AttentionShape& s : {AttentionShape{2, 33, 16, 2}, AttentionShape{1, 20, 3, 3}}) {
    const auto qkv = RandomVector(s.b * s.t * 3 * s.c, 1, 2.0);
    const auto dout = RandomVector(s.b * s.t * s.c, 2);
    const auto dqkv0 = RandomVector(qkv.size(), 3);
    const AttentionReference ref = ComputeAttentionReference(s, qkv, dout, dqkv0);
    std::vector<double> dqkv = dqkv0;
    BackwardFromOut(s, dqkv, dout, qkv, ref.out);
    ExpectClose(dqkv, ref.dqkv, 1e-12, "dqkv", /*floor=*/1.0);
  }
}

// ---- AdamW --------------------------------------------------------------------------------------

inline std::vector<float> Abs(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// Step 1 from m = v = 0 (no decay); a late step with clipping and decay; and v so small that eps
// dominates the denominator.
inline std::vector<AdamWScalars> AdamWScalarSets() {
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

// ---- Gradient-norm chunk sums -------------------------------------------------------------------

// `got` (chunk sums, plus one element past the last chunk that was NaN before the kernel ran)
// against the CPU's `want`: every chunk sum the same bits, nothing written past the last chunk,
// and the norm from TreeSum the same bits.
inline void ExpectChunkSumsMatch(const std::vector<double>& got, const std::vector<double>& want) {
  const int64_t chunks = static_cast<int64_t>(want.size());
  ASSERT_EQ(got.size(), static_cast<size_t>(chunks + 1));
  for (int64_t c = 0; c < chunks; ++c) {
    ASSERT_EQ(Bits(got[c]), Bits(want[c]))
        << "chunk " << c << ": " << got[c] << " vs CPU " << want[c];
  }
  EXPECT_TRUE(std::isnan(got[chunks])) << "wrote past the last chunk";
  EXPECT_EQ(Bits(std::sqrt(TreeSum(got.data(), chunks))),
            Bits(std::sqrt(TreeSum(want.data(), chunks))));
}

}  // namespace troupe::kernels::cuda::testing

#endif  // TROUPE_KERNELS_CUDA_KERNEL_CASES_H_
