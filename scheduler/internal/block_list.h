// Private: an ordered list of (key, node) entries in small sorted blocks, each block keeping the
// component-wise maximum of its entries' free amounts. A scan for a node that fits a demand
// skips whole blocks whose maximum cannot fit it, so passing thousands of nodes that have the
// scarcest resource but lack another costs a few dozen block checks instead of a node visit each.
#ifndef TROUPE_SCHEDULER_INTERNAL_BLOCK_LIST_H_
#define TROUPE_SCHEDULER_INTERNAL_BLOCK_LIST_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace troupe::scheduler::internal {

// Free amounts of the first kHotResources resource ids (the rest are checked on the node).
inline constexpr int kHotResources = 4;
using HotFree = std::array<int64_t, kHotResources>;

inline bool Dominates(const HotFree& have, const HotFree& need) {
  for (int r = 0; r < kHotResources; ++r) {
    if (have[r] < need[r]) return false;
  }
  return true;
}

template <typename Key>
class BlockList {
 public:
  struct Entry {
    Key key;
    uint32_t id;
    HotFree hot;
    bool operator<(const std::pair<Key, uint32_t>& k) const {
      return key < k.first || (key == k.first && id < k.second);
    }
  };

  void Insert(Key key, uint32_t id, const HotFree& hot) {
    ++size_;
    if (blocks_.empty()) {
      blocks_.emplace_back();
      blocks_.back().entries.push_back(Entry{key, id, hot});
      blocks_.back().max = hot;
      last_.push_back({key, id});
      return;
    }
    const size_t bi = BlockFor(key, id, /*for_insert=*/true);
    Block& b = blocks_[bi];
    b.entries.insert(std::lower_bound(b.entries.begin(), b.entries.end(), std::pair{key, id}),
                     Entry{key, id, hot});
    last_[bi] = {b.entries.back().key, b.entries.back().id};
    for (int r = 0; r < kHotResources; ++r) b.max[r] = std::max(b.max[r], hot[r]);
    if (b.entries.size() > kMaxBlock) Split(bi);
  }

  // Returns false when the entry is absent.
  bool Erase(Key key, uint32_t id) {
    const size_t bi = BlockFor(key, id, /*for_insert=*/false);
    if (bi >= blocks_.size()) return false;
    Block& b = blocks_[bi];
    auto it = std::lower_bound(b.entries.begin(), b.entries.end(), std::pair{key, id});
    if (it == b.entries.end() || it->key != key || it->id != id) return false;
    const HotFree gone = it->hot;
    b.entries.erase(it);
    --size_;
    if (b.entries.empty()) {
      blocks_.erase(blocks_.begin() + bi);
      last_.erase(last_.begin() + bi);
    } else {
      last_[bi] = {b.entries.back().key, b.entries.back().id};
      for (int r = 0; r < kHotResources; ++r) {
        if (gone[r] == b.max[r]) {
          Recompute(b);
          break;
        }
      }
    }
    return true;
  }

  // The entry, or nullptr.
  const Entry* Find(Key key, uint32_t id) const {
    const size_t bi = BlockFor(key, id, /*for_insert=*/false);
    if (bi >= blocks_.size()) return nullptr;
    const Block& b = blocks_[bi];
    auto it = std::lower_bound(b.entries.begin(), b.entries.end(), std::pair{key, id});
    return it == b.entries.end() || it->key != key || it->id != id ? nullptr : &*it;
  }

  bool SetHot(Key key, uint32_t id, const HotFree& hot) {
    const size_t bi = BlockFor(key, id, /*for_insert=*/false);
    if (bi >= blocks_.size()) return false;
    Block& b = blocks_[bi];
    auto it = std::lower_bound(b.entries.begin(), b.entries.end(), std::pair{key, id});
    if (it == b.entries.end() || it->key != key || it->id != id) return false;
    const HotFree old = it->hot;
    it->hot = hot;
    // Only a shrinking maximum needs the block rescanned.
    bool rescan = false;
    for (int r = 0; r < kHotResources; ++r) {
      b.max[r] = std::max(b.max[r], hot[r]);
      rescan |= old[r] == b.max[r] && hot[r] < old[r];
    }
    if (rescan) Recompute(b);
    return true;
  }

  // Visits, in key order from the first entry >= (from, 0), the entries whose block could fit
  // `need`, until visit(entry) returns true; returns that entry's id, or -1.
  template <typename Visit>
  int64_t Scan(Key from, const HotFree& need, Visit&& visit) const {
    size_t bi = BlockFor(from, 0, /*for_insert=*/false);
    for (bool first = true; bi < blocks_.size(); ++bi, first = false) {
      const Block& b = blocks_[bi];
      if (!Dominates(b.max, need)) continue;
      auto it = first ? std::lower_bound(b.entries.begin(), b.entries.end(), std::pair{from, 0u})
                      : b.entries.begin();
      for (; it != b.entries.end(); ++it) {
        if (Dominates(it->hot, need) && visit(*it)) return it->id;
      }
    }
    return -1;
  }

  size_t size() const { return size_; }

  // Structure check for tests: blocks non-empty, sorted, within bounds, maxima exact.
  bool Valid() const {
    size_t n = 0;
    const Entry* prev = nullptr;
    for (const Block& b : blocks_) {
      if (b.entries.empty() || b.entries.size() > kMaxBlock) return false;
      HotFree max{};
      for (const Entry& e : b.entries) {
        if (prev != nullptr && !(*prev < std::pair{e.key, e.id})) return false;
        prev = &e;
        for (int r = 0; r < kHotResources; ++r) max[r] = std::max(max[r], e.hot[r]);
      }
      if (max != b.max) return false;
      if (last_[&b - blocks_.data()] != std::pair{b.entries.back().key, b.entries.back().id}) {
        return false;
      }
      n += b.entries.size();
    }
    return n == size_ && last_.size() == blocks_.size();
  }

 private:
  static constexpr size_t kMaxBlock = 32;
  struct Block {
    std::vector<Entry> entries;
    HotFree max{};
  };

  // The first block whose last entry is >= (key, id); for an insert past every block, the last.
  size_t BlockFor(Key key, uint32_t id, bool for_insert) const {
    const size_t bi = static_cast<size_t>(
        std::lower_bound(last_.begin(), last_.end(), std::pair{key, id}) - last_.begin());
    return for_insert && bi == blocks_.size() ? blocks_.size() - 1 : bi;
  }

  static void Recompute(Block& b) {
    b.max.fill(0);
    for (const Entry& e : b.entries) {
      for (int r = 0; r < kHotResources; ++r) b.max[r] = std::max(b.max[r], e.hot[r]);
    }
  }

  void Split(size_t bi) {
    Block tail;
    auto mid = blocks_[bi].entries.begin() + blocks_[bi].entries.size() / 2;
    tail.entries.assign(mid, blocks_[bi].entries.end());
    blocks_[bi].entries.erase(mid, blocks_[bi].entries.end());
    Recompute(blocks_[bi]);
    Recompute(tail);
    last_[bi] = {blocks_[bi].entries.back().key, blocks_[bi].entries.back().id};
    last_.insert(last_.begin() + bi + 1, {tail.entries.back().key, tail.entries.back().id});
    blocks_.insert(blocks_.begin() + bi + 1, std::move(tail));
  }

  std::vector<Block> blocks_;
  std::vector<std::pair<Key, uint32_t>> last_;  // each block's last (key, id), for the search
  size_t size_ = 0;
};

}  // namespace troupe::scheduler::internal

#endif  // TROUPE_SCHEDULER_INTERNAL_BLOCK_LIST_H_
