#include "troupe/model/tree_sum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "troupe/kernels/norm.h"

namespace troupe::model {
namespace {

// The canonical tree, written recursively on scalars (kernels::TreeSum uses the same split).
TEST(TreeAccumulatorTest, MatchesTheRecursiveCanonicalTreeForEveryLeafCount) {
  for (int leaves = 1; leaves <= 13; ++leaves) {
    // Values chosen so that the order of additions changes the float result.
    std::vector<float> values;
    for (int i = 0; i < leaves; ++i)
      values.push_back(i % 3 == 0 ? 1e8f : (i % 3 == 1 ? 3.3f : -1e8f));
    TreeAccumulator acc(1);
    for (float v : values) ASSERT_TRUE(acc.Add(&v).ok());
    float got = 0;
    ASSERT_TRUE(acc.Finish(&got).ok());
    std::function<float(int, int)> tree = [&](int lo, int hi) -> float {
      if (hi - lo == 1) return values[lo];
      int half = 1;
      while (half * 2 < hi - lo) half *= 2;
      return tree(lo, lo + half) + tree(lo + half, hi);
    };
    EXPECT_EQ(got, tree(0, leaves)) << leaves << " leaves";
  }
}

TEST(TreeAccumulatorTest, EmptyGivesZerosAndFinishResets) {
  TreeAccumulator acc(3);
  std::vector<float> out(3, 9.0f);
  ASSERT_TRUE(acc.Finish(out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{0, 0, 0}));
  const float a[3] = {1, 2, 3};
  ASSERT_TRUE(acc.Add(a).ok());
  ASSERT_TRUE(acc.Add(a).ok());
  ASSERT_TRUE(acc.Finish(out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{2, 4, 6}));
  ASSERT_TRUE(acc.Add(a).ok());
  ASSERT_TRUE(acc.Finish(out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3}));
}

// Finishing the last leaf range by range (as a backward pass completes them) adds the same
// numbers in the same order as Add then Finish, for every leaf count, and changes nothing.
TEST(TreeAccumulatorTest, FinishRangeWithGivesAddThenFinishBitsRangeByRange) {
  constexpr int64_t kN = 10;
  for (int leaves = 1; leaves <= 9; ++leaves) {
    std::vector<std::vector<float>> values(leaves, std::vector<float>(kN));
    for (int l = 0; l < leaves; ++l) {
      for (int64_t i = 0; i < kN; ++i) {
        values[l][i] = (l + i) % 3 == 0 ? 1e8f : ((l + i) % 3 == 1 ? 3.3f + i : -1e8f);
      }
    }
    TreeAccumulator serial(kN), ranged(kN);
    for (int l = 0; l + 1 < leaves; ++l) {
      ASSERT_TRUE(serial.Add(values[l].data()).ok());
      ASSERT_TRUE(ranged.Add(values[l].data()).ok());
    }
    ASSERT_TRUE(serial.Add(values.back().data()).ok());
    std::vector<float> want(kN), got(kN, -1.0f);
    ASSERT_TRUE(serial.Finish(want.data()).ok());
    // Out of order, as a backward pass reports them: the tail first.
    for (const auto& [b, e] : {std::pair<int64_t, int64_t>{7, 10}, {3, 7}, {0, 3}}) {
      ASSERT_TRUE(ranged.FinishRangeWith(values.back().data(), b, e, got.data()).ok());
    }
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * kN)) << leaves << " leaves";
    EXPECT_EQ(ranged.leaves(), leaves - 1) << "FinishRangeWith changed the accumulator";
  }
  TreeAccumulator acc(4);
  float out[4];
  const float leaf[4] = {1, 2, 3, 4};
  const absl::Status bad = acc.FinishRangeWith(leaf, 2, 5, out);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("got [2, 5)"), std::string::npos) << bad;
}

}  // namespace
}  // namespace troupe::model
