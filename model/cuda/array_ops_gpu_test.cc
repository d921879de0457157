// The CUDA ArrayOps (array_ops_cuda.h) and GptDevice's device buffers on a real GPU (label gpu):
// every operation bit for bit against HostArrayOps on the same inputs, and the elastic trainer's
// range-wise optimizer step on GptDevice's own buffers equal to GptDevice::Step. Skips, saying
// why, where no GPU is usable; scripts/gpu-check runs it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "array_ops_cuda.h"
#include "bits_test_util.h"
#include "gpt_device.h"
#include "gpu_test_util.h"
#include "test_util.h"
#include "troupe/kernels/adamw.h"
#include "troupe/kernels/norm.h"
#include "troupe/model/array_ops.h"
#include "troupe/model/config.h"
#include "troupe/model/optimizer.h"

namespace troupe::model::cuda {
namespace {

using kernels::AdamWScalars;
using kernels::kNormChunk;
using kernels::cuda::testing::ExpectSameBits;
using kernels::cuda::testing::SpreadFloatsWithZeros;
using kernels::testing::RandomVector;

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const absl::Status assert_ok_status_ = expr;              \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_; \
  } while (false)

// A device array holding `host`.
model::FloatArray Upload(model::ArrayOps& ops, const std::vector<float>& host) {
  model::FloatArray a;
  EXPECT_TRUE(ops.Resize(&a, static_cast<int64_t>(host.size())).ok());
  EXPECT_TRUE(ops.CopyFromHost(a.data(), host.data(), a.size()).ok());
  return a;
}

std::vector<float> Download(model::ArrayOps& ops, const float* p, int64_t n) {
  std::vector<float> host(n);
  EXPECT_TRUE(ops.CopyToHost(host.data(), p, n).ok());
  return host;
}

class CudaArrayOpsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_SKIP_WITHOUT_GPU();
    absl::StatusOr<std::unique_ptr<model::ArrayOps>> ops = CreateCudaArrayOps(0);
    ASSERT_TRUE(ops.ok()) << ops.status();
    ops_ = std::move(*ops);
  }
  model::ArrayOps& host_ = model::HostArrayOps();
  std::unique_ptr<model::ArrayOps> ops_;
};

TEST_F(CudaArrayOpsGpuTest, ArraysAndCopiesKeepEveryBit) {
  EXPECT_EQ(ops_->name(), "cuda:0");
  EXPECT_FALSE(ops_->host_accessible());
  const int64_t n = 3 * kNormChunk + 77;
  const std::vector<float> x = SpreadFloatsWithZeros(n, 1);
  model::FloatArray a = Upload(*ops_, x);
  ExpectSameBits(Download(*ops_, a.data(), n), x, "round trip");
  // Resize to the same size keeps the contents; Assign fills, signed zero included.
  ASSERT_OK(ops_->Resize(&a, n));
  ExpectSameBits(Download(*ops_, a.data(), n), x, "after Resize(n)");
  model::FloatArray z;
  ASSERT_OK(ops_->Assign(&z, n, -0.0f));
  ExpectSameBits(Download(*ops_, z.data(), n), std::vector<float>(n, -0.0f), "Assign(-0)");
  // An array of another ArrayOps is replaced by one of this device.
  model::FloatArray h;
  ASSERT_OK(host_.Assign(&h, 5, 1.0f));
  ASSERT_OK(ops_->Assign(&h, 7, 2.5f));
  EXPECT_EQ(h.size(), 7);
  ExpectSameBits(Download(*ops_, h.data(), 7), std::vector<float>(7, 2.5f), "replaced");
  // Copy, disjoint and overlapping both ways (memmove), against the host.
  for (const auto& [dst, src, len] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {0, 0, n}, {100, 5000, 3000}, {0, 1, n - 1}, {1, 0, n - 1}, {40, 7, 1000}}) {
    SCOPED_TRACE(::testing::Message() << "Copy dst=" << dst << " src=" << src << " n=" << len);
    std::vector<float> want = x;
    ASSERT_OK(host_.Copy(want.data() + dst, want.data() + src, len));
    model::FloatArray d = Upload(*ops_, x);
    ASSERT_OK(ops_->Copy(d.data() + dst, d.data() + src, len));
    ExpectSameBits(Download(*ops_, d.data(), n), want, "after Copy");
  }
}

