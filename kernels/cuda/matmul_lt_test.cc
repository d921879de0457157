#include "matmul_lt.h"

#include <cuda_bf16.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "bf16_test_util.h"
#include "test_util.h"
#include "troupe/kernels/gelu.h"
#include "troupe/kernels/matmul.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomVector;
using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using testing::Bf16UlpDistance;
using testing::ExpectClose;
using testing::ExpectWithinOneBf16Ulp;
using testing::ToBf16;
using testing::ToDouble;

struct Expected {
  int32_t type;
  uint64_t rows, cols;
  int64_t ld;
};

void ExpectLayout(cublasLtMatrixLayout_t layout, const Expected& e, const char* what) {
  auto info = ReadLayout(layout);
  ASSERT_TRUE(info.ok()) << what << ": " << info.status();
  EXPECT_EQ(info->type, e.type) << what;
  EXPECT_EQ(info->order, CUBLASLT_ORDER_COL) << what;
  EXPECT_EQ(info->rows, e.rows) << what;
  EXPECT_EQ(info->cols, e.cols) << what;
  EXPECT_EQ(info->ld, e.ld) << what;
  EXPECT_EQ(info->batch_count, 1) << what;
  EXPECT_EQ(info->batch_stride, 0) << what;
}

// Attributes every plan shares: fp32 compute and scale, host alpha/beta, the preference.
void ExpectCommon(const MatmulPlan& p, const LtDescInfo& d) {
  EXPECT_EQ(d.compute_type, CUBLAS_COMPUTE_32F);
  EXPECT_EQ(d.scale_type, CUDA_R_32F);
  EXPECT_EQ(d.pointer_mode, CUBLASLT_POINTER_MODE_HOST);
  EXPECT_EQ(d.transc, CUBLAS_OP_N);
  EXPECT_EQ(d.bias_pointer, nullptr);  // set per call by BindMatmul
  EXPECT_EQ(d.aux_pointer, nullptr);
  EXPECT_EQ(p.alpha, 1.0f);
  auto pref = ReadPreference(p.preference.get());
  ASSERT_TRUE(pref.ok()) << pref.status();
  EXPECT_EQ(pref->max_workspace_bytes, kDefaultMatmulWorkspaceBytes);
  EXPECT_EQ(pref->min_alignment_a, 16u);
  EXPECT_EQ(pref->min_alignment_b, 16u);
  EXPECT_EQ(pref->min_alignment_c, 16u);
  EXPECT_EQ(pref->min_alignment_d, 16u);
}

int32_t LtTypeOf(MatmulDtype t) { return t == MatmulDtype::kBf16 ? CUDA_R_16BF : CUDA_R_32F; }

// --- Descriptors, read back -------------------------------------------------------------------

TEST(MatmulLtPlanTest, ForwardIsTransposedWeightTimesInputColumnMajor) {
  const int64_t n = 5, c = 3, oc = 8;
  for (MatmulDtype dtype : {MatmulDtype::kF32, MatmulDtype::kBf16}) {
    for (bool bias : {false, true}) {
      for (bool gelu : {false, true}) {
        SCOPED_TRACE(MatmulShape::Forward(n, c, oc, bias, gelu, dtype).ToString());
        auto plan = PlanMatmul(MatmulShape::Forward(n, c, oc, bias, gelu, dtype));
        ASSERT_TRUE(plan.ok()) << plan.status();
        auto d = ReadDesc(plan->desc.get());
        ASSERT_TRUE(d.ok()) << d.status();
        ExpectCommon(*plan, *d);
        EXPECT_EQ(plan->beta, 0.0f);
        EXPECT_EQ(d->transa, CUBLAS_OP_T);
        EXPECT_EQ(d->transb, CUBLAS_OP_N);
        const uint32_t epilogue = bias && gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                  : gelu       ? CUBLASLT_EPILOGUE_GELU_AUX
                                  : bias       ? CUBLASLT_EPILOGUE_BIAS
                                               : CUBLASLT_EPILOGUE_DEFAULT;
        EXPECT_EQ(d->epilogue, epilogue);
        EXPECT_EQ(d->bias_type, bias ? LtTypeOf(dtype) : -1);
        EXPECT_EQ(d->aux_ld, gelu ? oc : 0);
        EXPECT_EQ(d->aux_type, -1);  // D's type
        EXPECT_EQ(plan->m, oc);
        EXPECT_EQ(plan->n, n);
        EXPECT_EQ(plan->k, c);
        const int32_t t = LtTypeOf(dtype);
        ExpectLayout(plan->a.get(), {t, c, oc, c}, "A = weight [oc, c] row-major");
        ExpectLayout(plan->b.get(), {t, c, n, c}, "B = inp [n, c] row-major");
        ExpectLayout(plan->c.get(), {t, oc, n, oc}, "C = out");
        ExpectLayout(plan->d.get(), {t, oc, n, oc}, "D = out [n, oc] row-major");
      }
    }
  }
}

