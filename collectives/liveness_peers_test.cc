// LivenessPeers: who watches whom in the liveness overlay. Symmetric (one connection serves
// both watchers), O(log W) peers, and connected — also without any one rank, so the news of a
// death reaches every survivor — with a small diameter.
#include <algorithm>
#include <cmath>
#include <deque>
#include <vector>

#include "gtest/gtest.h"
#include "liveness.h"

namespace troupe::collectives {
namespace {

// Hops from `from` to every rank, skipping `gone` (-1: none); -1 where unreachable.
std::vector<int> Hops(int size, int from, int gone) {
  std::vector<int> hops(size, -1);
  std::deque<int> queue = {from};
  hops[from] = 0;
  while (!queue.empty()) {
    const int r = queue.front();
    queue.pop_front();
    for (int q : LivenessPeers(r, size)) {
      if (q == gone || hops[q] >= 0) continue;
      hops[q] = hops[r] + 1;
      queue.push_back(q);
    }
  }
  return hops;
}

TEST(LivenessPeersTest, SymmetricLogarithmicAndConnectedWithoutAnyOneRank) {
  EXPECT_TRUE(LivenessPeers(0, 1).empty());
  EXPECT_EQ(LivenessPeers(0, 2), (std::vector<int>{1}));
  EXPECT_EQ(LivenessPeers(2, 8), (std::vector<int>{0, 1, 3, 6}));
  for (int size : {2, 3, 4, 5, 7, 8, 13, 32, 33, 64, 100, 257}) {
    const int log2 = static_cast<int>(std::ceil(std::log2(size)));
    for (int r = 0; r < size; ++r) {
      const std::vector<int> peers = LivenessPeers(r, size);
      EXPECT_LE(static_cast<int>(peers.size()), log2 + 1) << r << " of " << size;
      EXPECT_TRUE(std::is_sorted(peers.begin(), peers.end()));
      for (int q : peers) {
        ASSERT_NE(q, r);
        const std::vector<int> back = LivenessPeers(q, size);
        EXPECT_TRUE(std::binary_search(back.begin(), back.end(), r)) << r << "," << q;
      }
    }
    for (int gone = -1; gone < size; ++gone) {
      const int from = gone == 0 ? 1 : 0;
      const std::vector<int> hops = Hops(size, from, gone);
      for (int r = 0; r < size; ++r) {
        if (r == gone) continue;
        ASSERT_GE(hops[r], 0) << "rank " << r << " of " << size << " cut off without " << gone;
        if (gone < 0) {
          EXPECT_LE(hops[r], log2 + 1) << r << " of " << size;
        }
      }
    }
  }
}

}  // namespace
}  // namespace troupe::collectives
