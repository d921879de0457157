#include "troupe/kernels/residual.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace troupe::kernels {
namespace {

using testing::RandomVector;

TEST(ResidualTest, BackwardMatchesFiniteDifferences) {
  auto a = RandomVector(97, 1), b = RandomVector(97, 2);
  const auto probe = RandomVector(97, 3);
  std::vector<double> out(97), da(97, 0), db(97, 0);
  auto objective = [&] {
    ResidualForward(out.data(), a.data(), b.data(), 97);
    return testing::Dot(out, probe);
  };
  ResidualBackward(da.data(), db.data(), probe.data(), 97);
  testing::ExpectGradientMatchesFd("da", a, da, objective);
  testing::ExpectGradientMatchesFd("db", b, db, objective);
}

TEST(ResidualTest, BitIdenticalAcrossThreads) {
  const int64_t n = 100003;
  auto a = testing::ToFloat(RandomVector(n, 4)), b = testing::ToFloat(RandomVector(n, 5)),
       dout = testing::ToFloat(RandomVector(n, 6));
  testing::ExpectSameBitsAtThreadCounts([&] {
    std::vector<float> out(n), da(n, 1.0f), db(n, 2.0f);
    ResidualForward(out.data(), a.data(), b.data(), n);
    ResidualBackward(da.data(), db.data(), dout.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
    std::vector<float> all = out;
    testing::Append(all, da);
    testing::Append(all, db);
    return all;
  });
}

}  // namespace
}  // namespace troupe::kernels