TEST(MatmulLtPlanTest, BackwardInputIsWeightTimesDoutColumnMajor) {
  const int64_t n = 5, c = 16, oc = 7;
  for (bool dgelu : {false, true}) {
    auto plan = PlanMatmul(MatmulShape::BackwardInput(n, c, oc, dgelu));
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto d = ReadDesc(plan->desc.get());
    ASSERT_TRUE(d.ok()) << d.status();
    ExpectCommon(*plan, *d);
    EXPECT_EQ(plan->beta, dgelu ? 0.0f : 1.0f);  // dinp += …, or DGELU's fresh gradient
    EXPECT_EQ(d->transa, CUBLAS_OP_N);
    EXPECT_EQ(d->transb, CUBLAS_OP_N);
    EXPECT_EQ(d->epilogue, dgelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT);
    EXPECT_EQ(d->aux_ld, dgelu ? c : 0);
    EXPECT_EQ(d->bias_type, -1);
    EXPECT_EQ(plan->m, c);
    EXPECT_EQ(plan->n, n);
    EXPECT_EQ(plan->k, oc);
    ExpectLayout(plan->a.get(), {CUDA_R_16BF, c, oc, c}, "A = weight");
    ExpectLayout(plan->b.get(), {CUDA_R_16BF, oc, n, oc}, "B = dout [n, oc] row-major");
    ExpectLayout(plan->c.get(), {CUDA_R_16BF, c, n, c}, "C = dinp");
    ExpectLayout(plan->d.get(), {CUDA_R_16BF, c, n, c}, "D = dinp [n, c] row-major");
  }
}

