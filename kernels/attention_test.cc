#include "troupe/kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.h"

namespace troupe::kernels {
namespace {

using testing::RandomVector;

// Direct loops over one causal head, as the textbook writes it.
std::vector<double> NaiveAttention(const std::vector<double>& qkv, int64_t b, int64_t t, int64_t c,
                                   int64_t nh) {
  const int64_t hs = c / nh;
  std::vector<double> out(b * t * c, 0);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t k = 0; k < hs; ++k) {
            d +=
                qkv[(bi * t + i) * 3 * c + h * hs + k] * qkv[(bi * t + j) * 3 * c + c + h * hs + k];
          }
          s[j] = d / std::sqrt(double(hs));
          mx = std::max(mx, s[j]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t k = 0; k < hs; ++k) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j)
            o += s[j] / sum * qkv[(bi * t + j) * 3 * c + 2 * c + h * hs + k];
          out[(bi * t + i) * c + h * hs + k] = o;
        }
      }
    }
  }
  return out;
}

// Sequence lengths below, at and across the kernel's 64-row causal blocks (150 = 64 + 64 + 22).
struct Shape {
  int64_t b, t, c, nh;
};
void CheckBackwardByFiniteDifferences(int64_t b, int64_t t, int64_t c, int64_t nh);
void CheckFloatAgainstDouble(int64_t b, int64_t t, int64_t c, int64_t nh);

TEST(AttentionTest, ForwardMatchesNaive) {
  for (const Shape& sh : {Shape{2, 7, 12, 3}, Shape{1, 64, 8, 2}, Shape{2, 150, 8, 2}}) {
    const int64_t b = sh.b, t = sh.t, c = sh.c, nh = sh.nh;
    SCOPED_TRACE(t);
    auto qkv = RandomVector(b * t * 3 * c, 1);
    std::vector<double> out(b * t * c), att(b * nh * t * t);
    AttentionForward(out.data(), att.data(), qkv.data(), b, t, c, nh);
    const auto want = NaiveAttention(qkv, b, t, c, nh);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-12) << i;
    for (int64_t i = 0; i < t; ++i) {  // causal: nothing above the diagonal
      for (int64_t j = i + 1; j < t; ++j) ASSERT_EQ(att[i * t + j], 0.0);
    }
  }
}

TEST(AttentionTest, BackwardMatchesFiniteDifferences) {
  for (const Shape& sh : {Shape{2, 5, 6, 2}, Shape{1, 70, 4, 2}}) {
    SCOPED_TRACE(sh.t);
    CheckBackwardByFiniteDifferences(sh.b, sh.t, sh.c, sh.nh);
  }
}

void CheckBackwardByFiniteDifferences(int64_t b, int64_t t, int64_t c, int64_t nh) {
  auto qkv = RandomVector(b * t * 3 * c, 2, 1.5);
  const auto probe = RandomVector(b * t * c, 3);
  std::vector<double> out(b * t * c), att(b * nh * t * t);
  auto objective = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), b, t, c, nh);
    return testing::Dot(out, probe);
  };
  objective();
  // Backward overwrites dqkv: what the buffer held before must not reach the result.
  std::vector<double> dqkv(qkv.size(), std::numeric_limits<double>::quiet_NaN());
  AttentionBackward(dqkv.data(), probe.data(), qkv.data(), att.data(), b, t, c, nh);
  testing::ExpectGradientMatchesFd("dqkv", qkv, dqkv, objective, 1000);
}

TEST(AttentionTest, FloatMatchesDoubleAndIsBitIdenticalAcrossThreads) {
  for (const Shape& sh : {Shape{3, 19, 20, 5}, Shape{2, 131, 16, 2}}) {
    SCOPED_TRACE(sh.t);
    CheckFloatAgainstDouble(sh.b, sh.t, sh.c, sh.nh);
  }
}

void CheckFloatAgainstDouble(int64_t b, int64_t t, int64_t c, int64_t nh) {
  auto qkv = RandomVector(b * t * 3 * c, 4), dout = RandomVector(b * t * c, 5);
  std::vector<double> out_d(b * t * c), att_d(b * nh * t * t), dqkv_d(qkv.size(), 0);
  AttentionForward(out_d.data(), att_d.data(), qkv.data(), b, t, c, nh);
  AttentionBackward(dqkv_d.data(), dout.data(), qkv.data(), att_d.data(), b, t, c, nh);
  auto qkv_f = testing::ToFloat(qkv), dout_f = testing::ToFloat(dout);
  testing::ExpectSameBitsAtThreadCounts([&] {
    std::vector<float> out(b * t * c), att(b * nh * t * t),
        dqkv(qkv.size(), std::numeric_limits<float>::quiet_NaN());
    AttentionForward(out.data(), att.data(), qkv_f.data(), b, t, c, nh);
    AttentionBackward(dqkv.data(), dout_f.data(), qkv_f.data(), att.data(), b, t, c, nh);
    EXPECT_LT(testing::RelErr(out, out_d), 1e-5);
    EXPECT_LT(testing::RelErr(dqkv, dqkv_d), 1e-5);
    std::vector<float> all = out;
    testing::Append(all, att);
    testing::Append(all, dqkv);
    return all;
  });
}

}  // namespace
}  // namespace troupe::kernels
