#include "troupe/model/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace troupe::model {
namespace {

TEST(PhiloxTest, MatchesPublishedKnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  auto z = Philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(z, (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  auto f =
      Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(f, (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(RngTest, DrawsArePureFunctionsOfTheirKey) {
  EXPECT_EQ(NormalDouble(1, RngPurpose::kInit, 2, 3), NormalDouble(1, RngPurpose::kInit, 2, 3));
  EXPECT_NE(NormalDouble(1, RngPurpose::kInit, 2, 3), NormalDouble(2, RngPurpose::kInit, 2, 3));
  EXPECT_NE(NormalDouble(1, RngPurpose::kInit, 2, 3), NormalDouble(1, RngPurpose::kTest, 2, 3));
  EXPECT_NE(NormalDouble(1, RngPurpose::kInit, 2, 3), NormalDouble(1, RngPurpose::kInit, 2, 4));
}

TEST(RngTest, NormalHasUnitMomentsAndUniformIsInRange) {
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = NormalDouble(7, RngPurpose::kTest, 0, i);
    s += x;
    s2 += x * x;
    const double u = UniformDouble(7, RngPurpose::kTest, 1, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
}

TEST(PermuteIndexTest, IsABijectionThatDependsOnSeedAndEpoch) {
  for (uint64_t n : {1ull, 2ull, 3ull, 17ull, 1000ull, 4097ull}) {
    std::vector<int> seen(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t p = PermuteIndex(i, n, 42, 3);
      ASSERT_LT(p, n);
      ++seen[p];
    }
    for (int s : seen) EXPECT_EQ(s, 1) << "n=" << n;
  }
  int same_seed = 0, same_epoch = 0, identity = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_seed += PermuteIndex(i, 1000, 1, 0) == PermuteIndex(i, 1000, 2, 0);
    same_epoch += PermuteIndex(i, 1000, 1, 0) == PermuteIndex(i, 1000, 1, 1);
    identity += PermuteIndex(i, 1000, 1, 0) == i;
  }
  EXPECT_LT(same_seed, 20);
  EXPECT_LT(same_epoch, 20);
  EXPECT_LT(identity, 20);
}

}  // namespace
}  // namespace troupe::model