TEST(MatmulLtPlanTest, BackwardWeightIsInputTimesTransposedDoutWithBetaOne) {
  const int64_t n = 5, c = 3, oc = 7;
  auto plan = PlanMatmul(MatmulShape::BackwardWeight(n, c, oc, MatmulDtype::kF32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto d = ReadDesc(plan->desc.get());
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectCommon(*plan, *d);
  EXPECT_EQ(plan->beta, 1.0f);
  EXPECT_EQ(d->transa, CUBLAS_OP_N);
  EXPECT_EQ(d->transb, CUBLAS_OP_T);
  EXPECT_EQ(d->epilogue, CUBLASLT_EPILOGUE_DEFAULT);
  EXPECT_EQ(plan->m, c);
  EXPECT_EQ(plan->n, oc);
  EXPECT_EQ(plan->k, n);
  ExpectLayout(plan->a.get(), {CUDA_R_32F, c, n, c}, "A = inp");
  ExpectLayout(plan->b.get(), {CUDA_R_32F, oc, n, oc}, "B = dout");
  ExpectLayout(plan->c.get(), {CUDA_R_32F, c, oc, c}, "C = dweight");
  ExpectLayout(plan->d.get(), {CUDA_R_32F, c, oc, c}, "D = dweight [oc, c] row-major");
}

TEST(MatmulLtPlanTest, BackwardBiasIsDoutTimesOnesWithBetaOne) {
  const int64_t n = 5, oc = 7;
  auto plan = PlanMatmul(MatmulShape::BackwardBias(n, oc));
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto d = ReadDesc(plan->desc.get());
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectCommon(*plan, *d);
  EXPECT_EQ(plan->beta, 1.0f);
  EXPECT_EQ(d->transa, CUBLAS_OP_N);
  EXPECT_EQ(d->transb, CUBLAS_OP_N);
  EXPECT_EQ(plan->m, oc);
  EXPECT_EQ(plan->n, 1);
  EXPECT_EQ(plan->k, n);
  ExpectLayout(plan->a.get(), {CUDA_R_16BF, oc, n, oc}, "A = dout");
  ExpectLayout(plan->b.get(), {CUDA_R_16BF, n, 1, n}, "B = ones");
  ExpectLayout(plan->d.get(), {CUDA_R_16BF, oc, 1, oc}, "D = dbias");
}

TEST(MatmulLtPlanTest, PlansAndPreferencesTakeTheirOptions) {
  MatmulShape s = MatmulShape::Forward(4, 4, 4, false, false, MatmulDtype::kF32);
  s.alignment = 256;
  auto plan = PlanMatmul(s, /*workspace_bytes=*/4 << 20);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto pref = ReadPreference(plan->preference.get());
  ASSERT_TRUE(pref.ok()) << pref.status();
  EXPECT_EQ(pref->max_workspace_bytes, uint64_t{4} << 20);
  EXPECT_EQ(pref->min_alignment_a, 256u);
  EXPECT_EQ(pref->min_alignment_d, 256u);
}

TEST(MatmulLtPlanTest, BindSetsTheEpiloguePointersAndOperands) {
  auto plan = PlanMatmul(MatmulShape::Forward(2, 3, 8, true, true, MatmulDtype::kF32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  alignas(16) float out[16], inp[6], weight[24], bias[8], pre[16];
  MatmulBuffers b;
  b.out = out, b.inp = inp, b.weight = weight, b.bias = bias, b.pre_gelu = pre;
  auto call = BindMatmul(*plan, b);
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->a, weight);
  EXPECT_EQ(call->b, inp);
  EXPECT_EQ(call->c, out);
  EXPECT_EQ(call->d, out);
  EXPECT_EQ(*call->alpha, 1.0f);
  EXPECT_EQ(*call->beta, 0.0f);
  auto d = ReadDesc(plan->desc.get());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->bias_pointer, bias);
  EXPECT_EQ(d->aux_pointer, pre);
}

TEST(MatmulLtPlanTest, RejectsWhatCublasLtCannotRunAsAsked) {
  auto code = [](const MatmulShape& s) { return PlanMatmul(s).status().code(); };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  // The aux leading dimension (oc forward, c backward) must be a multiple of 8.
  auto st = PlanMatmul(MatmulShape::Forward(5, 3, 7, true, true)).status();
  EXPECT_EQ(st.code(), kInvalid);
  EXPECT_THAT(std::string(st.message()), HasSubstr("multiple of 8"));
  EXPECT_EQ(code(MatmulShape::BackwardInput(5, 7, 8, /*dgelu=*/true)), kInvalid);
  MatmulShape dgelu_acc = MatmulShape::BackwardInput(5, 8, 8, /*dgelu=*/true);
  dgelu_acc.accumulate = true;
  EXPECT_EQ(code(dgelu_acc), kInvalid);
  MatmulShape bias_bwd = MatmulShape::BackwardWeight(5, 3, 7);
  bias_bwd.bias = true;
  EXPECT_EQ(code(bias_bwd), kInvalid);
  EXPECT_EQ(code(MatmulShape::Forward(0, 3, 7, false, false)), kInvalid);
  EXPECT_EQ(code(MatmulShape::Forward(int64_t{1} << 31, 3, 7, false, false)), kInvalid);
  MatmulShape odd_align = MatmulShape::Forward(5, 3, 7, false, false);
  odd_align.alignment = 12;
  EXPECT_EQ(code(odd_align), kInvalid);

  // Binding: missing and misaligned buffers.
  auto plan = PlanMatmul(MatmulShape::Forward(2, 3, 4, true, false, MatmulDtype::kF32));
  ASSERT_TRUE(plan.ok());
  alignas(16) float buf[64];
  MatmulBuffers b;
  b.out = buf, b.inp = buf + 16, b.weight = buf + 32;
  st = BindMatmul(*plan, b).status();
  EXPECT_EQ(st.code(), kInvalid);
  EXPECT_THAT(std::string(st.message()), HasSubstr("buffers.bias is null"));
  b.bias = buf + 49;  // 4 bytes past a 16-byte boundary
  st = BindMatmul(*plan, b).status();
  EXPECT_EQ(st.code(), kInvalid);
  EXPECT_THAT(std::string(st.message()), HasSubstr("not aligned"));
}

// --- The CPU interpretation itself ------------------------------------------------------------

// Hand-built descriptors (row and column order, padded leading dimensions, both transposes)
// against the documented meaning, written out directly: element (r, c) of a COL matrix is at
// r + c·ld, of a ROW matrix at r·ld + c; D = alpha·op(A)·op(B) + beta·C.
TEST(ReferenceLtMatmulTest, FollowsTheDocumentedLayoutsAndOperations) {
  const int64_t m = 3, n = 2, k = 4;
  for (int order_a : {CUBLASLT_ORDER_COL, CUBLASLT_ORDER_ROW}) {
    for (int order_b : {CUBLASLT_ORDER_COL, CUBLASLT_ORDER_ROW}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << "orders " << order_a << order_b << " trans " << ta << tb);
          // Stored shapes, with 2 elements of padding per leading dimension (NaN, never read).
          const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
          const int64_t lda = (order_a == CUBLASLT_ORDER_COL ? ar : ac) + 2;
          const int64_t ldb = (order_b == CUBLASLT_ORDER_COL ? br : bc) + 2;
          const int64_t ldd = m + 1;
          auto at = [](int order, int64_t ld, int64_t r, int64_t c) {
            return order == CUBLASLT_ORDER_COL ? r + c * ld : r * ld + c;
          };
          std::vector<float> a(lda * (order_a == CUBLASLT_ORDER_COL ? ac : ar), kNaN);
          std::vector<float> b(ldb * (order_b == CUBLASLT_ORDER_COL ? bc : br), kNaN);
          std::vector<float> c(ldd * n, kNaN), d(ldd * n, kNaN);
          for (int64_t r = 0; r < ar; ++r) {
            for (int64_t q = 0; q < ac; ++q) a[at(order_a, lda, r, q)] = float(1 + r + 10 * q);
          }
          for (int64_t r = 0; r < br; ++r) {
            for (int64_t q = 0; q < bc; ++q) b[at(order_b, ldb, r, q)] = float(2 * r - q);
          }
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t i = 0; i < m; ++i) c[i + j * ldd] = float(100 * i + j);
          }

          cublasLtMatmulDesc_t desc;
          ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                    CUBLAS_STATUS_SUCCESS);
          LtDesc desc_owner(desc);
          const int32_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
          auto layout = [](uint64_t rows, uint64_t cols, int64_t ld, int32_t order) {
            cublasLtMatrixLayout_t l;
            EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, rows, cols, ld),
                      CUBLAS_STATUS_SUCCESS);
            cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order,
                                             sizeof(order));
            return LtLayout(l);
          };
          LtLayout la = layout(ar, ac, lda, order_a), lb = layout(br, bc, ldb, order_b);
          LtLayout lc = layout(m, n, ldd, CUBLASLT_ORDER_COL);
          LtLayout ld = layout(m, n, ldd, CUBLASLT_ORDER_COL);
          const float alpha = 0.5f, beta = 2.0f;
          LtCall call{desc,  &alpha,   a.data(), la.get(), b.data(), lb.get(),
                      &beta, c.data(), lc.get(), d.data(), ld.get()};
          ASSERT_TRUE(ReferenceLtMatmul(call).ok());
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double sum = 0;
              for (int64_t p = 0; p < k; ++p) {
                const double av = ta ? a[at(order_a, lda, p, i)] : a[at(order_a, lda, i, p)];
                const double bv = tb ? b[at(order_b, ldb, j, p)] : b[at(order_b, ldb, p, j)];
                sum += av * bv;
              }
              EXPECT_EQ(d[i + j * ldd], alpha * sum + beta * c[i + j * ldd]) << i << "," << j;
            }
          }
          for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(d[m + j * ldd])) << "D padding";
          // beta = 0: C is not read (NaN in C does not reach D).
          std::fill(c.begin(), c.end(), kNaN);
          const float zero = 0.0f;
          call.beta = &zero;
          ASSERT_TRUE(ReferenceLtMatmul(call).ok());
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t i = 0; i < m; ++i) EXPECT_FALSE(std::isnan(d[i + j * ldd]));
          }
        }
      }
    }
  }
}

