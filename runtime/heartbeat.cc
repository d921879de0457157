#include "internal/heartbeat.h"

#include <algorithm>
#include <set>

namespace troupe::runtime::internal {

HeartbeatMessage HeartbeatDiff::Next(const std::vector<ActorSample>& now, int64_t now_ns,
                                     bool full) {
  HeartbeatMessage msg;
  if (full) reported_.clear();
  std::set<std::pair<std::string, uint64_t>> seen;
  for (const ActorSample& a : now) {
    const auto key = std::make_pair(a.name, a.generation);
    seen.insert(key);
    const int64_t busy_ns = a.busy_since_ns == 0 ? 0 : now_ns - a.busy_since_ns;
    auto it = reported_.find(key);
    if (busy_ns >= floor_ns_ && busy_ns > 0) {
      if (it != reported_.end() && it->second == a.busy_since_ns) continue;  // told already
      reported_[key] = a.busy_since_ns;
      msg.changes.push_back(
          ActorStat{a.name, a.generation, a.progress,
                    std::max<uint64_t>(1, static_cast<uint64_t>(busy_ns / 1000000))});  // 0: idle
    } else if (it != reported_.end()) {  // that handler ended (or a new one has barely begun)
      reported_.erase(it);
      msg.changes.push_back(ActorStat{a.name, a.generation, a.progress, 0});
    }
  }
  for (auto it = reported_.begin(); it != reported_.end();) {  // gone while reported busy
    if (seen.count(it->first)) {
      ++it;
      continue;
    }
    msg.changes.push_back(ActorStat{it->first.first, it->first.second, 0, 0});
    it = reported_.erase(it);
  }
  msg.base = full ? 0 : version_;
  if (full || !msg.changes.empty()) ++version_;
  msg.version = version_;
  return msg;
}

}  // namespace troupe::runtime::internal
