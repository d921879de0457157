#include "troupe/train/shard_layout.h"

#include <algorithm>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "troupe/kernels/norm.h"

namespace troupe::train {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Largest power of two strictly below n (n >= 2): the canonical tree's split.
int32_t SplitSize(int32_t n) {
  int32_t p = 1;
  while (p * 2 < n) p *= 2;
  return p;
}

}  // namespace

ShardLayout ShardLayout::Make(int64_t num_params, int world) {
  constexpr int64_t kChunk = kernels::kNormChunk;
  ShardLayout l;
  l.world = std::max(1, world);
  l.num_params = num_params;
  l.per_rank = std::max<int64_t>(1, CeilDiv(CeilDiv(num_params, l.world), kChunk)) * kChunk;
  return l;
}

int64_t ShardLayout::begin(int r) const { return std::min(num_params, r * per_rank); }
int64_t ShardLayout::end(int r) const { return std::min(num_params, (r + 1) * per_rank); }

absl::StatusOr<std::vector<std::pair<int32_t, int32_t>>> MicrobatchBlocks(int32_t microbatches,
                                                                          int world) {
  if (world < 1 || world > microbatches) {
    return absl::InvalidArgumentError(absl::StrCat("world size: expected 1 to ", microbatches,
                                                   " (the microbatches per step), got ", world));
  }
  std::vector<std::pair<int32_t, int32_t>> blocks = {{0, microbatches}};
  while (static_cast<int>(blocks.size()) < world) {
    // Split the first of the largest blocks at its canonical midpoint.
    size_t best = 0;
    for (size_t i = 1; i < blocks.size(); ++i) {
      if (blocks[i].second - blocks[i].first > blocks[best].second - blocks[best].first) best = i;
    }
    const auto [lo, hi] = blocks[best];
    const int32_t mid = lo + SplitSize(hi - lo);
    blocks[best] = {lo, mid};
    blocks.insert(blocks.begin() + best + 1, {mid, hi});
  }
  return blocks;
}

int NewRank(const std::vector<int>& gone, int o) {
  auto it = std::lower_bound(gone.begin(), gone.end(), o);
  if (it != gone.end() && *it == o) return -1;
  return o - static_cast<int>(it - gone.begin());
}

bool MemoryRestorePossible(int old_world, const std::vector<int>& gone, int buddy,
                           bool replicated) {
  if (old_world == 0) return false;
  if (replicated) return static_cast<int>(gone.size()) < old_world;
  for (int o : gone) {
    if (old_world == 1 || NewRank(gone, (o + buddy) % old_world) < 0) return false;
  }
  return true;
}

int BuddiesSharingADomain(const std::vector<std::string>& domains, int buddy) {
  const int w = static_cast<int>(domains.size());
  int shared = 0;
  for (int r = 0; r < w && w > 1; ++r) shared += domains[r] == domains[(r + buddy) % w];
  return shared;
}

// The first offset with the fewest shared domains, as trying every one would find it — in O(W)
// offsets × O(W) ranks only while no offset shares none (8,192 ranks took 0.5 s by string
// comparisons): domains are compared as numbers, an offset sharing none ends the search, and a
// world of one domain has every offset alike.
int BuddyOffset(const std::vector<std::string>& domains) {
  const int w = static_cast<int>(domains.size());
  std::map<std::string, int> ids;
  std::vector<int> id(domains.size());
  for (int r = 0; r < w; ++r)
    id[r] = ids.emplace(domains[r], static_cast<int>(ids.size())).first->second;
  if (ids.size() <= 1) return 1;
  auto shared = [&](int k) {
    int n = 0;
    for (int r = 0; r < w; ++r) n += id[r] == id[(r + k) % w];
    return n;
  };
  int best = 1, best_shared = shared(1);
  for (int k = 2; k < w && best_shared > 0; ++k) {
    if (const int n = shared(k); n < best_shared) best = k, best_shared = n;
  }
  return best;
}

Ranges Intersect(const Ranges& r, int64_t lo, int64_t hi) {
  Ranges out;
  for (const auto& [b, e] : r) {
    if (std::max(b, lo) < std::min(e, hi)) out.emplace_back(std::max(b, lo), std::min(e, hi));
  }
  return out;
}

int64_t TotalSize(const Ranges& r) {
  int64_t n = 0;
  for (const auto& [b, e] : r) n += e - b;
  return n;
}

int64_t PackedOffset(const Ranges& r, int64_t at) {
  int64_t offset = 0;
  for (const auto& [b, e] : r) {
    if (at >= b && at < e) return offset + (at - b);
    offset += e - b;
  }
  return offset;
}

Ranges Merged(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges merged;
  for (const auto& [b, e] : r) {
    if (!merged.empty() && b <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, e);
    } else {
      merged.emplace_back(b, e);
    }
  }
  return merged;
}

Ranges Complement(const Ranges& r, int64_t n) {
  Ranges gaps;
  int64_t at = 0;
  for (const auto& [b, e] : r) {
    if (b > at) gaps.emplace_back(at, b);
    at = e;
  }
  if (at < n) gaps.emplace_back(at, n);
  return gaps;
}

}  // namespace troupe::train