TEST(ReferenceLtMatmulTest, RefusesWhatCublasLtWouldRefuse) {
  auto plan = PlanMatmul(MatmulShape::Forward(2, 3, 4, false, false, MatmulDtype::kF32));
  ASSERT_TRUE(plan.ok());
  alignas(16) float buf[64] = {};
  MatmulBuffers b;
  b.out = buf, b.inp = buf + 16, b.weight = buf + 32;
  auto call = BindMatmul(*plan, b);
  ASSERT_TRUE(call.ok());
  EXPECT_TRUE(ReferenceLtMatmul(*call).ok());
  LtCall swapped = *call;  // op(A) 4x3 and op(B) 3x2 no longer conform with each other's k
  std::swap(swapped.a_layout, swapped.b_layout);
  EXPECT_EQ(ReferenceLtMatmul(swapped).code(), absl::StatusCode::kInvalidArgument);
  LtCall no_d = *call;
  no_d.d = nullptr;
  EXPECT_EQ(ReferenceLtMatmul(no_d).code(), absl::StatusCode::kInvalidArgument);
  // An epilogue the plans never use.
  const uint32_t relu = CUBLASLT_EPILOGUE_RELU;
  cublasLtMatmulDescSetAttribute(plan->desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, &relu,
                                 sizeof(relu));
  EXPECT_EQ(ReferenceLtMatmul(*call).code(), absl::StatusCode::kUnimplemented);
}

