#include "troupe/kernels/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace troupe::kernels {
namespace {

TEST(ParallelTest, EveryBlockRunsExactlyOnceAtAnyThreadCount) {
  for (int threads : {1, 2, 3, 5}) {
    SetNumThreads(threads);
    EXPECT_EQ(NumThreads(), threads);
    std::vector<std::atomic<int>> hits(1000);
    for (int round = 0; round < 20; ++round) {
      ParallelFor(1000, [&](int64_t b) { hits[b].fetch_add(1); });
    }
    for (auto& h : hits) EXPECT_EQ(h.load(), 20);
  }
  SetNumThreads(1);
}

TEST(ParallelTest, RangesCoverExactlyAndNestedCallsRunInline) {
  SetNumThreads(3);
  std::vector<int> seen(1003, 0);
  ParallelForRange(1003, 100, [&](int64_t lo, int64_t hi) {
    EXPECT_EQ(lo % 100, 0);
    ParallelForRange(hi - lo, 7, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) seen[lo + i] += 1;
    });
  });
  for (int s : seen) EXPECT_EQ(s, 1);
  SetNumThreads(1);
}

}  // namespace
}  // namespace troupe::kernels
