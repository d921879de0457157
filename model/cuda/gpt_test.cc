#include "gpt.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "test_util.h"
#include "troupe/kernels/adamw.h"
#include "troupe/model/config.h"
#include "troupe/model/gpt.h"
#include "troupe/model/optimizer.h"

namespace troupe::model::cuda {
namespace {

using kernels::testing::RandomTokens;
namespace simt = kernels::simt;

// GptConfig::Tiny: 2 layers, 4 heads of 16, width 64; a vocabulary that is not a multiple of 8 or
// 32, and T not a multiple of the attention tile.
constexpr int kVocab = 97, kB = 2, kT = 19;
constexpr uint64_t kSeed = 42;
constexpr float kLossWeight = 1.0f / (kB * kT);
// bf16 path vs the float CPU model (GptCudaBf16Test says why).
constexpr double kBf16LossTolerance = 1e-4, kBf16GradTolerance = 2e-2;

model::GptConfig Config() { return model::GptConfig::Tiny(kVocab); }
const std::vector<model::ParamTensor>& Tensors() {
  static const model::ParamLayout* layout = new model::ParamLayout(Config());
  return layout->tensors();
}
model::AdamWConfig Adamw() { return model::AdamWConfig{}; }  // clip at 1, decay 0.1
model::LrSchedule Schedule() {
  model::LrSchedule s;
  s.max_lr = 1e-3f;
  s.warmup_steps = 0;
  return s;
}

struct Batch {
  std::vector<int32_t> tokens = RandomTokens(kB * kT, kVocab, 1);
  std::vector<int32_t> targets = RandomTokens(kB * kT, kVocab, 2);
};

// One training step's observable results.
struct StepResult {
  double loss = 0;
  std::vector<float> grads;
  double grad_norm = 0;
  std::vector<float> params, m, v;  // after the AdamW step
};

// The CUDA launch sequence on the CPU: SIMT kernels, GEMMs from the cuBLASLt plans.
// Tx = bf16: bf16 activations, weight copy and gradients (returned as float), fp32 master weights
// and moments; params_x receives the bf16 weights after the step.
template <typename Tx = float>
StepResult CudaStep(const GptCudaOptions& options = {}, std::vector<Tx>* params_x = nullptr) {
  StepResult r;
  const Batch batch;
  auto gpt = GptCuda<Tx>::Create(Config(), HostMemoryBackend(),
                                 std::make_unique<ReferenceMatmulExecutor>(), nullptr, options);
  EXPECT_TRUE(gpt.ok()) << gpt.status();
  if (!gpt.ok()) return r;
  GptCuda<Tx>& g = **gpt;
  EXPECT_TRUE(g.InitParams(kSeed).ok());
  absl::StatusOr<double> loss = g.Forward(batch.tokens.data(), batch.targets.data(), kB, kT);
  EXPECT_TRUE(loss.ok()) << loss.status();
  r.loss = loss.value_or(0);
  EXPECT_TRUE(g.ZeroGrad().ok());
  absl::Status s = g.Backward(kLossWeight);
  EXPECT_TRUE(s.ok()) << s;
  const int64_t n = g.num_params();
  r.grads.resize(n);
  EXPECT_TRUE(g.GetGrads(r.grads.data()).ok());
  absl::StatusOr<double> norm = g.Step(Adamw(), Schedule(), /*step=*/0);
  EXPECT_TRUE(norm.ok()) << norm.status();
  r.grad_norm = norm.value_or(0);
  r.params.resize(n);
  r.m.resize(n);
  r.v.resize(n);
  EXPECT_TRUE(g.GetParams(r.params.data()).ok());
  EXPECT_TRUE(g.GetOptimizerState(r.m.data(), r.v.data()).ok());
  if (params_x != nullptr) params_x->assign(g.params_x(), g.params_x() + n);  // host memory here
  return r;
}

// The CPU model's step, as model::Trainer takes it (one microbatch).
// With bf16_weights, from the initial weights rounded to bf16 (what the bf16 path computes with).
template <typename T>
StepResult CpuStep(bool bf16_weights = false) {
  StepResult r;
  const Batch batch;
  auto cpu = model::GptModel<T>::Create(Config());
  EXPECT_TRUE(cpu.ok());
  cpu->InitParams(kSeed);
  if (bf16_weights) {
    for (int64_t i = 0; i < cpu->num_params(); ++i) {
      cpu->params()[i] = __bfloat162float(__float2bfloat16(static_cast<float>(cpu->params()[i])));
    }
  }
  absl::StatusOr<double> loss = cpu->Forward(batch.tokens.data(), batch.targets.data(), kB, kT);
  EXPECT_TRUE(loss.ok()) << loss.status();
  r.loss = loss.value_or(0);
  cpu->ZeroGrad();
  EXPECT_TRUE(cpu->Backward(static_cast<T>(1.0 / (kB * kT))).ok());
  const int64_t n = cpu->num_params();
  r.grads.assign(cpu->grads(), cpu->grads() + n);
  r.params.assign(cpu->params(), cpu->params() + n);
  r.grad_norm = model::GradNorm(r.grads.data(), n);
  r.m.assign(n, 0.0f);
  r.v.assign(n, 0.0f);
  model::AdamWUpdateRange(cpu->layout(), 0, n, r.params.data(), r.grads.data(), r.m.data(),
                          r.v.data(), Adamw(),
                          model::StepScalars(Adamw(), Schedule(), 0, r.grad_norm));
  return r;
}

// ‖got − ref‖ / ‖ref‖ over one tensor.
double TensorRelErr(const std::vector<float>& got, const std::vector<float>& ref,
                    const model::ParamTensor& t) {
  double num = 0, den = 0;
  for (int64_t i = t.offset; i < t.offset + t.size; ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Every tensor of `got` within `tol` of `ref`, norm-wise; returns the worst error.
double ExpectTensorsClose(const std::vector<float>& got, const std::vector<float>& ref, double tol,
                          const char* what) {
  double worst = 0;
  for (const model::ParamTensor& t : Tensors()) {
    const double err = TensorRelErr(got, ref, t);
    EXPECT_LE(err, tol) << what << " of " << t.name;
    worst = std::max(worst, err);
  }
  return worst;
}

double RelDiff(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

// The SIMT step under each schedule and the CPU steps, each run once and shared by the tests
// (a SIMT step takes about a second).
const StepResult& CudaStepUnder(simt::Schedule schedule) {
  static auto* cache = new std::map<simt::Schedule, StepResult>;
  if (auto it = cache->find(schedule); it != cache->end()) return it->second;
  simt::ScopedSchedule scoped(schedule, /*seed=*/5);
  return cache->emplace(schedule, CudaStep()).first->second;
}
const StepResult& CpuFloatStep() {
  static const StepResult* r = new StepResult(CpuStep<float>());
  return *r;
}
const StepResult& CpuDoubleStep() {
  static const StepResult* r = new StepResult(CpuStep<double>());
  return *r;
}

class GptCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(GptCudaTest);

TEST_P(GptCudaTest, Fp32StepMatchesTheCpuModel) {
  const StepResult& gpu = CudaStepUnder(GetParam());
  const StepResult& cpu = CpuFloatStep();
  const double loss_err = RelDiff(gpu.loss, cpu.loss);
  EXPECT_LE(loss_err, 1e-5) << "loss " << gpu.loss << ", CPU " << cpu.loss;
  const double norm_err = RelDiff(gpu.grad_norm, cpu.grad_norm);
  EXPECT_LE(norm_err, 1e-5);
  const double grad_err = ExpectTensorsClose(gpu.grads, cpu.grads, 1e-5, "gradient");

  // Parameters after AdamW. Its first step moves each parameter by lr · g / (|g| + eps) (g the
  // clipped gradient): ±lr, insensitive to g's rounding, where |g| ≫ eps, but where |g| is near
  // eps or below, it amplifies g's absolute error by lr / eps = 1e5. That happens to gradients
  // that are rounding noise (those of the key biases: exactly zero, as a key bias adds q·b to all
  // scores of a query, which the softmax ignores; ~1e-11 on either fp32 side) or cancel to ~1e-8
  // (a few elements, both fp32 sides ~10% off the double model there). So: norm-wise 1e-5 per
  // tensor over the elements with |g| ≥ 100 eps, and the rest within what their gradients'
  // difference explains, lr · |Δg| / eps (the update's Lipschitz bound) plus 2 ulp.
  const double lr = Schedule().At(0), eps = Adamw().eps;
  const double gpu_clip = model::ClipFactor(Adamw(), gpu.grad_norm);
  const double cpu_clip = model::ClipFactor(Adamw(), cpu.grad_norm);
  double param_err = 0;
  int64_t ill_conditioned = 0;
  for (const model::ParamTensor& t : Tensors()) {
    double num = 0, den = 0;
    for (int64_t i = t.offset; i < t.offset + t.size; ++i) {
      const double d = double{gpu.params[i]} - cpu.params[i];
      const double g_gpu = gpu_clip * gpu.grads[i], g_cpu = cpu_clip * cpu.grads[i];
      if (std::fabs(g_cpu) >= 100 * eps) {
        num += d * d;
        den += double{cpu.params[i]} * cpu.params[i];
        continue;
      }
      ++ill_conditioned;
      const double ulp = std::ldexp(std::fabs(double{cpu.params[i]}), -23);
      EXPECT_LE(std::fabs(d), lr * std::fabs(g_gpu - g_cpu) / eps + 2 * ulp)
          << "updated " << t.name << "[" << i - t.offset << "], gradient " << gpu.grads[i]
          << ", CPU " << cpu.grads[i];
    }
    const double err = den > 0 ? std::sqrt(num / den) : 0;
    EXPECT_LE(err, 1e-5) << "updated parameter of " << t.name;
    param_err = std::max(param_err, err);
  }
  double gpu_exact = 0, cpu_exact = 0;
  for (const model::ParamTensor& t : Tensors()) {
    gpu_exact = std::max(gpu_exact, TensorRelErr(gpu.grads, CpuDoubleStep().grads, t));
    cpu_exact = std::max(cpu_exact, TensorRelErr(cpu.grads, CpuDoubleStep().grads, t));
  }
  std::printf(
      "fp32 SIMT vs CPU float model: loss %.2e, grad norm %.2e, worst tensor: gradient %.2e, "
      "after AdamW %.2e (%lld elements with |g| < 100 eps apart); worst tensor gradient vs the "
      "double model: SIMT %.2e, CPU float %.2e\n",
      loss_err, norm_err, grad_err, param_err, static_cast<long long>(ill_conditioned), gpu_exact,
      cpu_exact);
}

// Same bits under every thread schedule: no order-dependent sums anywhere in the step.
TEST(GptCudaDeterminism, BitIdenticalAcrossSchedules) {
  const StepResult& f = CudaStepUnder(simt::Schedule::kForward);
  for (simt::Schedule schedule : {simt::Schedule::kReverse, simt::Schedule::kShuffled}) {
    const StepResult& r = CudaStepUnder(schedule);
    const char* name = simt::ScheduleName(schedule);
    EXPECT_EQ(std::memcmp(&f.loss, &r.loss, sizeof(double)), 0) << name;
    EXPECT_EQ(std::memcmp(&f.grad_norm, &r.grad_norm, sizeof(double)), 0) << name;
    EXPECT_EQ(f.grads, r.grads) << name;
    EXPECT_EQ(f.params, r.params) << name;
    EXPECT_EQ(f.m, r.m) << name;
    EXPECT_EQ(f.v, r.v) << name;
  }
}

// The optimizer half alone: from the same gradients, the gradient norm and the AdamW update are
// the CPU's bit for bit (norm.cuh, adamw.cuh), with per-tensor weight decay as on the CPU.
TEST(GptCudaOptimizerTest, GradNormAndAdamWAreTheCpuBitsForTheSameGradients) {
  const StepResult& gpu = CudaStepUnder(simt::Schedule::kForward);
  const int64_t n = static_cast<int64_t>(gpu.grads.size());
  const double norm = model::GradNorm(gpu.grads.data(), n);
  EXPECT_EQ(gpu.grad_norm, norm);
  auto cpu = model::GptModel<float>::Create(Config());
  ASSERT_TRUE(cpu.ok());
  cpu->InitParams(kSeed);
  std::vector<float> params(cpu->params(), cpu->params() + n), m(n, 0.0f), v(n, 0.0f);
  model::AdamWUpdateRange(cpu->layout(), 0, n, params.data(), gpu.grads.data(), m.data(), v.data(),
                          Adamw(), model::StepScalars(Adamw(), Schedule(), 0, norm));
  EXPECT_EQ(params, gpu.params);
  EXPECT_EQ(m, gpu.m);
  EXPECT_EQ(v, gpu.v);
}

// GEMM + GELU kernels instead of the GELU_AUX_BIAS / DGELU epilogues: the same step within fp32
// rounding.
TEST(GptCudaGeluTest, KernelsInsteadOfEpiloguesGiveTheSameStep) {
  GptCudaOptions options;
  options.gelu_epilogue = false;
  const StepResult unfused = CudaStep(options);
  const StepResult& fused = CudaStepUnder(simt::Schedule::kForward);
  EXPECT_LE(RelDiff(unfused.loss, fused.loss), 1e-6);
  const double err = ExpectTensorsClose(unfused.grads, fused.grads, 1e-5, "gradient");
  std::printf("GELU kernels vs epilogues: loss %.2e, worst tensor gradient %.2e\n",
              RelDiff(unfused.loss, fused.loss), err);
}

// bf16 activations, weight copy and gradients. Every stored activation and gradient is rounded to
// bf16 (relative 2^-9 ≈ 2e-3 each), and those errors add up along the ~30 stored results of a
// layer's forward and backward. Measured against the float CPU model run from the same
// bf16-rounded weights: every tensor's gradient within 5e-3 to 6.4e-3 norm-wise (the bound, 2e-2,
// leaves a factor of 3), the loss within 1.6e-5 (a mean over tokens, whose independent rounding
// errors largely cancel; the bound, 1e-4, leaves a factor of 6). The optimizer half is exact: the
// norm and AdamW of the bf16 gradients are the CPU's bits for those gradients (as float), and the
// bf16 weight copy is the updated master weights rounded.
TEST(GptCudaBf16Test, StepIsCloseToTheCpuModelAndTheOptimizerExact) {
  std::vector<__nv_bfloat16> params_x;
  const StepResult gpu = CudaStep<__nv_bfloat16>({}, &params_x);
  const StepResult cpu = CpuStep<float>(/*bf16_weights=*/true);
  const double loss_err = RelDiff(gpu.loss, cpu.loss);
  EXPECT_LE(loss_err, kBf16LossTolerance) << "loss " << gpu.loss << ", CPU " << cpu.loss;
  const double grad_err = ExpectTensorsClose(gpu.grads, cpu.grads, kBf16GradTolerance, "gradient");
  std::printf(
      "bf16 SIMT vs CPU float model (bf16 weights): loss %.2e, worst tensor gradient %.2e\n",
      loss_err, grad_err);

  const int64_t n = static_cast<int64_t>(gpu.grads.size());
  const double norm = model::GradNorm(gpu.grads.data(), n);
  EXPECT_EQ(gpu.grad_norm, norm);
  auto init = model::GptModel<float>::Create(Config());
  ASSERT_TRUE(init.ok());
  init->InitParams(kSeed);
  std::vector<float> params(init->params(), init->params() + n), m(n, 0.0f), v(n, 0.0f);
  model::AdamWUpdateRange(init->layout(), 0, n, params.data(), gpu.grads.data(), m.data(), v.data(),
                          Adamw(), model::StepScalars(Adamw(), Schedule(), 0, norm));
  EXPECT_EQ(params, gpu.params);
  EXPECT_EQ(m, gpu.m);
  EXPECT_EQ(v, gpu.v);
  ASSERT_EQ(params_x.size(), params.size());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    mismatches += testing::Bf16UlpDistance(params_x[i], __float2bfloat16(params[i])) != 0;
  }
  EXPECT_EQ(mismatches, 0) << "bf16 weight copy != rounded master weights";
}

// Backward's reports (what the elastic trainer exchanges during the pass): the CPU model's
// ranges in its order, and each range of Fp32Grads() already holds its final value — bit for bit
// what the pass ends with — when it is reported. Both precisions (bf16: the widened copy).
template <typename Tx>
void ExpectReportsAreTheCpuModelsAndFinal() {
  using Range = std::pair<int64_t, int64_t>;
  const Batch batch;
  auto cpu = model::GptModel<float>::Create(Config());
  ASSERT_TRUE(cpu.ok());
  cpu->InitParams(kSeed);
  ASSERT_TRUE(cpu->Forward(batch.tokens.data(), batch.targets.data(), kB, kT).ok());
  cpu->ZeroGrad();
  std::vector<Range> cpu_ranges;
  ASSERT_TRUE(
      cpu->Backward(kLossWeight, [&](int64_t b, int64_t e) { cpu_ranges.emplace_back(b, e); })
          .ok());

  auto gpt = GptCuda<Tx>::Create(Config(), HostMemoryBackend(),
                                 std::make_unique<ReferenceMatmulExecutor>(), nullptr);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  GptCuda<Tx>& g = **gpt;
  ASSERT_TRUE(g.InitParams(kSeed).ok());
  // Two steps, the second after an optimizer step (new weights, new activations).
  for (int pass = 0; pass < 2; ++pass) {
    ASSERT_TRUE(g.Forward(batch.tokens.data(), batch.targets.data(), kB, kT).ok());
    ASSERT_TRUE(g.ZeroGrad().ok());
    absl::StatusOr<const float*> fp32 = g.Fp32Grads();  // the buffer the reports point into
    ASSERT_TRUE(fp32.ok()) << fp32.status();
    std::vector<Range> ranges;
    std::vector<std::vector<float>> at_report;
    ASSERT_TRUE(g.Backward(kLossWeight, [&](int64_t b, int64_t e) {
                   ranges.emplace_back(b, e);
                   at_report.emplace_back(*fp32 + b, *fp32 + e);  // host memory here
                 }).ok());
    EXPECT_EQ(ranges, cpu_ranges) << "pass " << pass;
    absl::StatusOr<const float*> final_grads = g.Fp32Grads();
    ASSERT_TRUE(final_grads.ok());
    EXPECT_EQ(*final_grads, *fp32) << "Fp32Grads() moved";
    int64_t covered = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto [b, e] = ranges[i];
      covered += e - b;
      EXPECT_TRUE(std::equal(at_report[i].begin(), at_report[i].end(), *final_grads + b))
          << "pass " << pass << ": range [" << b << ", " << e << ") changed after its report";
    }
    EXPECT_EQ(covered, g.num_params()) << "every gradient is reported once";
    if (pass == 0) {
      ASSERT_TRUE(g.Step(Adamw(), Schedule(), /*step=*/0).ok());
    }
  }
}

TEST(GptCudaBackwardReportTest, Fp32RangesAreTheCpuModelsAndFinalWhenReported) {
  ExpectReportsAreTheCpuModelsAndFinal<float>();
}
TEST(GptCudaBackwardReportTest, Bf16WidenedRangesAreTheCpuModelsAndFinalWhenReported) {
  ExpectReportsAreTheCpuModelsAndFinal<__nv_bfloat16>();
}

TEST(GptCudaApiTest, RejectsWhatTheCpuModelRejects) {
  auto gpt = GptCuda<float>::Create(Config(), HostMemoryBackend(),
                                    std::make_unique<ReferenceMatmulExecutor>(), nullptr);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  std::vector<int32_t> tokens(4, 1), bad = {1, 2, kVocab, 3};
  EXPECT_EQ((*gpt)->Forward(tokens.data(), bad.data(), 1, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*gpt)->Forward(tokens.data(), nullptr, 1, 65).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*gpt)->Forward(tokens.data(), nullptr, 1, 4).ok());
  EXPECT_EQ((*gpt)->Backward(1.0f).code(), absl::StatusCode::kFailedPrecondition);
  // Another (B, T): the activations are reallocated; the step runs.
  ASSERT_TRUE((*gpt)->Forward(tokens.data(), tokens.data(), 2, 2).ok());
  EXPECT_TRUE((*gpt)->Backward(0.25f).ok());
  model::GptConfig odd = Config();
  odd.width = 66;  // not a multiple of num_heads
  EXPECT_FALSE(GptCuda<float>::Create(odd, HostMemoryBackend(),
                                      std::make_unique<ReferenceMatmulExecutor>(), nullptr)
                   .ok());
}

}  // namespace
}  // namespace troupe::model::cuda