// --- The plans, interpreted, against the CPU kernels --------------------------------------------

struct Dims {
  int64_t n, c, oc;
};
// Awkward shapes; GELU ones need the aux dimension (oc forward, c backward) divisible by 8.
constexpr Dims kShapes[] = {{5, 3, 7}, {1, 1, 1}, {33, 17, 9}, {2, 64, 3}, {7, 5, 40}};
constexpr Dims kGeluShapes[] = {{5, 8, 8}, {3, 16, 24}, {9, 24, 8}};

std::vector<float> F(const std::vector<double>& v) { return kernels::testing::ToFloat(v); }

TEST(MatmulLtReferenceTest, Fp32ForwardMatchesTheCpuKernel) {
  for (const Dims& s : kShapes) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(MatmulShape::Forward(s.n, s.c, s.oc, bias, false).ToString());
      const auto inp = RandomVector(s.n * s.c, 1), w = RandomVector(s.oc * s.c, 2);
      const auto b = RandomVector(s.oc, 3);
      std::vector<double> ref(s.n * s.oc);
      MatmulForward<double>(ref.data(), inp.data(), w.data(), bias ? b.data() : nullptr, s.n, s.c,
                            s.oc);
      auto inp_f = F(inp), w_f = F(w), b_f = F(b);
      std::vector<float> out(s.n * s.oc, kNaN);  // beta = 0 must not read it
      MatmulBuffers buf;
      buf.out = out.data(), buf.inp = inp_f.data(), buf.weight = w_f.data();
      buf.bias = bias ? b_f.data() : nullptr;
      ASSERT_TRUE(
          ReferenceMatmul(MatmulShape::Forward(s.n, s.c, s.oc, bias, false, MatmulDtype::kF32), buf)
              .ok());
      ExpectClose(out, ref, 1e-5, "out", /*floor=*/1.0);  // sums of O(1) products
    }
  }
}

