#include "troupe/kernels/gelu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "test_util.h"

namespace troupe::kernels {
namespace {

using testing::RandomVector;

TEST(GeluTest, ForwardMatchesFormula) {
  auto inp = RandomVector(101, 1, 4.0);
  std::vector<double> out(inp.size());
  GeluForward(out.data(), inp.data(), inp.size());
  for (size_t i = 0; i < inp.size(); ++i) {
    const double x = inp[i];
    const double want = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(out[i], want, 1e-14);
  }
}

TEST(GeluTest, BackwardMatchesFiniteDifferences) {
  auto inp = RandomVector(211, 2, 3.0);
  const auto probe = RandomVector(inp.size(), 3);
  std::vector<double> out(inp.size()), dinp(inp.size(), 0);
  auto objective = [&] {
    GeluForward(out.data(), inp.data(), inp.size());
    return testing::Dot(out, probe);
  };
  GeluBackward(dinp.data(), inp.data(), probe.data(), inp.size());
  testing::ExpectGradientMatchesFd("dinp", inp, dinp, objective);
}

TEST(GeluTest, FloatMatchesDoubleAndIsBitIdenticalAcrossThreads) {
  const int64_t n = 70001;  // several blocks
  auto inp = RandomVector(n, 4, 3.0), dout = RandomVector(n, 5);
  std::vector<double> out_d(n), dinp_d(n, 0);
  GeluForward(out_d.data(), inp.data(), n);
  GeluBackward(dinp_d.data(), inp.data(), dout.data(), n);
  auto inp_f = testing::ToFloat(inp), dout_f = testing::ToFloat(dout);
  testing::ExpectSameBitsAtThreadCounts([&] {
    std::vector<float> out(n), dinp(n, 0);
    GeluForward(out.data(), inp_f.data(), n);
    GeluBackward(dinp.data(), inp_f.data(), dout_f.data(), n);
    EXPECT_LT(testing::RelErr(out, out_d), 1e-6);
    EXPECT_LT(testing::RelErr(dinp, dinp_d), 1e-6);
    std::vector<float> all = out;
    testing::Append(all, dinp);
    return all;
  });
}

TEST(GeluTest, BackwardWithoutAccumulateOverwritesWhatWasThere) {
  const int64_t n = 40001;
  auto inp = testing::ToFloat(RandomVector(n, 6, 3.0)), dout = testing::ToFloat(RandomVector(n, 7));
  std::vector<float> added(n, 0.0f), written(n, 123.0f);
  GeluBackward(added.data(), inp.data(), dout.data(), n);
  GeluBackward(written.data(), inp.data(), dout.data(), n, /*accumulate=*/false);
  ASSERT_EQ(written.size(), added.size());
  EXPECT_EQ(std::memcmp(written.data(), added.data(), added.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace troupe::kernels

#include "fast_math.h"

namespace troupe::kernels {
namespace {

TEST(FastMathTest, ExpFloatIsWithinAFewUlpOfLibm) {
  double worst = 0;
  for (float x = -80.0f; x < 40.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(internal::ExpFloat(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);  // 2.5 ulp of float
  EXPECT_EQ(internal::ExpFloat(0.0f), 1.0f);
  EXPECT_GT(internal::ExpFloat(-1000.0f), 0.0f);  // clamped, never 0 or NaN
  EXPECT_TRUE(std::isfinite(internal::ExpFloat(1000.0f)));
}

// Every length around the 8 lanes, the maximum in every position: LaneMax is the maximum.
TEST(FastMathTest, LaneMaxIsTheMaximumWhereverItIs) {
  for (int64_t n = 1; n <= 35; ++n) {
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = -1.0f - 0.25f * static_cast<float>((i * 7) % 13);
      x[at] = 0.5f;
      EXPECT_EQ(internal::LaneMax(x.data(), n), 0.5f) << "n=" << n << " at=" << at;
    }
  }
  const float negative[3] = {-3.0f, -2.0f, -5.0f};
  EXPECT_EQ(internal::LaneMax(negative, 3), -2.0f);
}

}  // namespace
}  // namespace troupe::kernels
