// The elastic step's range arithmetic, case by case with exact numbers: who owns which
// parameters, which microbatches a replica computes, where a range's mirror lives, and the
// range operations the step and the restores build their point-to-point moves from.
#include "troupe/train/shard_layout.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "troupe/kernels/norm.h"

namespace troupe::train {
namespace {

using Blocks = std::vector<std::pair<int32_t, int32_t>>;

TEST(ShardLayoutTest, ChunkAlignedRangesCoverTheParameters) {
  for (int w : {1, 2, 3, 4, 7}) {
    ShardLayout l = ShardLayout::Make(140000, w);
    EXPECT_EQ(l.per_rank % kernels::kNormChunk, 0);
    EXPECT_GE(l.padded(), 140000);
    EXPECT_EQ(l.begin(0), 0);
    for (int r = 0; r + 1 < w; ++r) EXPECT_EQ(l.end(r), l.begin(r + 1));
    EXPECT_EQ(l.end(w - 1), 140000);
  }
}

TEST(ShardLayoutTest, ExactRangesOfTenThousandOverThree) {
  const ShardLayout l = ShardLayout::Make(10000, 3);
  EXPECT_EQ(l.world, 3);
  EXPECT_EQ(l.num_params, 10000);
  EXPECT_EQ(l.per_rank, 4096);  // ceil(10000 / 3) = 3334, up to one 4 Ki chunk
  EXPECT_EQ(l.padded(), 12288);
  EXPECT_EQ(std::make_pair(l.begin(0), l.end(0)), std::make_pair(int64_t{0}, int64_t{4096}));
  EXPECT_EQ(std::make_pair(l.begin(1), l.end(1)), std::make_pair(int64_t{4096}, int64_t{8192}));
  EXPECT_EQ(std::make_pair(l.begin(2), l.end(2)), std::make_pair(int64_t{8192}, int64_t{10000}));
}

TEST(ShardLayoutTest, PerRankRoundsUpToWholeChunks) {
  EXPECT_EQ(ShardLayout::Make(4096, 1).per_rank, 4096);
  EXPECT_EQ(ShardLayout::Make(4097, 1).per_rank, 8192);
  EXPECT_EQ(ShardLayout::Make(8193, 2).per_rank, 8192);     // ceil(8193 / 2) = 4097
  EXPECT_EQ(ShardLayout::Make(140000, 7).per_rank, 20480);  // 20000 → 5 chunks
}

TEST(ShardLayoutTest, RanksBeyondTheModelOwnOnlyPadding) {
  const ShardLayout l = ShardLayout::Make(5000, 4);
  EXPECT_EQ(l.per_rank, 4096);
  EXPECT_EQ(l.padded(), 16384);
  EXPECT_EQ(l.end(1), 5000);
  for (int r : {2, 3}) {
    EXPECT_EQ(l.begin(r), 5000) << "rank " << r;
    EXPECT_EQ(l.end(r), 5000) << "rank " << r;
  }
}

TEST(ShardLayoutTest, AnEmptyModelAndAWorldBelowOne) {
  const ShardLayout l = ShardLayout::Make(0, 0);
  EXPECT_EQ(l.world, 1);
  EXPECT_EQ(l.per_rank, 4096);  // never zero: the norm's chunks need one
  EXPECT_EQ(l.begin(0), 0);
  EXPECT_EQ(l.end(0), 0);
}

TEST(ShardLayoutMicrobatchBlocks, PowerOfTwoAlignedSubtrees) {
  EXPECT_EQ(*MicrobatchBlocks(8, 1), (Blocks{{0, 8}}));
  EXPECT_EQ(*MicrobatchBlocks(8, 3), (Blocks{{0, 2}, {2, 4}, {4, 8}}));
  EXPECT_EQ(*MicrobatchBlocks(8, 4), (Blocks{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(*MicrobatchBlocks(6, 2), (Blocks{{0, 4}, {4, 6}}));
  EXPECT_EQ(*MicrobatchBlocks(7, 3), (Blocks{{0, 2}, {2, 4}, {4, 7}}));
  EXPECT_FALSE(MicrobatchBlocks(8, 9).ok());
  EXPECT_FALSE(MicrobatchBlocks(8, 0).ok());
}

TEST(ShardLayoutMicrobatchBlocks, OneMicrobatchEachWhenTheWorldIsM) {
  EXPECT_EQ(*MicrobatchBlocks(5, 5), (Blocks{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}}));
  // 5 splits at 4 (the largest power of two below it), then the first largest block each time.
  EXPECT_EQ(*MicrobatchBlocks(5, 2), (Blocks{{0, 4}, {4, 5}}));
  EXPECT_EQ(*MicrobatchBlocks(5, 3), (Blocks{{0, 2}, {2, 4}, {4, 5}}));
}

TEST(ShardLayoutMicrobatchBlocks, ABadWorldIsInvalidArgumentNamingTheBounds) {
  const absl::Status s = MicrobatchBlocks(8, 9).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "world size: expected 1 to 8 (the microbatches per step), got 9");
}

TEST(ShardLayoutMemoryRestore, NeedsOwnerOrBuddyOfEveryRange) {
  EXPECT_TRUE(MemoryRestorePossible(4, {2}));      // rank 2's buddy 3 survives
  EXPECT_FALSE(MemoryRestorePossible(4, {2, 3}));  // rank 2 and its buddy both gone
  EXPECT_FALSE(MemoryRestorePossible(1, {0}));
  EXPECT_TRUE(MemoryRestorePossible(4, {0, 1, 2}, 1, /*replicated=*/true));  // rank 3 holds all
  EXPECT_FALSE(MemoryRestorePossible(4, {0, 1, 2, 3}, 1, /*replicated=*/true));
  EXPECT_FALSE(MemoryRestorePossible(0, {}, 1, /*replicated=*/true));
  EXPECT_TRUE(MemoryRestorePossible(2, {0}));
  EXPECT_FALSE(MemoryRestorePossible(0, {}));  // no old group: nothing to restore from
  EXPECT_TRUE(MemoryRestorePossible(1, {}));
  EXPECT_TRUE(MemoryRestorePossible(8, {7}, 1));
  EXPECT_FALSE(MemoryRestorePossible(8, {0, 7}, 1));  // 7's buddy wraps around to 0
}

TEST(ShardLayoutMemoryRestore, TheBuddyOffsetSaysWhereEachMirrorIs) {
  // Two ranks in a row gone (one host of two): with offset 2 their mirrors are on the others.
  EXPECT_TRUE(MemoryRestorePossible(4, {2, 3}, 2));
  EXPECT_FALSE(MemoryRestorePossible(4, {2, 3}, 1));
  EXPECT_FALSE(MemoryRestorePossible(4, {1, 3}, 2));  // 1 and 3 mirror each other
}

TEST(ShardLayoutNewRank, KeptRanksCloseUpInTheirOrderAndGoneOnesAreMinusOne) {
  const std::vector<int> gone = {1, 4, 5};
  std::vector<int> got;
  for (int o = 0; o < 8; ++o) got.push_back(NewRank(gone, o));
  EXPECT_EQ(got, (std::vector<int>{0, -1, 1, 2, -1, -1, 3, 4}));
  EXPECT_EQ(NewRank({}, 6), 6);
}

TEST(ShardLayoutBuddyOffset, PutsEveryBuddyInAnotherDomainWhereTheGroupAllows) {
  using D = std::vector<std::string>;
  EXPECT_EQ(BuddyOffset(D{}), 1);
  EXPECT_EQ(BuddyOffset(D{"h1"}), 1);
  EXPECT_EQ(BuddyOffset(D{"h1", "h2", "h3", "h4"}), 1);
  EXPECT_EQ(BuddyOffset(D{"h1", "h1", "h2", "h2"}), 2);
  EXPECT_EQ(BuddyOffset(D{"h1", "h1", "h1", "h2", "h2", "h2"}), 3);
  EXPECT_EQ(BuddiesSharingADomain(D{"h1", "h1", "h1", "h2", "h2", "h2"}, 3), 0);
  // Survivors first, then a new host: h2 was lost, h4 joined.
  const D after = {"h1", "h1", "h3", "h3", "h4", "h4"};
  EXPECT_EQ(BuddiesSharingADomain(after, BuddyOffset(after)), 0);
  // One domain holds most ranks: no offset avoids it, the fewest sharing is chosen.
  const D most = {"a", "a", "a", "b"};
  EXPECT_EQ(BuddiesSharingADomain(most, BuddyOffset(most)), 2);
  EXPECT_EQ(BuddyOffset(D{"a", "a", "a"}), 1);  // one machine: every buddy shares it
}

// The search that stops early chooses what trying every offset chooses: the first with the
// fewest buddies sharing a domain.
TEST(ShardLayoutBuddyOffset, IsTheFirstOffsetWithTheFewestSharedDomains) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int w = 2 + static_cast<int>(rng() % 40), kinds = 1 + static_cast<int>(rng() % 6);
    std::vector<std::string> d(static_cast<size_t>(w));
    for (std::string& x : d) x = "h" + std::to_string(rng() % static_cast<unsigned>(kinds));
    int best = 1;
    for (int k = 2; k < w; ++k) {
      if (BuddiesSharingADomain(d, k) < BuddiesSharingADomain(d, best)) best = k;
    }
    ASSERT_EQ(BuddyOffset(d), best) << "trial " << trial;
  }
}

TEST(ShardLayoutBuddyOffset, BuddyAndMirroredRankAreInverses) {
  EXPECT_EQ(BuddyRank(3, 2, 4), 1);
  EXPECT_EQ(MirroredRank(1, 2, 4), 3);
  EXPECT_EQ(MirroredRank(0, 1, 4), 3);
  EXPECT_EQ(MirroredRank(0, 1, 1), 0);  // a world of one mirrors itself
  for (int w = 2; w <= 6; ++w) {
    for (int k = 1; k < w; ++k) {
      for (int r = 0; r < w; ++r) {
        EXPECT_EQ(MirroredRank(BuddyRank(r, k, w), k, w), r) << r << " + " << k << " mod " << w;
      }
    }
  }
}

TEST(ShardLayoutBuddyOffset, AValidOffsetIsBelowTheWorld) {
  EXPECT_TRUE(ValidBuddy(1, 1));  // a world of one: 1, nothing else
  EXPECT_FALSE(ValidBuddy(0, 1));
  EXPECT_FALSE(ValidBuddy(2, 1));
  EXPECT_TRUE(ValidBuddy(3, 4));
  EXPECT_FALSE(ValidBuddy(4, 4));
  EXPECT_FALSE(ValidBuddy(0, 4));
  EXPECT_FALSE(ValidBuddy(-1, 4));
}

TEST(ShardLayoutRanges, IntersectClipsEachRangeAndDropsEmptyPieces) {
  const Ranges r = {{0, 100}, {200, 300}, {400, 500}};
  EXPECT_EQ(Intersect(r, 50, 250), (Ranges{{50, 100}, {200, 250}}));
  EXPECT_EQ(Intersect(r, 100, 200), Ranges{});  // touches both, overlaps neither
  EXPECT_EQ(Intersect(r, 0, 1000), r);
  EXPECT_EQ(Intersect(r, 450, 450), Ranges{});
  EXPECT_EQ(Intersect(Ranges{}, 0, 10), Ranges{});
}

TEST(ShardLayoutRanges, PackedOffsetsLayTheRangesEndToEnd) {
  const Ranges r = {{10, 20}, {50, 55}, {100, 130}};
  EXPECT_EQ(TotalSize(r), 45);
  EXPECT_EQ(PackedOffset(r, 10), 0);
  EXPECT_EQ(PackedOffset(r, 19), 9);
  EXPECT_EQ(PackedOffset(r, 50), 10);
  EXPECT_EQ(PackedOffset(r, 54), 14);
  EXPECT_EQ(PackedOffset(r, 100), 15);
  EXPECT_EQ(PackedOffset(r, 129), 44);
  EXPECT_EQ(PackedOffset(r, 30), 45);  // in no range: past the end
  EXPECT_EQ(TotalSize(Ranges{}), 0);
}

TEST(ShardLayoutRanges, MergedSortsAndJoinsOverlappingOrTouchingRanges) {
  EXPECT_EQ(Merged({{50, 60}, {0, 10}, {10, 20}, {55, 70}, {30, 40}}),
            (Ranges{{0, 20}, {30, 40}, {50, 70}}));
  EXPECT_EQ(Merged({{0, 100}, {10, 20}}), (Ranges{{0, 100}}));  // one inside another
  EXPECT_EQ(Merged({}), Ranges{});
}

TEST(ShardLayoutRanges, ComplementIsTheGapsInOrder) {
  EXPECT_EQ(Complement({{10, 20}, {30, 40}}, 50), (Ranges{{0, 10}, {20, 30}, {40, 50}}));
  EXPECT_EQ(Complement({{0, 20}, {20, 50}}, 50), Ranges{});
  EXPECT_EQ(Complement({}, 7), (Ranges{{0, 7}}));
  EXPECT_EQ(Complement({{0, 5}}, 5), Ranges{});
}

}  // namespace
}  // namespace troupe::train
