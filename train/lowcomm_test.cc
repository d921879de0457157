// The low-communication mode's arithmetic (lowcomm.h): the fragment schedule, error feedback that
// loses nothing over rounds, the outer Nesterov step against the formula written out here, and the
// robust rule against a corrupted group.
#include "troupe/train/lowcomm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "troupe/collectives/compression.h"

namespace troupe::train {
namespace {

using collectives::Compression;

std::vector<float> Random(uint32_t seed, size_t n, float scale) {
  std::mt19937 g(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * (static_cast<float>(g() % 20001) / 10000.0f - 1.0f);
  return v;
}

TEST(LowCommCoreTest, FragmentsCoverTheModelAndSyncStaggeredThroughTheRound) {
  int64_t next = 0;
  for (int32_t f = 0; f < 4; ++f) {
    const auto [lo, hi] = FragmentRange(10, 4, f);
    EXPECT_EQ(lo, next);
    EXPECT_GE(hi - lo, 2);
    EXPECT_LE(hi - lo, 3);
    next = hi;
  }
  EXPECT_EQ(next, 10);
  LowCommOptions o;
  o.inner_steps = 8;
  o.fragments = 4;  // fragment f after steps 8k + 2f, k >= 1
  std::map<int64_t, std::vector<int32_t>> due;
  for (int64_t s = 1; s <= 20; ++s) {
    if (auto d = FragmentsDueAfter(o, s, 30); !d.empty()) due[s] = d;
  }
  using V = std::vector<int32_t>;
  EXPECT_EQ(due, (std::map<int64_t, V>{
                     {8, {0}}, {10, {1}}, {12, {2}}, {14, {3}}, {16, {0}}, {18, {1}}, {20, {2}}}));
  EXPECT_EQ(FragmentsDueAfter(o, 30, 30), (V{0, 1, 2, 3})) << "all of them after the last step";
  o.fragments = 1;
  EXPECT_EQ(FragmentsDueAfter(o, 16, 30), (V{0}));
  EXPECT_TRUE(FragmentsDueAfter(o, 12, 30).empty());
}

// After every round, what was sent plus the residual is what the group meant to send, for both
// encodings, and the encodings are as small as promised.
TEST(LowCommCoreTest, ErrorFeedbackLosesNothingOverRounds) {
  constexpr size_t kN = 3000;
  for (const char* c : {"int8", "topk:0.02"}) {
    LowCommOptions o;
    ASSERT_TRUE(ParseCompression(c, &o).ok());
    std::vector<float> residual(kN, 0.0f);
    std::vector<double> meant(kN, 0.0), sent(kN, 0.0);
    const size_t bytes = collectives::CompressedBytes(o.compression, o.topk_fraction, kN);
    EXPECT_LT(bytes, kN * sizeof(float) / 3) << c;
    std::vector<uint8_t> enc(bytes);
    const std::vector<float> global(kN, 0.0f);
    for (int round = 0; round < 12; ++round) {
      const std::vector<float> local = Random(round + 1, kN, 0.01f * (round + 1));
      EncodePseudoGradient(o, global.data(), local.data(), kN, residual.data(), enc.data());
      std::vector<float> decoded(kN, 0.0f);
      collectives::DecodeAdd(o.compression, o.topk_fraction, enc.data(), kN, decoded.data());
      double worst = 0, scale = 0;
      for (size_t i = 0; i < kN; ++i) {
        meant[i] += static_cast<double>(global[i]) - local[i];
        sent[i] += decoded[i];
        worst = std::max(worst, std::abs(sent[i] + residual[i] - meant[i]));
        scale = std::max(scale, std::abs(meant[i]));
      }
      EXPECT_LE(worst, 1e-5 * scale) << c << " round " << round;
    }
  }
}

// The outer step, written out: the mean of the groups' Δ, m = μm + Δ̄, θ -= lr (Δ̄ + μm).
TEST(LowCommCoreTest, TheOuterStepIsNesterovOnTheMeanOfTheGroupsDeltas) {
  constexpr size_t kN = 700;
  LowCommOptions o;
  o.outer_lr = 0.7f;
  o.outer_momentum = 0.9f;
  std::vector<float> global = Random(7, kN, 1.0f), momentum(kN, 0.0f);
  std::vector<float> want_global = global, want_m(kN, 0.0f);
  std::vector<float> residual_a(kN, 0.0f), residual_b(kN, 0.0f);
  for (int round = 0; round < 3; ++round) {
    const std::vector<float> a = Random(100 + round, kN, 1.0f), b = Random(200 + round, kN, 1.0f);
    std::vector<uint8_t> ea(kN * 4), eb(kN * 4);
    EncodePseudoGradient(o, global.data(), a.data(), kN, residual_a.data(), ea.data());
    EncodePseudoGradient(o, global.data(), b.data(), kN, residual_b.data(), eb.data());
    absl::StatusOr<OuterOutcome> out =
        OuterStep(o, {{0, ea.data()}, {3, eb.data()}}, kN, global.data(), momentum.data());
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->applied, (std::vector<int32_t>{0, 3}));
    for (size_t i = 0; i < kN; ++i) {
      const float da = want_global[i] - a[i], db = want_global[i] - b[i];
      const float mean = (da + db) / 2.0f;
      want_m[i] = 0.9f * want_m[i] + mean;
      want_global[i] = want_global[i] - 0.7f * (mean + 0.9f * want_m[i]);
    }
    EXPECT_EQ(global, want_global) << "round " << round;
    EXPECT_EQ(momentum, want_m) << "round " << round;
  }
  EXPECT_FALSE(OuterStep(o, {{3, nullptr}, {1, nullptr}}, kN, global.data(), momentum.data()).ok())
      << "updates out of group order";
  const std::vector<float> before = global;
  absl::StatusOr<OuterOutcome> none = OuterStep(o, {}, kN, global.data(), momentum.data());
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->applied.empty());
  EXPECT_EQ(global, before) << "no group: no step";
}

// One group of four sends garbage (a huge update; then one that is not finite): rejected, the
// step is the other three's; clipped instead, it counts at the median's bound.
TEST(LowCommCoreTest, ACorruptedGroupIsRejectedOrClippedByTheMedianRule) {
  constexpr size_t kN = 512;
  LowCommOptions o;
  o.robust = RobustOuter::kReject;
  o.robust_factor = 3;
  const std::vector<float> start = Random(1, kN, 1.0f);
  std::vector<std::vector<uint8_t>> enc(4, std::vector<uint8_t>(kN * 4));
  auto encode = [&](int g, float scale) {
    std::vector<float> local = Random(50 + g, kN, 1.0f), residual(kN, 0.0f);
    for (size_t i = 0; i < kN; ++i) local[i] = start[i] - scale * (start[i] - local[i]);
    EncodePseudoGradient(o, start.data(), local.data(), kN, residual.data(), enc[g].data());
  };
  for (int g = 0; g < 4; ++g) encode(g, g == 2 ? 1000.0f : 1.0f);
  std::vector<GroupUpdate> all, good;
  for (int g = 0; g < 4; ++g) {
    all.push_back({g, enc[g].data()});
    if (g != 2) good.push_back({g, enc[g].data()});
  }
  std::vector<float> global = start, momentum(kN, 0.0f), ref = start, ref_m(kN, 0.0f);
  absl::StatusOr<OuterOutcome> out = OuterStep(o, all, kN, global.data(), momentum.data());
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->rejected, (std::vector<int32_t>{2}));
  EXPECT_EQ(out->applied, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_GT(out->norms[2], 100 * out->median_norm);
  ASSERT_TRUE(OuterStep(o, good, kN, ref.data(), ref_m.data()).ok());
  EXPECT_EQ(global, ref) << "the model is as if the corrupted group had not sent";

  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(enc[2].data(), &nan, sizeof(float));  // one value not a number
  o.robust = RobustOuter::kNone;
  global = start;
  std::fill(momentum.begin(), momentum.end(), 0.0f);
  out = OuterStep(o, all, kN, global.data(), momentum.data());
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->rejected, (std::vector<int32_t>{2})) << "not finite: left out even unguarded";
  EXPECT_EQ(global, ref);

