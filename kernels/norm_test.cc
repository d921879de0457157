#include "troupe/kernels/norm.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace troupe::kernels {
namespace {

TEST(NormTest, TreeSumFollowsThePowerOfTwoSplit) {
  std::vector<double> v = {1e16, 1.0, -1e16, 1.0, 3.0};
  // T(0,5) = T(0,4) + T(4,5) = ((1e16 + 1) + (-1e16 + 1)) + 3 = (1e16 - 1e16) + 3 = 3
  EXPECT_EQ(TreeSum(v.data(), 5), 3.0);
  EXPECT_EQ(TreeSum(v.data(), 0), 0.0);
  std::vector<double> w = {1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(TreeSum(w.data(), 7), 28.0);
}

TEST(NormTest, ChunkSumsAreThreadIndependentAndCorrect) {
  const int64_t n = 3 * kNormChunk + kNormChunk / 3;  // four chunks, the last one partial
  const auto x = testing::ToFloat(testing::RandomVector(n, 1));
  double want = 0;
  for (float f : x) want += double(f) * f;
  std::vector<double> first;
  for (int threads : {1, 2, 3}) {
    SetNumThreads(threads);
    std::vector<double> chunks(4);
    ChunkSquareSums(x.data(), n, chunks.data());
    if (first.empty()) first = chunks;
    EXPECT_EQ(0, std::memcmp(first.data(), chunks.data(), 4 * sizeof(double)));
    EXPECT_NEAR(TreeSum(chunks.data(), 4), want, 1e-9 * want);
  }
  SetNumThreads(1);
}

}  // namespace
}  // namespace troupe::kernels
