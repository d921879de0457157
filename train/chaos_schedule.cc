#include "troupe/train/chaos_schedule.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "troupe/base/seeded_words.h"

namespace troupe::train {
namespace {

using Words = base::SeededWords;  // the trial's draws

bool TargetsARank(FaultKind k) {
  return k == FaultKind::kKillWorker || k == FaultKind::kStopWorker ||
         k == FaultKind::kHangWorker || k == FaultKind::kKillShardAndBuddy ||
         k == FaultKind::kSpotNotice || k == FaultKind::kClockStep ||
         k == FaultKind::kSigtermNode || k == FaultKind::kPartitionNode ||
         k == FaultKind::kDropNode || k == FaultKind::kDelayNode || k == FaultKind::kOneWayNode ||
         k == FaultKind::kFlapNode;
}

bool KillsInAStep(FaultKind k) {
  return k == FaultKind::kKillWorker || k == FaultKind::kStopWorker ||
         k == FaultKind::kKillShardAndBuddy;
}

// Workers a fault takes out of the job for good. A joiner gives none back here: it may be drawn
// for a step after the kills it would offset. A cut host's worker is declared dead (its node
// joins again with a new one after the heal, which is not counted on either).
int Removes(FaultKind k, bool coordinator_on_a_worker) {
  switch (k) {
    case FaultKind::kKillCoordinator:
    case FaultKind::kCrashInCheckpoint:
      return coordinator_on_a_worker ? 1 : 0;
    case FaultKind::kKillWorker:
    case FaultKind::kStopWorker:
    case FaultKind::kHangWorker:
    case FaultKind::kSigtermNode:
    case FaultKind::kSpotNotice:
    case FaultKind::kPartitionNode:
    case FaultKind::kOneWayNode:
    case FaultKind::kFlapNode:
      return 1;
    case FaultKind::kKillShardAndBuddy:
      return 2;
    default:
      return 0;
  }
}

}  // namespace

std::vector<FaultKind> OneHostFaultKinds() {
  return {
      FaultKind::kKillWorker,        FaultKind::kStopWorker,       FaultKind::kKillShardAndBuddy,
      FaultKind::kSigtermNode,       FaultKind::kJoinWorker,       FaultKind::kKillCoordinator,
      FaultKind::kCrashInCheckpoint, FaultKind::kStallCoordinator, FaultKind::kHangWorker,
      FaultKind::kDiskFull,          FaultKind::kDiskFail,         FaultKind::kDiskSlow,
      FaultKind::kSpotNotice,        FaultKind::kClockStep};
}

std::vector<FaultKind> LabFaultKinds() {
  std::vector<FaultKind> kinds;
  for (FaultKind k : OneHostFaultKinds()) {
    // A clock step is one process's, the same on any host (and its offset files would land in
    // the hosts' private /tmp).
    if (k != FaultKind::kJoinWorker && k != FaultKind::kClockStep) kinds.push_back(k);
  }
  for (FaultKind k :
       {FaultKind::kPartitionNode, FaultKind::kOneWayNode, FaultKind::kFlapNode,
        FaultKind::kDropNode, FaultKind::kDelayNode, FaultKind::kKillHead, FaultKind::kStopHead}) {
    kinds.push_back(k);
  }
  return kinds;
}

absl::StatusOr<std::vector<FaultKind>> ParseFaultKinds(const std::string& list) {
  std::vector<FaultKind> kinds;
  for (absl::string_view name : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    name = absl::StripAsciiWhitespace(name);
    absl::StatusOr<Fault> f = ParseFault(absl::StrCat(name, "@1"));
    if (!f.ok() || FaultKindName(f->kind) != name) {
      std::vector<std::string> known;
      for (int k = 0; k <= static_cast<int>(kLastFaultKind); ++k) {
        known.push_back(FaultKindName(static_cast<FaultKind>(k)));
      }
      return absl::InvalidArgumentError(absl::StrCat("--faults: unknown fault kind '", name,
                                                     "'; expected one of ",
                                                     absl::StrJoin(known, ", ")));
    }
    if (std::find(kinds.begin(), kinds.end(), f->kind) == kinds.end()) kinds.push_back(f->kind);
  }
  if (kinds.empty()) return absl::InvalidArgumentError("--faults: expected a kind, got none");
  return kinds;
}

std::vector<Fault> DrawSchedule(uint64_t seed, int64_t trial, const ChaosDraw& draw) {
  Words w(seed, trial);
  std::vector<Fault> out;
  if (draw.kinds.empty() || draw.steps < 2) return out;
  const int n = static_cast<int>(w.In(1, std::max(1, draw.max_faults)));
  int spare = std::max(0, draw.workers - std::max(1, draw.min_workers));
  const int64_t every = std::max<int64_t>(0, draw.checkpoint_every);
  const int64_t last_checkpoint = every > 0 ? (draw.steps / every) * every : 0;
  // Checkpoints before the last step's (which must be written for the job to succeed).
  const int64_t inner_checkpoints = every > 0 ? (draw.steps - 1) / every : 0;
  for (int i = 0; i < n; ++i) {
    // Kinds the job can still take; a draw of one it cannot is drawn again from the rest.
    std::vector<FaultKind> open;
    for (FaultKind k : draw.kinds) {
      if (Removes(k, draw.coordinator_on_a_worker) > spare) continue;
      if (k == FaultKind::kCrashInCheckpoint && last_checkpoint < 1) continue;
      if (IsDiskFault(k) && inner_checkpoints < 1) continue;
      open.push_back(k);
    }
    if (open.empty()) break;
    Fault f;
    f.kind = open[w.In(0, static_cast<int64_t>(open.size()) - 1)];
    const int64_t last = f.kind == FaultKind::kCrashInCheckpoint
                             ? std::min(last_checkpoint, draw.steps - 1)
                             : draw.steps - 1;
    f.step = w.In(1, last);
    f.arg = TargetsARank(f.kind) ? static_cast<int32_t>(w.In(0, draw.workers - 1)) : -1;
    if (KillsInAStep(f.kind) || f.kind == FaultKind::kHangWorker) {
      const int points = KillsInAStep(f.kind) && inner_checkpoints > 0 ? 3 : 2;
      f.point = static_cast<StepPoint>(w.In(0, points - 1));
      // Mid-checkpoint: at one of the checkpoints before the last step.
      if (f.point == StepPoint::kCheckpoint) f.step = every * w.In(1, inner_checkpoints);
    }
    if (IsDiskFault(f.kind)) {
      // From a checkpoint on, over it and maybe the next, never the last step's.
      const int64_t c = every * w.In(1, inner_checkpoints);
      f.step = c - w.In(0, every - 1);
      f.arg = static_cast<int32_t>(
          std::min<int64_t>(w.In(c - f.step + 1, c - f.step + every), draw.steps - f.step));
    }
    spare -= Removes(f.kind, draw.coordinator_on_a_worker);
    out.push_back(f);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Fault& a, const Fault& b) { return a.step < b.step; });
  return out;
}

