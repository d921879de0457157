#include "troupe/model/tree_sum.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace troupe::model