  encode(2, 1000.0f);
  o.robust = RobustOuter::kClip;
  global = start;
  std::fill(momentum.begin(), momentum.end(), 0.0f);
  out = OuterStep(o, all, kN, global.data(), momentum.data());
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->clipped, (std::vector<int32_t>{2}));
  EXPECT_EQ(out->applied.size(), 4u);
  // The momentum after one step is the mean: group 2's part of it has the bound's norm.
  std::vector<float> three(kN, 0.0f);
  for (int g : {0, 1, 3})
    collectives::DecodeAdd(Compression::kNone, 0, enc[g].data(), kN, three.data());
  double norm2 = 0;
  for (size_t i = 0; i < kN; ++i) {
    const double part = 4.0 * momentum[i] - three[i];
    norm2 += part * part;
  }
  EXPECT_NEAR(std::sqrt(norm2), 3 * out->median_norm, 1e-3 * out->median_norm);
}

TEST(LowCommCoreTest, SpecTextIsParsedOrRefusedNamingWhatItGot) {
  LowCommOptions o;
  ASSERT_TRUE(ParseCompression("topk:0.03", &o).ok());
  EXPECT_EQ(o.compression, Compression::kTopK);
  EXPECT_EQ(CompressionName(o), "topk:0.03");
  for (const char* bad : {"topk:0", "topk:2", "topk:", "fp8", ""}) {
    absl::Status s = ParseCompression(bad, &o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find(absl::StrCat("got \"", bad, "\"")), std::string::npos) << s;
  }
  EXPECT_EQ(*ParseRobustOuter("clip"), RobustOuter::kClip);
  EXPECT_FALSE(ParseRobustOuter("median").ok());
}

}  // namespace
}  // namespace troupe::train