TEST_F(CudaArrayOpsGpuTest, FillAndAddMatchHostArrayOps) {
  for (int64_t n : {int64_t{1}, int64_t{257}, int64_t{(1 << 20) + 3}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> a = SpreadFloatsWithZeros(n + 1, n),
                             b = SpreadFloatsWithZeros(n, n + 7);
    std::vector<float> want = a;
    ASSERT_OK(host_.Add(want.data(), want.data(), b.data(), n));
    model::FloatArray da = Upload(*ops_, a), db = Upload(*ops_, b), dc = Upload(*ops_, a);
    ASSERT_OK(ops_->Add(dc.data(), da.data(), db.data(), n));  // into a third array
    ExpectSameBits(Download(*ops_, dc.data(), n), std::vector<float>(want.begin(), want.end() - 1),
                   "Add(c, a, b)");
    ExpectSameBits(Download(*ops_, da.data(), n + 1), a, "Add(c, a, b)'s a");
    ASSERT_OK(ops_->Add(dc.data(), da.data(), dc.data(), n));  // in place into y: a + (a + b)
    std::vector<float> a_plus_want(n);
    ASSERT_OK(host_.Add(a_plus_want.data(), a.data(), want.data(), n));
    ExpectSameBits(Download(*ops_, dc.data(), n), a_plus_want, "Add(c, a, c)");
    ASSERT_OK(ops_->Add(da.data(), da.data(), db.data(), n));
    ExpectSameBits(Download(*ops_, da.data(), n + 1), want, "Add(a, a, b)");  // a[n] untouched
    ASSERT_OK(host_.Add(want.data(), want.data(), want.data(), n));
    ASSERT_OK(ops_->Add(da.data(), da.data(), da.data(), n));
    ExpectSameBits(Download(*ops_, da.data(), n + 1), want, "Add(x, x, x)");
    ASSERT_OK(host_.Fill(want.data(), n, -0.0f));
    ASSERT_OK(ops_->Fill(da.data(), n, -0.0f));
    ExpectSameBits(Download(*ops_, da.data(), n + 1), want, "Fill");
  }
}

TEST_F(CudaArrayOpsGpuTest, RangeChunkSquareSumsMatchTheModel) {
  const int64_t c = kNormChunk, total = 5 * c + 1234;
  const std::vector<float> x = SpreadFloatsWithZeros(total, 3);
  model::FloatArray dx = Upload(*ops_, x);
  const std::pair<int64_t, int64_t> ranges[] = {
      {0, total}, {0, c},     {c, total}, {2 * c, 4 * c}, {5 * c, total},
      {c, c},     {1, total}, {0, c + 1}, {total, total}, {0, total + 1}};
  for (const auto& [begin, end] : ranges) {
    SCOPED_TRACE(::testing::Message() << "[" << begin << ", " << end << ")");
    const absl::StatusOr<std::vector<double>> want =
        host_.RangeChunkSquareSums(x.data() + begin, begin, end, total);
    const absl::StatusOr<std::vector<double>> got =
        ops_->RangeChunkSquareSums(dx.data() + begin, begin, end, total);
    ASSERT_EQ(got.status(), want.status());
    if (!want.ok()) continue;
    ASSERT_EQ(got->size(), want->size());
    EXPECT_EQ(0, std::memcmp(got->data(), want->data(), want->size() * sizeof(double)));
  }
}

// Tensors of awkward sizes, decay on and off; ranges starting and ending inside tensors; two
// steps from zero moments, range-local storage.
TEST_F(CudaArrayOpsGpuTest, AdamWUpdateRangeMatchesTheModel) {
  std::vector<model::ParamTensor> tensors;
  int64_t total = 0;
  int i = 0;
  for (int64_t size : {5, 300, 1, 64, 100000, 37}) {
    model::ParamTensor t;
    t.name = "t" + std::to_string(i);
    t.offset = total;
    t.size = size;
    t.shape = {size};
    t.decay = i % 3 == 0 || i == 4;
    tensors.push_back(t);
    total += size;
    ++i;
  }
  const std::vector<float> params = SpreadFloatsWithZeros(total, 11),
                           grads = SpreadFloatsWithZeros(total, 12);
  model::AdamWConfig config;
  config.weight_decay = 0.1f;
  model::LrSchedule schedule;
  schedule.warmup_steps = 2;
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
           {0, total}, {3, 700}, {306, 307}, {700, total}, {369, 370}, {1000, 1000}}) {
    SCOPED_TRACE(::testing::Message() << "[" << begin << ", " << end << ")");
    const int64_t n = end - begin;
    std::vector<float> p(params.begin() + begin, params.begin() + end);
    const std::vector<float> g(grads.begin() + begin, grads.begin() + end);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    model::FloatArray dp = Upload(*ops_, p), dg = Upload(*ops_, g), dm = Upload(*ops_, m),
                      dv = Upload(*ops_, v);
    // Step 0 in place; step 1 out of place into fresh arrays, from step 0's (left as they were).
    model::FloatArray op = Upload(*ops_, m), om = Upload(*ops_, m), ov = Upload(*ops_, m);
    std::vector<float> p0, m0, v0;  // the device's after step 0
    for (int64_t step = 0; step < 2; ++step) {
      const AdamWScalars s = model::StepScalars(config, schedule, step, /*grad_norm=*/2.7);
      ASSERT_OK(host_.AdamWUpdateRange(tensors, begin, end, p.data(), g.data(), m.data(), v.data(),
                                       config, s, nullptr));
      if (step == 0) {
        ASSERT_OK(ops_->AdamWUpdateRange(tensors, begin, end, dp.data(), dg.data(), dm.data(),
                                         dv.data(), config, s, nullptr));
        p0 = Download(*ops_, dp.data(), n);
        m0 = Download(*ops_, dm.data(), n);
        v0 = Download(*ops_, dv.data(), n);
      } else {
        const kernels::AdamWSources from{dp.data(), dm.data(), dv.data()};
        ASSERT_OK(ops_->AdamWUpdateRange(tensors, begin, end, op.data(), dg.data(), om.data(),
                                         ov.data(), config, s, &from));
      }
    }
    ExpectSameBits(Download(*ops_, op.data(), n), p, "params");
    ExpectSameBits(Download(*ops_, om.data(), n), m, "m");
    ExpectSameBits(Download(*ops_, ov.data(), n), v, "v");
    ExpectSameBits(Download(*ops_, dp.data(), n), p0, "source params");
    ExpectSameBits(Download(*ops_, dm.data(), n), m0, "source m");
    ExpectSameBits(Download(*ops_, dv.data(), n), v0, "source v");
  }
}

