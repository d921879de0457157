#include "troupe/train/pending_checkpoints.h"

#include "absl/strings/str_cat.h"
#include "troupe/train/elastic.h"

namespace troupe::train {

void PendingCheckpoints::Expect(int64_t step, uint64_t generation, int64_t num_params, int world) {
  const ShardLayout l = ShardLayout::Make(num_params, world);
  Entry& e = table_[step] = Entry();
  e.generation = generation;
  e.world = l.world;
  for (int r = 0; r < l.world; ++r) e.expected += l.end(r) > l.begin(r) ? 1 : 0;
}

bool PendingCheckpoints::Accepts(int64_t step, uint64_t generation) const {
  auto it = table_.find(step);
  return it != table_.end() && it->second.generation == generation && !it->second.committing;
}

bool PendingCheckpoints::AddShard(int64_t step, int32_t index, const ShardFileInfo& info) {
  Entry& e = table_[step];
  e.shards[index] = info;
  return static_cast<int>(e.shards.size()) == e.expected;
}

PendingCheckpoints::Ready PendingCheckpoints::StartCommit(int64_t step) {
  Entry& e = table_[step];
  e.committing = true;
  Ready r;
  r.generation = e.generation;
  r.world = e.world;
  for (const auto& [i, s] : e.shards) r.shards.push_back(s);
  return r;
}

std::string PendingCheckpoints::DebugString() const {
  std::string out = "PendingCheckpoints{";
  for (const auto& [step, e] : table_) {
    absl::StrAppend(&out, out.back() == '{' ? "" : " ", "s", step, ":g", e.generation, ",",
                    e.shards.size(), "/", e.expected, e.committing ? ",committing" : "");
  }
  return out + "}";
}

}  // namespace troupe::train
