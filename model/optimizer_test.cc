#include "troupe/model/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "troupe/kernels/norm.h"
#include "troupe/model/rng.h"

namespace troupe::model {
namespace {

TEST(LrScheduleTest, WarmupThenCosineToMin) {
  LrSchedule s{/*max_lr=*/1.0f, /*min_lr=*/0.1f, /*warmup_steps=*/4, /*total_steps=*/104};
  EXPECT_FLOAT_EQ(s.At(0), 0.25f);
  EXPECT_FLOAT_EQ(s.At(3), 1.0f);
  EXPECT_FLOAT_EQ(s.At(4), 1.0f);
  EXPECT_NEAR(s.At(54), 0.55f, 1e-6);  // half way: the mean of max and min
  EXPECT_FLOAT_EQ(s.At(104), 0.1f);
  EXPECT_FLOAT_EQ(s.At(1000), 0.1f);
  for (int64_t i = 5; i < 104; ++i) EXPECT_LE(s.At(i), s.At(i - 1));
}

TEST(ClipTest, ClipFactorScalesTheNormToTheThreshold) {
  AdamWConfig c;
  c.max_grad_norm = 1.0f;
  EXPECT_EQ(ClipFactor(c, 0.5), 1.0f);
  EXPECT_NEAR(ClipFactor(c, 4.0), 0.25f, 1e-6);
  c.max_grad_norm = 0;
  EXPECT_EQ(ClipFactor(c, 4.0), 1.0f);
}

TEST(OptimizerTest, RangeUpdatesEqualTheWholeUpdateAndSkipDecayWhereNotMarked) {
  const GptConfig config{19, 5, 1, 2, 6};
  ParamLayout layout(config);
  const int64_t n = layout.total_size();
  std::vector<float> p0(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = NormalFloat(1, RngPurpose::kTest, 0, i);
    g[i] = NormalFloat(1, RngPurpose::kTest, 1, i);
  }
  AdamWConfig adamw;
  LrSchedule schedule{0.01f, 0.001f, 2, 10};
  const double norm = GradNorm(g.data(), n);
  double want = 0;
  for (float x : g) want += double(x) * x;
  EXPECT_NEAR(norm, std::sqrt(want), 1e-9 * norm);
  const auto s = StepScalars(adamw, schedule, 3, norm);
  EXPECT_NEAR(s.bias_correction1, 1 - std::pow(0.9, 4), 1e-7);
  std::vector<float> whole = p0, mw(n, 0), vw(n, 0);
  AdamWUpdateRange(layout, 0, n, whole.data(), g.data(), mw.data(), vw.data(), adamw, s);
  // Three owners with ranges that cut through tensors, each holding only its slice.
  std::vector<float> pieced;
  const int64_t cuts[] = {0, 50, 51, n};
  for (int r = 0; r < 3; ++r) {
    const int64_t lo = cuts[r], hi = cuts[r + 1];
    std::vector<float> p(p0.begin() + lo, p0.begin() + hi), m(hi - lo, 0), v(hi - lo, 0);
    AdamWUpdateRange(layout, lo, hi, p.data(), g.data() + lo, m.data(), v.data(), adamw, s);
    pieced.insert(pieced.end(), p.begin(), p.end());
  }
  EXPECT_EQ(0, std::memcmp(whole.data(), pieced.data(), n * sizeof(float)));
  // A LayerNorm gain gets no decay: with a zero gradient it does not move at all.
  std::vector<float> p = p0, m(n, 0), v(n, 0), zero(n, 0);
  AdamWUpdateRange(layout, 0, n, p.data(), zero.data(), m.data(), v.data(), adamw, s);
  const ParamTensor* ln = layout.Find("h.0.ln_1.weight");
  const ParamTensor* w = layout.Find("h.0.mlp.c_fc.weight");
  EXPECT_EQ(p[ln->offset], p0[ln->offset]);
  EXPECT_NEAR(p[w->offset], p0[w->offset] * (1 - s.lr * adamw.weight_decay), 1e-7);
}

TEST(OptimizerTest, RangeOwnersChunkSumsConcatenateToTheWholeNorm) {
  const int64_t chunk = kernels::kNormChunk;
  const int64_t n = 3 * chunk + 777;
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = NormalFloat(2, RngPurpose::kTest, 0, i);
  std::vector<double> pieces;
  for (auto [lo, hi] :
       {std::pair<int64_t, int64_t>{0, chunk}, {chunk, 3 * chunk}, {3 * chunk, n}}) {
    auto sums = RangeChunkSquareSums(g.data() + lo, lo, hi, n);
    ASSERT_TRUE(sums.ok()) << sums.status();
    pieces.insert(pieces.end(), sums->begin(), sums->end());
  }
  EXPECT_EQ(GradNormFromChunks(pieces), GradNorm(g.data(), n));
  const absl::Status bad = RangeChunkSquareSums(g.data() + 5, 5, chunk, n).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find(absl::StrCat("aligned to ", chunk)), absl::string_view::npos) << bad;
}

}  // namespace
}  // namespace troupe::model