TEST(MatmulLtReferenceTest, Fp32BackwardMatchesTheCpuKernel) {
  for (const Dims& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " c=" << s.c << " oc=" << s.oc);
    const auto inp = RandomVector(s.n * s.c, 4), w = RandomVector(s.oc * s.c, 5);
    const auto dout = RandomVector(s.n * s.oc, 6);
    // The GPU kernels accumulate onto existing gradients (the CPU one overwrites dinp).
    const auto dinp0 = RandomVector(s.n * s.c, 7), dw0 = RandomVector(s.oc * s.c, 8);
    const auto db0 = RandomVector(s.oc, 9);
    std::vector<double> dinp_ref(dinp0.size()), dw_ref = dw0, db_ref = db0;
    MatmulBackward<double>(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), inp.data(),
                           w.data(), s.n, s.c, s.oc);
    for (size_t i = 0; i < dinp0.size(); ++i) dinp_ref[i] += dinp0[i];  // the CPU one overwrites

    auto inp_f = F(inp), w_f = F(w), dout_f = F(dout);
    auto dinp = F(dinp0), dw = F(dw0), db = F(db0);
    MatmulBuffers bi, bw, bb;
    bi.out = dinp.data(), bi.dout = dout_f.data(), bi.weight = w_f.data();
    bw.out = dw.data(), bw.dout = dout_f.data(), bw.inp = inp_f.data();
    bb.out = db.data(), bb.dout = dout_f.data();
    const auto f32 = MatmulDtype::kF32;
    ASSERT_TRUE(ReferenceMatmul(MatmulShape::BackwardInput(s.n, s.c, s.oc, false, f32), bi).ok());
    ASSERT_TRUE(ReferenceMatmul(MatmulShape::BackwardWeight(s.n, s.c, s.oc, f32), bw).ok());
    ASSERT_TRUE(ReferenceMatmul(MatmulShape::BackwardBias(s.n, s.oc, f32), bb).ok());
    ExpectClose(dinp, dinp_ref, 1e-5, "dinp", 1.0);
    ExpectClose(dw, dw_ref, 1e-5, "dweight", 1.0);
    ExpectClose(db, db_ref, 1e-5, "dbias", 1.0);
  }
}

