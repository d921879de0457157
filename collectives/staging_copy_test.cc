// StagingCopy: the copies are memcpy's, and the mode follows the measured times per size class.
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "algorithms.h"
#include "gtest/gtest.h"
#include "reduce.h"

namespace troupe::collectives {
namespace {

TEST(StagingCopyTest, BothCopiesAreMemcpyAtEveryLengthAndSourceOffset) {
  std::vector<uint8_t> src(4096 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + 11);
  for (bool streamed : {false, true}) {
    for (size_t offset : {0, 1, 4, 13}) {
      for (size_t bytes : {0, 1, 15, 16, 63, 64, 65, 1000, 4096}) {
        alignas(64) uint8_t dst[4096 + 64];
        std::memset(dst, 0xee, sizeof(dst));
        StagingCopy::Copy(streamed, dst, src.data() + offset, bytes);
        EXPECT_EQ(std::memcmp(dst, src.data() + offset, bytes), 0)
            << "streamed=" << streamed << " offset=" << offset << " bytes=" << bytes;
        EXPECT_EQ(dst[bytes], 0xee) << "wrote past the end: streamed=" << streamed;
      }
    }
  }
}

// Runs `ops` operations of one kind whose measured ones take `cached_s` / `streamed_s`; returns
// the modes the unmeasured ones took (true: streamed), in order.
std::vector<bool> RunOps(StagingCopy& s, size_t bytes, bool gather, int ops, double cached_s,
                         double streamed_s) {
  std::vector<bool> taken;
  for (int i = 0; i < ops; ++i) {
    const StagingCopy::Choice c = s.Next(bytes, gather);
    if (c.measure) {
      s.Record(bytes, gather, c.streamed, c.streamed ? streamed_s : cached_s);
    } else {
      taken.push_back(c.streamed);
    }
  }
  return taken;
}

TEST(StagingCopyTest, MeasuresBothModesAtFixedOperationsAndTakesTheFaster) {
  StagingCopy s;
  constexpr size_t kBytes = 1 << 20;
  // Operation 0 measures cached writes, operation 8 streamed ones: the same on every rank.
  StagingCopy::Choice c = s.Next(kBytes, true);
  EXPECT_TRUE(c.measure);
  EXPECT_FALSE(c.streamed);
  s.Record(kBytes, true, false, 300e-6);
  for (int i = 1; i < 8; ++i) {  // streamed not measured yet: cached
    c = s.Next(kBytes, true);
    EXPECT_FALSE(c.measure || c.streamed) << "operation " << i;
  }
  c = s.Next(kBytes, true);
  EXPECT_TRUE(c.measure);
  EXPECT_TRUE(c.streamed);
  s.Record(kBytes, true, true, 100e-6);
  // Streamed is 3x faster: every unmeasured operation takes it from now on.
  const std::vector<bool> taken = RunOps(s, kBytes, true, 40, 300e-6, 100e-6);
  EXPECT_EQ(taken.size(), 35u);  // operations 9..48 but the measured 16, 24, 32, 40 and 48
  for (bool streamed : taken) EXPECT_TRUE(streamed);
}

TEST(StagingCopyTest, FollowsTheMachineWhenTheFasterModeSlowsDown) {
  StagingCopy s;
  constexpr size_t kBytes = 8 << 20;
  std::vector<bool> taken = RunOps(s, kBytes, false, 32, 300e-6, 100e-6);
  EXPECT_TRUE(taken.back()) << "streamed should have been taken while it was faster";
  // Streamed writes become 3x slower than cached ones: within two measurements of each mode the
  // unmeasured operations go back to cached writes, and stay there.
  taken = RunOps(s, kBytes, false, 64, 300e-6, 900e-6);
  ASSERT_GE(taken.size(), 30u);
  for (size_t i = taken.size() - 30; i < taken.size(); ++i) EXPECT_FALSE(taken[i]) << i;
}

TEST(StagingCopyTest, KindsAreMeasuredApart) {
  StagingCopy s;
  RunOps(s, 1 << 20, true, 15, 300e-6, 100e-6);  // 1 MiB all-reduces prefer streamed writes...
  EXPECT_TRUE(s.Next(1 << 20, true).streamed);
  // ...which says nothing about 64 KiB ones, nor about 1 MiB reduce-scatters (no gather).
  for (auto [bytes, gather] : {std::pair<size_t, bool>{64 << 10, true}, {1 << 20, false}}) {
    const StagingCopy::Choice c = s.Next(bytes, gather);
    EXPECT_TRUE(c.measure) << bytes << " " << gather;
    EXPECT_FALSE(c.streamed) << bytes << " " << gather;
  }
}

// The same-host all-reduce reads the peers' buffers where a segment is one to four L2s, and
// stages elsewhere — and where the L2 is unknown.
TEST(StagingCopyTest, SameHostAllReduceReadsThePeersWhereASegmentIsOneToFourL2s) {
  constexpr size_t kL2 = size_t{2} << 20;
  EXPECT_FALSE(PreferSingleCopy(kL2 - 4, kL2));
  EXPECT_TRUE(PreferSingleCopy(kL2, kL2));
  EXPECT_TRUE(PreferSingleCopy(3 * kL2, kL2));
  EXPECT_TRUE(PreferSingleCopy(4 * kL2, kL2));
  EXPECT_FALSE(PreferSingleCopy(4 * kL2 + 4, kL2));
  EXPECT_FALSE(PreferSingleCopy(64 << 20, kL2));
  EXPECT_FALSE(PreferSingleCopy(kL2, 0));
}

}  // namespace
}  // namespace troupe::collectives
