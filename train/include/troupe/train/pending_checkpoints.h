// pending_checkpoints.h — the checkpoints a training job has asked of its ranks and not yet
// committed, by step: which shards each still waits for, and what its manifest will hold.
// Pure: CoordinatorCore asks it when a step's checkpoint is due (Expect), when a rank reports a
// shard written (Accepts, AddShard), when every shard is in (StartCommit) and when the store's
// commit came out (Erase).
//
// Per step:
//   Expect ──▶ collecting ── AddShard: every expected shard in ──▶ committing ── Erase ──▶ (gone)
//                  │ a shard failed (Erase), a new generation (Clear)                 ▲
//                  └──────────────────────────────────────────────────────────────────┘
// One shard is expected of each rank whose range of the parameters is not empty (ShardLayout);
// reports of another generation, or for a checkpoint already committing, are not accepted.
//
//   PendingCheckpoints p;
//   p.Expect(/*step=*/10, /*generation=*/2, num_params, /*world=*/4);
//   if (p.Accepts(10, 2) && p.AddShard(10, rank, info)) Commit(p.StartCommit(10));
//
// Not thread-safe: owned by its CoordinatorCore.
#ifndef TROUPE_TRAIN_PENDING_CHECKPOINTS_H_
#define TROUPE_TRAIN_PENDING_CHECKPOINTS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "troupe/train/manifest.h"

namespace troupe::train {

class PendingCheckpoints {
 public:
  // A checkpoint whose every shard is written: what its manifest names.
  struct Ready {
    uint64_t generation = 0;
    int world = 0;
    std::vector<ShardFileInfo> shards;  // by rank
  };

  // Checkpoint `step` is asked of generation `generation`'s `world` ranks, over `num_params`
  // parameters. Replaces an earlier entry of `step`.
  void Expect(int64_t step, uint64_t generation, int64_t num_params, int world);
  // A shard report of `step` from `generation` counts: the checkpoint is expected, of that
  // generation, and not committing yet.
  bool Accepts(int64_t step, uint64_t generation) const;
  // Rank `index`'s shard of an accepted `step` is on disk: true once every expected one is.
  bool AddShard(int64_t step, int32_t index, const ShardFileInfo& info);
  // Every shard of `step` is in: its manifest. `step` stays (committing, accepting no more
  // reports) until Erase.
  Ready StartCommit(int64_t step);
  // Committed, dropped or failed: forgotten.
  void Erase(int64_t step) { table_.erase(step); }
  // A new generation: a checkpoint of an older one can no longer complete.
  void Clear() { table_.clear(); }
  bool Contains(int64_t step) const { return table_.count(step) > 0; }
  bool empty() const { return table_.empty(); }
  std::string DebugString() const;

 private:
  struct Entry {
    uint64_t generation = 0;
    int world = 0;
    int expected = 0;
    bool committing = false;  // every shard is in; StartCommit called
    std::map<int32_t, ShardFileInfo> shards;
  };
  std::map<int64_t, Entry> table_;
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_PENDING_CHECKPOINTS_H_