// The MLP's first layer forward (fch = ln · fcwᵀ + fcb, out = GELU(fch)) and the second layer's
// fused input gradient (dfch = GELU'(fch) ∘ (dout · fcprojw)).
TEST(MatmulLtReferenceTest, Fp32GeluEpiloguesMatchTheCpuKernels) {
  for (const Dims& s : kGeluShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " c=" << s.c << " oc=" << s.oc);
    for (bool bias : {false, true}) {
      const auto inp = RandomVector(s.n * s.c, 10), w = RandomVector(s.oc * s.c, 11);
      const auto b = RandomVector(s.oc, 12);
      std::vector<double> pre_ref(s.n * s.oc), out_ref(s.n * s.oc);
      MatmulForward<double>(pre_ref.data(), inp.data(), w.data(), bias ? b.data() : nullptr, s.n,
                            s.c, s.oc);
      GeluForward<double>(out_ref.data(), pre_ref.data(), s.n * s.oc);
      auto inp_f = F(inp), w_f = F(w), b_f = F(b);
      std::vector<float> out(s.n * s.oc), pre(s.n * s.oc);
      MatmulBuffers buf;
      buf.out = out.data(), buf.inp = inp_f.data(), buf.weight = w_f.data();
      buf.bias = bias ? b_f.data() : nullptr, buf.pre_gelu = pre.data();
      ASSERT_TRUE(
          ReferenceMatmul(MatmulShape::Forward(s.n, s.c, s.oc, bias, true, MatmulDtype::kF32), buf)
              .ok());
      ExpectClose(pre, pre_ref, 1e-5, "pre_gelu", 1.0);
      ExpectClose(out, out_ref, 1e-5, "out", 1.0);
    }
    // Backward through a layer whose input is GELU(pre), pre [n, c].
    const auto pre = RandomVector(s.n * s.c, 13, 3.0), w = RandomVector(s.oc * s.c, 14);
    const auto dout = RandomVector(s.n * s.oc, 15);
    std::vector<double> dh(s.n * s.c, 0.0), dw_unused(s.oc * s.c, 0.0), dpre_ref(s.n * s.c, 0.0);
    const std::vector<double> inp_unused(s.n * s.c, 0.0);
    MatmulBackward<double>(dh.data(), dw_unused.data(), nullptr, dout.data(), inp_unused.data(),
                           w.data(), s.n, s.c, s.oc);
    GeluBackward<double>(dpre_ref.data(), pre.data(), dh.data(), s.n * s.c);
    auto pre_f = F(pre), w_f = F(w), dout_f = F(dout);
    std::vector<float> dpre(s.n * s.c, kNaN);  // overwritten, not accumulated
    MatmulBuffers buf;
    buf.out = dpre.data(), buf.dout = dout_f.data(), buf.weight = w_f.data();
    buf.pre_gelu = pre_f.data();
    ASSERT_TRUE(
        ReferenceMatmul(
            MatmulShape::BackwardInput(s.n, s.c, s.oc, /*dgelu=*/true, MatmulDtype::kF32), buf)
            .ok());
    ExpectClose(dpre, dpre_ref, 1e-5, "dpre", 1.0);
  }
}

