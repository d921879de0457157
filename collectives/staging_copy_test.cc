// StagingCopy: the copies are memcpy's, and the write mode and the same-host path follow the
// measured times per size class (the path as every rank agrees).
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
      s.Record(bytes, gather, c, c.streamed ? streamed_s : cached_s);
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
  s.Record(kBytes, true, c, 300e-6);
  for (int i = 1; i < 8; ++i) {  // streamed not measured yet: cached
    c = s.Next(kBytes, true);
    EXPECT_FALSE(c.measure || c.streamed) << "operation " << i;
  }
  c = s.Next(kBytes, true);
  EXPECT_TRUE(c.measure);
  EXPECT_TRUE(c.streamed);
  s.Record(kBytes, true, c, 100e-6);
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

// A group of ranks, each with its own StagingCopy, running operations of one kind: the measured
// operations take the times given per rank; a measured single copy exchanges the estimates and
// every rank agrees, as SameHostAllReduce does. Returns, per operation, the path every rank took
// (true: single copy); fails the test where the ranks' paths differ.
std::vector<bool> RunGroup(std::vector<StagingCopy>& ranks, size_t bytes, int ops, bool prior,
                           const std::vector<double>& staged_s,
                           const std::vector<double>& single_s) {
  std::vector<bool> paths;
  const int n = static_cast<int>(ranks.size());
  for (int i = 0; i < ops; ++i) {
    std::vector<StagingCopy::Choice> c(n);
    for (int r = 0; r < n; ++r) c[r] = ranks[r].Next(bytes, true, true, prior);
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(c[r].single_copy, c[0].single_copy) << "operation " << i << " rank " << r;
      EXPECT_EQ(c[r].measure, c[0].measure) << "operation " << i << " rank " << r;
    }
    paths.push_back(c[0].single_copy);
    if (!c[0].measure) continue;
    std::vector<StagingCopy::Estimate> all(n);
    for (int r = 0; r < n; ++r) all[r] = ranks[r].Estimated(bytes, true);
    for (int r = 0; r < n; ++r) {
      ranks[r].Record(bytes, true, c[r], c[r].single_copy ? single_s[r] : staged_s[r]);
      if (c[r].single_copy) ranks[r].Agree(bytes, true, all);
    }
  }
  return paths;
}

// Where the peers' buffers are readable, operation 4 of every 16 of a kind runs single copy and
// is timed; once every rank measured both paths, the group takes single copy where it is faster
// for the slowest rank.
TEST(StagingCopyTest, TakesSingleCopyOnceEveryRankMeasuredItFaster) {
  std::vector<StagingCopy> ranks(3);
  const std::vector<bool> paths =
      RunGroup(ranks, 1 << 20, 64, false, {300e-6, 310e-6, 320e-6}, {100e-6, 110e-6, 120e-6});
  ASSERT_EQ(paths.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    // Op 4 measures it; op 20 is the first exchange in which every rank has both estimates. Then
    // staging, 2.7x slower, is measured every 256 operations only (ops 256 and 264).
    EXPECT_EQ(paths[i], i % 16 == 4 || i > 20) << "operation " << i;
  }
}

// The slowest rank decides: one rank whose single copies are slow keeps the group staging.
TEST(StagingCopyTest, StaysStagedWhereOneRanksSingleCopyIsSlower) {
  std::vector<StagingCopy> ranks(3);
  const std::vector<bool> paths =
      RunGroup(ranks, 1 << 20, 64, false, {300e-6, 300e-6, 300e-6}, {100e-6, 900e-6, 100e-6});
  // Agreed at op 20, single copy 3x slower: measured again at op 260 only.
  for (int i = 0; i < 64; ++i) EXPECT_EQ(paths[i], i == 4 || i == 20) << "operation " << i;
}

// The prior holds until the first agreement, and the path follows the machine: single copy that
// becomes slower than staging is left at the next exchange.
TEST(StagingCopyTest, StartsFromThePriorAndFollowsTheMachine) {
  std::vector<StagingCopy> ranks(2);
  std::vector<bool> paths = RunGroup(ranks, 4 << 20, 32, true, {300e-6, 300e-6}, {100e-6, 100e-6});
  // Staged at its measurements only (ops 0, 8 and 16); after the agreement at op 20, 3x slower,
  // not before op 256.
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(paths[i], i != 0 && i != 8 && i != 16) << "operation " << i;
  }
  // Single copy now takes 3x staging's time. The exchange at op 36 still carries 100 us (a time
  // is recorded after its operation's exchange); op 36 records 900, averaging 500; the exchange
  // at op 52 carries that, slower than staging: from op 53 on the group stages. (Staging, the
  // path not taken after op 20, was measured every 256 operations meanwhile: at none of these.)
  paths = RunGroup(ranks, 4 << 20, 32, true, {300e-6, 300e-6}, {900e-6, 900e-6});
  for (int i = 0; i < 32; ++i) EXPECT_EQ(paths[i], 32 + i <= 52) << "operation " << 32 + i;
}

// Near a tie the path not taken keeps being measured every period; a path 5 % faster or less does
// not take over, one 10 % faster does.
TEST(StagingCopyTest, CloseTimesKeepBothMeasuredAndOnlyAClearLeadSwitches) {
  std::vector<StagingCopy> ranks(2);
  std::vector<bool> paths = RunGroup(ranks, 1 << 20, 64, false, {300e-6, 300e-6}, {290e-6, 290e-6});
  for (int i = 0; i < 64; ++i) EXPECT_EQ(paths[i], i % 16 == 4) << "operation " << i;
  std::vector<StagingCopy> again(2);
  paths = RunGroup(again, 1 << 20, 64, false, {300e-6, 300e-6}, {270e-6, 270e-6});
  // Agreed at op 20: single copy; staging (1.1x) still measured at ops 32, 40, 48 and 56.
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(paths[i], i % 16 == 4 || (i > 20 && i % 8 != 0)) << "operation " << i;
  }
}

// Where the peers' buffers cannot be read, nothing runs single copy, whatever the prior says.
TEST(StagingCopyTest, NeverSingleCopyWhereThePeersCannotBeRead) {
  StagingCopy s;
  for (int i = 0; i < 40; ++i) {
    const StagingCopy::Choice c = s.Next(1 << 20, true, /*can_read_peers=*/false, /*prior=*/true);
    EXPECT_FALSE(c.single_copy) << "operation " << i;
    EXPECT_EQ(c.measure, i % 16 == 0 || i % 16 == 8) << "operation " << i;
    if (c.measure) s.Record(1 << 20, true, c, 100e-6);
  }
}

// The prior of the same-host path: reading the peers' buffers where a segment is one to four L2s,
// staging elsewhere — and where the L2 is unknown.
TEST(StagingCopyTest, SameHostPriorReadsThePeersWhereASegmentIsOneToFourL2s) {
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