// --- GptDevice's device buffers --------------------------------------------------------------

std::vector<int32_t> Tokens(int64_t n, int32_t vocab, uint64_t seed) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + seed * 31) % vocab);
  return t;
}

// fp32: device_params / Fp32Grads are the buffers GetParams / GetGrads read; the elastic
// trainer's step (chunk sums of two ranges, the norm, one AdamW range update per owner, on
// array_ops()) gives GptDevice::Step's parameters bit for bit.
TEST(GptDeviceGpuTest, DeviceBuffersAndRangeWiseStepMatchStep) {
  TROUPE_SKIP_WITHOUT_GPU();
  const model::GptConfig config = model::GptConfig::Tiny(64);
  absl::StatusOr<std::unique_ptr<GptDevice>> a = GptDevice::Create(config, 0, /*bf16=*/false);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::unique_ptr<GptDevice>> b = GptDevice::Create(config, 0, /*bf16=*/false);
  ASSERT_TRUE(b.ok()) << b.status();
  const int64_t n = (*a)->num_params();
  const int bsz = 2, t = 16;
  const std::vector<int32_t> tokens = Tokens(bsz * t, 64, 1), targets = Tokens(bsz * t, 64, 2);
  for (GptDevice* g : {a->get(), b->get()}) {
    ASSERT_OK(g->InitParams(7));
    ASSERT_TRUE(g->Forward(tokens.data(), targets.data(), bsz, t).ok());
    ASSERT_OK(g->ZeroGrad());
    ASSERT_OK(g->Backward(1.0f / (bsz * t)));
    ASSERT_OK(g->Synchronize());
  }
  model::ArrayOps& ops = (*b)->array_ops();
  EXPECT_EQ(ops.name(), "cuda:0");
  absl::StatusOr<const float*> grads = (*b)->Fp32Grads();
  ASSERT_TRUE(grads.ok()) << grads.status();
  std::vector<float> want(n);
  ASSERT_OK((*b)->GetParams(want.data()));
  ExpectSameBits(Download(ops, (*b)->device_params(), n), want, "device_params");
  ASSERT_OK((*b)->GetGrads(want.data()));
  ExpectSameBits(Download(ops, *grads, n), want, "Fp32Grads");

  const model::AdamWConfig adamw;
  const model::LrSchedule schedule;
  absl::StatusOr<double> norm = (*a)->Step(adamw, schedule, /*step=*/0);
  ASSERT_TRUE(norm.ok()) << norm.status();
  // Two owners split at a chunk boundary, each with its own moments.
  const model::ParamLayout layout(config);
  const int64_t split = (n / 2) / kNormChunk * kNormChunk;
  std::vector<double> chunks;
  for (const auto& [lo, hi] : {std::pair<int64_t, int64_t>{0, split}, {split, n}}) {
    absl::StatusOr<std::vector<double>> part = ops.RangeChunkSquareSums(*grads + lo, lo, hi, n);
    ASSERT_TRUE(part.ok()) << part.status();
    chunks.insert(chunks.end(), part->begin(), part->end());
  }
  const double range_norm = model::GradNormFromChunks(chunks);
  EXPECT_EQ(range_norm, *norm);
  const AdamWScalars s = model::StepScalars(adamw, schedule, 0, range_norm);
  for (const auto& [lo, hi] : {std::pair<int64_t, int64_t>{0, split}, {split, n}}) {
    model::FloatArray m, v;
    ASSERT_OK(ops.Assign(&m, hi - lo, 0.0f));
    ASSERT_OK(ops.Assign(&v, hi - lo, 0.0f));
    ASSERT_OK(ops.AdamWUpdateRange(layout.tensors(), lo, hi, (*b)->device_params() + lo,
                                   *grads + lo, m.data(), v.data(), adamw, s, nullptr));
  }
  ASSERT_OK((*b)->ParamsChanged());
  std::vector<float> got(n);
  ASSERT_OK((*a)->GetParams(want.data()));
  ASSERT_OK((*b)->GetParams(got.data()));
  ExpectSameBits(got, want, "params after the step");
  // And the next forward reads them: the same loss.
  absl::StatusOr<double> la = (*a)->Forward(tokens.data(), targets.data(), bsz, t);
  absl::StatusOr<double> lb = (*b)->Forward(tokens.data(), targets.data(), bsz, t);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb);
}