// bf16 storage: each output is one rounding of an fp32 computation from bf16 inputs, so within 1
// bf16 ulp of the double result from the same bf16 values, rounded.
TEST(MatmulLtReferenceTest, Bf16IsWithinOneUlpOfTheRoundedCpuResult) {
  const auto bf16 = MatmulDtype::kBf16;
  for (const Dims& s : kGeluShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " c=" << s.c << " oc=" << s.oc);
    const auto inp_b = ToBf16(RandomVector(s.n * s.c, 20)),
               w_b = ToBf16(RandomVector(s.oc * s.c, 21));
    const auto bias_b = ToBf16(RandomVector(s.oc, 22)),
               dout_b = ToBf16(RandomVector(s.n * s.oc, 23));
    const auto dinp0_b = ToBf16(RandomVector(s.n * s.c, 24)),
               dw0_b = ToBf16(RandomVector(s.oc * s.c, 25));
    const auto db0_b = ToBf16(RandomVector(s.oc, 26)),
               pre_in_b = ToBf16(RandomVector(s.n * s.c, 27, 3.0));
    const auto inp = ToDouble(inp_b), w = ToDouble(w_b), bias = ToDouble(bias_b);
    const auto dout = ToDouble(dout_b), pre_in = ToDouble(pre_in_b);

    // Forward with bias and GELU.
    std::vector<double> pre_ref(s.n * s.oc), out_ref(s.n * s.oc);
    MatmulForward<double>(pre_ref.data(), inp.data(), w.data(), bias.data(), s.n, s.c, s.oc);
    GeluForward<double>(out_ref.data(), pre_ref.data(), s.n * s.oc);
    std::vector<__nv_bfloat16> out(s.n * s.oc), pre(s.n * s.oc);
    MatmulBuffers f;
    f.out = out.data(), f.inp = inp_b.data(), f.weight = w_b.data(), f.bias = bias_b.data();
    f.pre_gelu = pre.data();
    ASSERT_TRUE(ReferenceMatmul(MatmulShape::Forward(s.n, s.c, s.oc, true, true, bf16), f).ok());
    ExpectWithinOneBf16Ulp(pre, pre_ref, "pre_gelu");
    ExpectWithinOneBf16Ulp(out, out_ref, "out");

    // Accumulating backward.
    const std::vector<double> dinp0 = ToDouble(dinp0_b);
    std::vector<double> dinp_ref(dinp0.size()), dw_ref = ToDouble(dw0_b);
    std::vector<double> db_ref = ToDouble(db0_b);
    MatmulBackward<double>(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), inp.data(),
                           w.data(), s.n, s.c, s.oc);
    for (size_t i = 0; i < dinp0.size(); ++i) dinp_ref[i] += dinp0[i];  // the CPU one overwrites
    auto dinp = dinp0_b, dw = dw0_b, db = db0_b;
    MatmulBuffers bi, bw, bb;
    bi.out = dinp.data(), bi.dout = dout_b.data(), bi.weight = w_b.data();
    bw.out = dw.data(), bw.dout = dout_b.data(), bw.inp = inp_b.data();
    bb.out = db.data(), bb.dout = dout_b.data();
    ASSERT_TRUE(ReferenceMatmul(MatmulShape::BackwardInput(s.n, s.c, s.oc, false, bf16), bi).ok());
    ASSERT_TRUE(ReferenceMatmul(MatmulShape::BackwardWeight(s.n, s.c, s.oc, bf16), bw).ok());
    ASSERT_TRUE(ReferenceMatmul(MatmulShape::BackwardBias(s.n, s.oc, bf16), bb).ok());
    ExpectWithinOneBf16Ulp(dinp, dinp_ref, "dinp");
    ExpectWithinOneBf16Ulp(dw, dw_ref, "dweight");
    ExpectWithinOneBf16Ulp(db, db_ref, "dbias");

    // DGELU.
    std::vector<double> dh(s.n * s.c, 0.0), dw_unused(s.oc * s.c, 0.0), dpre_ref(s.n * s.c, 0.0);
    MatmulBackward<double>(dh.data(), dw_unused.data(), nullptr, dout.data(), inp.data(), w.data(),
                           s.n, s.c, s.oc);
    GeluBackward<double>(dpre_ref.data(), pre_in.data(), dh.data(), s.n * s.c);
    std::vector<__nv_bfloat16> dpre(s.n * s.c);
    MatmulBuffers bd;
    bd.out = dpre.data(), bd.dout = dout_b.data(), bd.weight = w_b.data();
    bd.pre_gelu = const_cast<__nv_bfloat16*>(pre_in_b.data());
    ASSERT_TRUE(ReferenceMatmul(MatmulShape::BackwardInput(s.n, s.c, s.oc, true, bf16), bd).ok());
    ExpectWithinOneBf16Ulp(dpre, dpre_ref, "dpre");
  }
}

// --- The GPU runner -----------------------------------------------------------------------------

TEST(MatmulRunnerTest, CreateWithoutADriverFailsNamingIt) {
  auto runner = MatmulRunner::Create();
  if (runner.ok())
    GTEST_SKIP()
        << "a GPU is present; MatmulRunnerGpuTest (kernels_cuda_matmul_lt_gpu_test) covers it";
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kFailedPrecondition) << runner.status();
  EXPECT_THAT(std::string(runner.status().message()),
              ::testing::AnyOf(HasSubstr("cudaErrorInsufficientDriver"),
                               HasSubstr("cudaErrorNoDevice"), HasSubstr("no CUDA device")));
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr("matmul_lt.cc:"));
}

}  // namespace
}  // namespace troupe::kernels::cuda
