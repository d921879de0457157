// BlockList against a plain sorted reference under random inserts, erases, hot updates and
// scans (splits, empty blocks and max recomputation included).
#include "internal/block_list.h"

#include <map>

#include "gtest/gtest.h"
#include "sim/rng.h"

namespace troupe::scheduler::internal {
namespace {

using Reference = std::map<std::pair<int64_t, uint32_t>, HotFree>;

// Mostly empty nodes with a few roomy ones, so that block maxima decide what a scan skips.
HotFree RandomHot(sim::SplitMix64& rng) {
  HotFree h{};
  if (rng.Bernoulli(0.1)) {
    for (int r = 0; r < kHotResources; ++r) h[r] = static_cast<int64_t>(rng.Uniform(100));
  }
  return h;
}

TEST(BlockListTest, MatchesASortedReference) {
  sim::SplitMix64 rng(5);
  BlockList<int64_t> list;
  Reference ref;
  for (int step = 0; step < 20000; ++step) {
    const double op = rng.Real();
    int64_t key = static_cast<int64_t>(rng.Uniform(50));
    uint32_t id = static_cast<uint32_t>(rng.Uniform(400));
    if (op >= 0.5 && op < 0.9 && !ref.empty() && rng.Bernoulli(0.7)) {  // an existing entry
      auto it = ref.lower_bound({key, id});
      if (it == ref.end()) it = ref.begin();
      key = it->first.first;
      id = it->first.second;
    }
    if (op < 0.5) {
      if (ref.count({key, id})) continue;
      const HotFree hot = RandomHot(rng);
      list.Insert(key, id, hot);
      ref[{key, id}] = hot;
    } else if (op < 0.8) {
      EXPECT_EQ(list.Erase(key, id), ref.erase({key, id}) == 1);
    } else if (op < 0.9) {
      const HotFree hot = RandomHot(rng);
      const bool present = ref.count({key, id}) > 0;
      EXPECT_EQ(list.SetHot(key, id, hot), present);
      if (present) ref[{key, id}] = hot;
    } else {
      // The first entry >= key whose hot amounts fit `need`, and which the visitor accepts
      // (it rejects odd ids): the same as a linear walk of the reference.
      HotFree need{};
      need[rng.Uniform(kHotResources)] = static_cast<int64_t>(rng.Uniform(100));
      int64_t expected = -1;
      for (auto it = ref.lower_bound({key, 0}); it != ref.end(); ++it) {
        if (Dominates(it->second, need) && it->first.second % 2 == 0) {
          expected = it->first.second;
          break;
        }
      }
      const int64_t got = list.Scan(key, need, [](const auto& e) { return e.id % 2 == 0; });
      ASSERT_EQ(got, expected) << "step " << step;
    }
    ASSERT_EQ(list.size(), ref.size());
    ASSERT_TRUE(list.Valid()) << "step " << step;
  }
  for (const auto& [k, hot] : ref) {
    const auto* e = list.Find(k.first, k.second);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->hot, hot);
  }
}

}  // namespace
}  // namespace troupe::scheduler::internal