// bf16: Fp32Grads widens the bf16 gradients (GetGrads' values); after device_params() is written
// through array_ops(),
// ParamsChanged() refreshes the bf16 copy: the next forward equals one after SetParams.
TEST(GptDeviceGpuTest, Bf16ParamsChangedRefreshesTheWeightCopy) {
  TROUPE_SKIP_WITHOUT_GPU();
  const model::GptConfig config = model::GptConfig::Tiny(64);
  absl::StatusOr<std::unique_ptr<GptDevice>> a = GptDevice::Create(config, 0, /*bf16=*/true);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::unique_ptr<GptDevice>> b = GptDevice::Create(config, 0, /*bf16=*/true);
  ASSERT_TRUE(b.ok()) << b.status();
  const int64_t n = (*a)->num_params();
  ASSERT_OK((*a)->InitParams(3));
  std::vector<float> params(n);
  ASSERT_OK((*a)->GetParams(params.data()));
  for (float& p : params) p *= 1.5f;
  const int bsz = 2, t = 8;
  const std::vector<int32_t> tokens = Tokens(bsz * t, 64, 3), targets = Tokens(bsz * t, 64, 4);
  ASSERT_OK((*a)->SetParams(params.data()));
  ASSERT_OK((*b)->InitParams(3));
  ASSERT_TRUE((*b)->Forward(tokens.data(), targets.data(), bsz, t).ok());  // reads the old copy
  ASSERT_OK((*b)->array_ops().CopyFromHost((*b)->device_params(), params.data(), n));
  ASSERT_OK((*b)->ParamsChanged());
  absl::StatusOr<double> la = (*a)->Forward(tokens.data(), targets.data(), bsz, t);
  absl::StatusOr<double> lb = (*b)->Forward(tokens.data(), targets.data(), bsz, t);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb);
  ASSERT_OK((*b)->ZeroGrad());
  ASSERT_OK((*b)->Backward(1.0f / (bsz * t)));
  absl::StatusOr<const float*> grads = (*b)->Fp32Grads();
  ASSERT_TRUE(grads.ok()) << grads.status();
  std::vector<float> want(n);
  ASSERT_OK((*b)->GetGrads(want.data()));
  ExpectSameBits(Download((*b)->array_ops(), *grads, n), want, "bf16 Fp32Grads");
  ASSERT_OK((*b)->Synchronize());
}