std::vector<std::vector<Fault>> ShrinkCandidates(const std::vector<Fault>& schedule,
                                                 int64_t checkpoint_every) {
  std::vector<std::vector<Fault>> out;
  for (size_t i = 0; i < schedule.size(); ++i) {
    std::vector<Fault> fewer = schedule;
    fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(i));
    out.push_back(std::move(fewer));
  }
  for (size_t i = 0; i < schedule.size(); ++i) {
    if (schedule[i].step <= 1) continue;
    std::vector<Fault> earlier = schedule;
    earlier[i].step = 1 + (schedule[i].step - 1) / 2;
    if (schedule[i].point == StepPoint::kCheckpoint) {  // to an earlier checkpoint's
      if (checkpoint_every <= 0 || schedule[i].step <= checkpoint_every) continue;
      earlier[i].step = std::max<int64_t>(checkpoint_every,
                                          earlier[i].step / checkpoint_every * checkpoint_every);
    }
    std::stable_sort(earlier.begin(), earlier.end(),
                     [](const Fault& a, const Fault& b) { return a.step < b.step; });
    out.push_back(std::move(earlier));
  }
  return out;
}

std::string FormatSchedule(const std::vector<Fault>& schedule) {
  if (schedule.empty()) return "(none)";
  return absl::StrJoin(schedule, " ",
                       [](std::string* out, const Fault& f) { out->append(f.ToString()); });
}

int64_t StepsLostAllowed(const std::vector<Fault>& schedule, int64_t checkpoint_every,
                         bool coordinator_on_a_worker) {
  // Where a shard's owner and its buddy may die together: kill-shard-and-buddy, or two workers
  // taken out at one step boundary (they may be each other's buddy). Each rolls back to the newest
  // durable checkpoint, at most an interval behind (the one being written at the boundary the
  // fault fires on may not be durable yet).
  std::map<int64_t, int> removed_at;
  int64_t pairs = 0;
  // Each checkpoint that may not be durable when a pair dies lets the rollback reach one
  // interval further: those a full or failing disk covers, one a slow disk may still be writing,
  // one a kill mid-checkpoint leaves incomplete.
  const int64_t every = std::max<int64_t>(0, checkpoint_every);
  int64_t undurable = 0;
  for (const Fault& f : schedule) {
    if (f.point == StepPoint::kCheckpoint || f.kind == FaultKind::kDiskSlow) ++undurable;
    if ((f.kind == FaultKind::kDiskFull || f.kind == FaultKind::kDiskFail) && every > 0) {
      const int64_t end = f.step + (f.arg > 0 ? f.arg : every);  // [step, end)
      undurable += (end - 1) / every - (f.step - 1) / every;     // multiples of every inside
    }
  }
  for (const Fault& f : schedule) {
    if (f.kind == FaultKind::kKillShardAndBuddy) ++pairs;
    if (f.kind != FaultKind::kKillShardAndBuddy && Removes(f.kind, coordinator_on_a_worker) == 1 &&
        f.kind != FaultKind::kSigtermNode && f.kind != FaultKind::kSpotNotice &&
        ++removed_at[f.step] == 2) {
      ++pairs;  // a drain hands its state over first: it loses nothing
    }
  }
  return pairs * every * (1 + undurable);
}

absl::Duration RecoveryBound(FaultKind kind, const Timeouts& timeouts) {
  switch (kind) {
    case FaultKind::kKillWorker:
    case FaultKind::kKillShardAndBuddy:
      return absl::Seconds(1);
    case FaultKind::kStopWorker:
      return timeouts.liveness + absl::Seconds(1);
    case FaultKind::kKillCoordinator:
    case FaultKind::kCrashInCheckpoint:
      return absl::Seconds(5);
    case FaultKind::kHangWorker:
      // Its peers' exchange times out, then the next generation's bootstrap waits for it: both
      // blame it, and it is evicted (coordinator_core.h).
      return timeouts.collective + timeouts.bootstrap + 2 * timeouts.retry + absl::Seconds(1);
    default:
      return absl::ZeroDuration();
  }
}

}  // namespace troupe::train
