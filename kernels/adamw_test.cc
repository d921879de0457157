#include "troupe/kernels/adamw.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace troupe::kernels {
namespace {

using testing::RandomVector;

AdamWScalars Scalars(int step) {
  AdamWScalars s;
  s.lr = 1e-2f;
  s.weight_decay = 0.1f;
  s.grad_scale = 0.7f;
  s.bias_correction1 = 1.0f - std::pow(s.beta1, step);
  s.bias_correction2 = 1.0f - std::pow(s.beta2, step);
  return s;
}

TEST(AdamWTest, MatchesDoubleReferenceOverSeveralSteps) {
  const int64_t n = 1001;
  auto p0 = RandomVector(n, 1);
  std::vector<double> p = p0, m(n, 0), v(n, 0);
  auto p_f = testing::ToFloat(p0);
  std::vector<float> m_f(n, 0), v_f(n, 0);
  for (int step = 1; step <= 5; ++step) {
    const auto g = RandomVector(n, 10 + step);
    const auto g_f = testing::ToFloat(g);
    const AdamWScalars s = Scalars(step);
    AdamWUpdate(p_f.data(), g_f.data(), m_f.data(), v_f.data(), n, s);
    for (int64_t i = 0; i < n; ++i) {  // torch.optim.AdamW, in double
      const double gi = g[i] * double(s.grad_scale);
      m[i] = s.beta1 * m[i] + (1 - double(s.beta1)) * gi;
      v[i] = s.beta2 * v[i] + (1 - double(s.beta2)) * gi * gi;
      const double denom = std::sqrt(v[i]) / std::sqrt(double(s.bias_correction2)) + s.eps;
      p[i] = p[i] * (1 - double(s.lr) * s.weight_decay) -
             s.lr / double(s.bias_correction1) * m[i] / denom;
    }
  }
  EXPECT_LT(testing::RelErr(p_f, p), 1e-6);
  EXPECT_LT(testing::RelErr(m_f, m), 1e-6);
  EXPECT_LT(testing::RelErr(v_f, v), 1e-5);
  EXPECT_GT(testing::RelErr(p_f, p0), 1e-3);  // it did move
}

TEST(AdamWTest, UpdatingRangesEqualsUpdatingTheWholeAndIsThreadIndependent) {
  const int64_t n = 100019;
  const auto p0 = testing::ToFloat(RandomVector(n, 2));
  const auto g = testing::ToFloat(RandomVector(n, 3));
  const AdamWScalars s = Scalars(3);
  std::vector<float> whole = p0, mw(n, 0.01f), vw(n, 0.02f);
  AdamWUpdate(whole.data(), g.data(), mw.data(), vw.data(), n, s);
  testing::ExpectSameBitsAtThreadCounts([&] {
    std::vector<float> p = p0, m(n, 0.01f), v(n, 0.02f);
    const int64_t cuts[] = {0, 7, 40000, 40001, n};
    for (int i = 0; i + 1 < 5; ++i) {
      AdamWUpdate(p.data() + cuts[i], g.data() + cuts[i], m.data() + cuts[i], v.data() + cuts[i],
                  cuts[i + 1] - cuts[i], s);
    }
    EXPECT_EQ(0, std::memcmp(p.data(), whole.data(), n * sizeof(float)));
    std::vector<float> all = p;
    testing::Append(all, m);
    testing::Append(all, v);
    return all;
  });
}

// Out of place: the bits of the in-place update at every thread count, its sources untouched.
TEST(AdamWTest, OutOfPlaceGivesTheInPlaceBitsAndLeavesItsSourcesAlone) {
  const int64_t n = 70001;
  const auto p0 = testing::ToFloat(RandomVector(n, 5));
  const auto g = testing::ToFloat(RandomVector(n, 6));
  const auto m0 = testing::ToFloat(RandomVector(n, 7));
  std::vector<float> v0 = testing::ToFloat(RandomVector(n, 8));
  for (float& x : v0) x = x * x;
  const AdamWScalars s = Scalars(2);
  std::vector<float> p = p0, m = m0, v = v0;
  AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, s);
  testing::ExpectSameBitsAtThreadCounts([&] {
    const std::vector<float> sp = p0, sm = m0, sv = v0;
    std::vector<float> op(n), om(n), ov(n);
    const AdamWSources from{sp.data(), sm.data(), sv.data()};
    AdamWUpdate(op.data(), g.data(), om.data(), ov.data(), n, s, &from);
    EXPECT_EQ(0, std::memcmp(op.data(), p.data(), n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(om.data(), m.data(), n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(ov.data(), v.data(), n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(sp.data(), p0.data(), n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(sm.data(), m0.data(), n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(sv.data(), v0.data(), n * sizeof(float)));
    std::vector<float> all = op;
    testing::Append(all, om);
    testing::Append(all, ov);
    return all;
  });
}

}  // namespace
}  // namespace troupe::kernels