// Backward's reports on the GPU, fp32 and bf16: each range of Fp32Grads(), read on the model's
// stream when it is reported (what the elastic trainer's first operation on it sees), already
// holds the bits the pass ends with — the bits of a pass that reports nothing — and every
// parameter is reported once, in ln_f, blocks from the last, embeddings order.
TEST(GptDeviceGpuTest, BackwardReportsRangesFinalOnTheStream) {
  TROUPE_SKIP_WITHOUT_GPU();
  const model::GptConfig config = model::GptConfig::Tiny(64);
  const int bsz = 2, t = 16;
  const std::vector<int32_t> tokens = Tokens(bsz * t, 64, 5), targets = Tokens(bsz * t, 64, 6);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    absl::StatusOr<std::unique_ptr<GptDevice>> plain = GptDevice::Create(config, 0, bf16);
    ASSERT_TRUE(plain.ok()) << plain.status();
    absl::StatusOr<std::unique_ptr<GptDevice>> reporting = GptDevice::Create(config, 0, bf16);
    ASSERT_TRUE(reporting.ok()) << reporting.status();
    const int64_t n = (*plain)->num_params();
    for (GptDevice* g : {plain->get(), reporting->get()}) {
      ASSERT_OK(g->InitParams(11));
      ASSERT_TRUE(g->Forward(tokens.data(), targets.data(), bsz, t).ok());
      ASSERT_OK(g->ZeroGrad());
    }
    ASSERT_OK((*plain)->Backward(1.0f / (bsz * t)));
    absl::StatusOr<const float*> want_grads = (*plain)->Fp32Grads();
    ASSERT_TRUE(want_grads.ok()) << want_grads.status();
    const std::vector<float> want = Download((*plain)->array_ops(), *want_grads, n);

    GptDevice& g = **reporting;
    absl::StatusOr<const float*> grads = g.Fp32Grads();  // the buffer; fixed from now on
    ASSERT_TRUE(grads.ok()) << grads.status();
    std::vector<std::pair<int64_t, int64_t>> ranges;
    std::vector<float> seen(n, std::nanf(""));
    ASSERT_OK(g.Backward(1.0f / (bsz * t), [&](int64_t b, int64_t e) {
      ranges.emplace_back(b, e);
      EXPECT_TRUE(g.array_ops().CopyToHost(seen.data() + b, *grads + b, e - b).ok());
    }));
    ASSERT_EQ(ranges.size(), 2u + config.num_layers);
    const model::ParamLayout layout(config);
    EXPECT_EQ(ranges.front(), std::make_pair(layout.lnf_w(), n));
    EXPECT_EQ(ranges.back(), std::make_pair(layout.wte(), layout.block(0).ln1_w));
    ExpectSameBits(seen, want, "each range when reported");
    ExpectSameBits(Download(g.array_ops(), *grads, n), want, "after the pass");
  }
}

}  // namespace
}  // namespace troupe::model::cuda
