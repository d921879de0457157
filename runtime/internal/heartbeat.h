// internal/heartbeat.h — what a process tells the head each heartbeat: a version and what
// changed since the previous one, not its whole actor list (issue 45).
//
// The head reads one thing from a heartbeat beyond "this process lives": which actors' handlers
// have run long, to publish actor_hung once one runs past hung_timeout. So a process reports an
// actor only when its handler has run at least `floor` (the heartbeat interval) — with how long
// (busy_ms) and its progress — and once more when that handler has ended or the actor is gone
// (busy_ms = 0). An actor that consumes a stream of short messages never appears; one whose
// handler runs for minutes appears twice. A beat with nothing to report is (base = version,
// version): O(1) for the head whatever the process hosts.
//
// Versions chain the deltas: a delta (base, version) applies to the head's copy at `base`. The
// first beat, the first one to a new head and the answer to the head's heartbeat_sync_atom are
// full (base = 0): every actor busy past the floor. A head that misses a link (a head that took
// over, a member it re-registered) asks for a full one instead of guessing.
#ifndef TROUPE_RUNTIME_INTERNAL_HEARTBEAT_H_
#define TROUPE_RUNTIME_INTERNAL_HEARTBEAT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "internal/cluster_protocol.h"

namespace troupe::runtime::internal {

// One tracked actor as the heartbeat thread reads it.
struct ActorSample {
  std::string name;
  uint64_t generation = 0;
  uint64_t progress = 0;
  int64_t busy_since_ns = 0;  // steady clock; 0 = idle
};

struct HeartbeatMessage {
  uint64_t base = 0;     // 0: full
  uint64_t version = 0;  // what the head's copy is at once this applies
  std::vector<ActorStat> changes;
};

class HeartbeatDiff {
 public:
  explicit HeartbeatDiff(int64_t floor_ns) : floor_ns_(floor_ns) {}
  // This beat's message for the actors `now` (every tracked one) at steady-clock `now_ns`.
  HeartbeatMessage Next(const std::vector<ActorSample>& now, int64_t now_ns, bool full);

 private:
  const int64_t floor_ns_;
  uint64_t version_ = 0;
  // (actor, incarnation) → the busy_since it was reported busy with: a hung incarnation and its
  // restarted successor are two actors of one name.
  std::map<std::pair<std::string, uint64_t>, int64_t> reported_;
};

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_HEARTBEAT_H_
