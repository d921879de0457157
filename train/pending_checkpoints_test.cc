// PendingCheckpoints, exactly: which shards a checkpoint waits for, when it is complete, which
// reports count, and the manifest it ends with.
#include "troupe/train/pending_checkpoints.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace troupe::train {
namespace {

ShardFileInfo Shard(int32_t rank, int64_t begin, int64_t end) {
  return ShardFileInfo{"rank-" + std::to_string(rank), begin, end, 1, 1};
}

std::vector<std::string> Names(const std::vector<ShardFileInfo>& shards) {
  std::vector<std::string> names;
  for (const ShardFileInfo& s : shards) names.push_back(s.name);
  return names;
}

constexpr int64_t kChunk = 65536;

TEST(PendingCheckpointsTest, EveryRanksShardCompletesTheCheckpointAndTheManifestIsByRank) {
  PendingCheckpoints p;
  p.Expect(/*step=*/4, /*generation=*/1, 4 * kChunk, /*world=*/4);
  EXPECT_TRUE(p.Contains(4));
  EXPECT_EQ(p.DebugString(), "PendingCheckpoints{s4:g1,0/4}");
  // In any order; the last one in completes it.
  EXPECT_FALSE(p.AddShard(4, 2, Shard(2, 2 * kChunk, 3 * kChunk)));
  EXPECT_FALSE(p.AddShard(4, 0, Shard(0, 0, kChunk)));
  EXPECT_FALSE(p.AddShard(4, 3, Shard(3, 3 * kChunk, 4 * kChunk)));
  EXPECT_TRUE(p.AddShard(4, 1, Shard(1, kChunk, 2 * kChunk)));
  const PendingCheckpoints::Ready ready = p.StartCommit(4);
  EXPECT_EQ(ready.generation, 1u);
  EXPECT_EQ(ready.world, 4);
  EXPECT_EQ(Names(ready.shards),
            (std::vector<std::string>{"rank-0", "rank-1", "rank-2", "rank-3"}));
  EXPECT_EQ(p.DebugString(), "PendingCheckpoints{s4:g1,4/4,committing}");
}

TEST(PendingCheckpointsTest, ARankThatOwnsOnlyPaddingWritesNoShardAndIsNotAwaited) {
  PendingCheckpoints p;
  // 10000 parameters over 4 ranks: 4 Ki each, so rank 3 owns only padding.
  p.Expect(2, 1, 10000, 4);
  EXPECT_FALSE(p.AddShard(2, 0, Shard(0, 0, 4096)));
  EXPECT_FALSE(p.AddShard(2, 1, Shard(1, 4096, 8192)));
  EXPECT_TRUE(p.AddShard(2, 2, Shard(2, 8192, 10000)));
  EXPECT_EQ(p.StartCommit(2).world, 4);
}

TEST(PendingCheckpointsTest, OnlyReportsOfTheAskingGenerationCountUntilTheCommitStarts) {
  PendingCheckpoints p;
  p.Expect(6, 3, kChunk, 1);
  EXPECT_TRUE(p.Accepts(6, 3));
  EXPECT_FALSE(p.Accepts(6, 2));  // a slow rank of an older generation
  EXPECT_FALSE(p.Accepts(5, 3));  // a step never asked
  EXPECT_TRUE(p.AddShard(6, 0, Shard(0, 0, kChunk)));
  p.StartCommit(6);
  EXPECT_FALSE(p.Accepts(6, 3));  // committing: a late duplicate changes nothing
  EXPECT_TRUE(p.Contains(6));     // ... and the end of the job waits for it
  p.Erase(6);
  EXPECT_FALSE(p.Contains(6));
  EXPECT_TRUE(p.empty());
}

TEST(PendingCheckpointsTest, AShardReportedTwiceCountsOnce) {
  PendingCheckpoints p;
  p.Expect(1, 1, 2 * kChunk, 2);
  EXPECT_FALSE(p.AddShard(1, 0, Shard(0, 0, kChunk)));
  EXPECT_FALSE(p.AddShard(1, 0, Shard(0, 0, kChunk)));
  EXPECT_EQ(p.DebugString(), "PendingCheckpoints{s1:g1,1/2}");
  EXPECT_TRUE(p.AddShard(1, 1, Shard(1, kChunk, 2 * kChunk)));
}

TEST(PendingCheckpointsTest, ExpectingAStepAgainStartsItOverAndClearForgetsEveryStep) {
  PendingCheckpoints p;
  p.Expect(8, 1, 2 * kChunk, 2);
  EXPECT_FALSE(p.AddShard(8, 0, Shard(0, 0, kChunk)));
  p.Expect(9, 1, 2 * kChunk, 2);
  // The final checkpoint asked again in generation 2: the shards of generation 1 are gone.
  p.Expect(8, 2, 2 * kChunk, 2);
  EXPECT_FALSE(p.Accepts(8, 1));
  EXPECT_EQ(p.DebugString(), "PendingCheckpoints{s8:g2,0/2 s9:g1,0/2}");
  p.Clear();
  EXPECT_TRUE(p.empty());
  EXPECT_EQ(p.DebugString(), "PendingCheckpoints{}");
}

}  // namespace
}  // namespace troupe::train
