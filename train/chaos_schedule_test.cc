// The schedules of `troupe chaos run` (chaos_schedule.h): reproducible from the seed, always
// survivable by the job, and shrunk toward fewer and earlier faults.
#include "troupe/train/chaos_schedule.h"

#include <gtest/gtest.h>

#include <set>

namespace troupe::train {
namespace {

ChaosDraw OneHost() {
  ChaosDraw d;
  d.kinds = OneHostFaultKinds();
  d.max_faults = 4;
  d.steps = 60;
  d.checkpoint_every = 10;
  d.workers = 4;
  d.min_workers = 1;
  return d;
}

// The words behind the draws are troupe's own: these schedules are what every machine draws.
TEST(ChaosScheduleTest, ASeedAndTrialGiveTheSameScheduleEverywhere) {
  const ChaosDraw d = OneHost();
  EXPECT_EQ(FormatSchedule(DrawSchedule(1, 0, d)), FormatSchedule(DrawSchedule(1, 0, d)));
  std::set<std::string> distinct;
  for (int64_t t = 0; t < 50; ++t) distinct.insert(FormatSchedule(DrawSchedule(1, t, d)));
  EXPECT_GT(distinct.size(), 45u) << "50 trials drew few distinct schedules";
  EXPECT_NE(FormatSchedule(DrawSchedule(1, 3, d)), FormatSchedule(DrawSchedule(2, 3, d)));
}

TEST(ChaosScheduleTest, DrawsStayInsideTheJobAndLeaveItAWorker) {
  ChaosDraw d = OneHost();
  d.checkpoint_every = 25;  // checkpoints at 25 and 50: a crash in one falls on or before 50
  std::set<FaultKind> seen;
  for (int64_t t = 0; t < 2000; ++t) {
    const std::vector<Fault> s = DrawSchedule(7, t, d);
    ASSERT_GE(s.size(), 1u);
    ASSERT_LE(s.size(), 4u);
    int removed = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const Fault& f = s[i];
      seen.insert(f.kind);
      EXPECT_GE(f.step, 1) << FormatSchedule(s);
      EXPECT_LE(f.step, 59) << FormatSchedule(s);
      if (i > 0) {
        EXPECT_LE(s[i - 1].step, f.step) << FormatSchedule(s);
      }
      if (IsDiskFault(f.kind)) {
        // Its window covers the checkpoint at 25 or 50, never the last step's (60).
        const int64_t end = f.step + f.arg;
        EXPECT_TRUE((f.step <= 25 && end > 25) || (f.step <= 50 && end > 50)) << f.ToString();
        EXPECT_LE(end, 60) << f.ToString();
      } else {
        EXPECT_LT(f.arg, 4) << FormatSchedule(s);
      }
      if (f.point == StepPoint::kCheckpoint) {
        EXPECT_TRUE(f.step == 25 || f.step == 50) << f.ToString();
        EXPECT_NE(f.kind, FaultKind::kHangWorker) << f.ToString();
      }
      if (f.kind == FaultKind::kCrashInCheckpoint) {
        EXPECT_LE(f.step, 50) << FormatSchedule(s);
      }
      removed += f.kind == FaultKind::kKillShardAndBuddy ? 2
                 : (f.kind == FaultKind::kKillWorker || f.kind == FaultKind::kStopWorker ||
                    f.kind == FaultKind::kSigtermNode || f.kind == FaultKind::kHangWorker)
                     ? 1
                     : 0;
    }
    // A joiner is not counted on: it may come after the kills.
    EXPECT_LE(removed, 3) << FormatSchedule(s);
    for (const Fault& f : s) {
      absl::StatusOr<Fault> again = ParseFault(f.ToString());
      ASSERT_TRUE(again.ok()) << f.ToString();
      EXPECT_EQ(again->ToString(), f.ToString());
    }
  }
  EXPECT_EQ(seen.size(), OneHostFaultKinds().size()) << "some kind was never drawn";
}

TEST(ChaosScheduleTest, ShrinkingTriesEachRemovalThenEachFaultEarlier) {
  std::vector<Fault> s;
  for (const char* f : {"join-worker@1", "kill-worker@5:1", "stop-worker@9:2"}) {
    s.push_back(*ParseFault(f));
  }
  std::vector<std::string> got;
  for (const auto& c : ShrinkCandidates(s)) got.push_back(FormatSchedule(c));
  EXPECT_EQ(got,
            (std::vector<std::string>{
                "kill-worker@5:1 stop-worker@9:2", "join-worker@1 stop-worker@9:2",
                "join-worker@1 kill-worker@5:1", "join-worker@1 kill-worker@3:1 stop-worker@9:2",
                "join-worker@1 kill-worker@5:1 stop-worker@5:2"}));
  EXPECT_TRUE(ShrinkCandidates({}).empty());
  // A kill mid-checkpoint moves to an earlier checkpoint, or stays where none is earlier.
  got.clear();
  for (const auto& c : ShrinkCandidates({*ParseFault("kill-worker@30:1:mid-checkpoint"),
                                         *ParseFault("kill-worker@10:2:mid-checkpoint")},
                                        10)) {
    got.push_back(FormatSchedule(c));
  }
  EXPECT_EQ(got, (std::vector<std::string>{
                     "kill-worker@10:2:mid-checkpoint", "kill-worker@30:1:mid-checkpoint",
                     "kill-worker@10:1:mid-checkpoint kill-worker@10:2:mid-checkpoint"}));
}

TEST(ChaosScheduleTest, OnlyAnOwnerAndItsBuddyTogetherMayLoseSteps) {
  EXPECT_EQ(StepsLostAllowed({*ParseFault("kill-worker@5"), *ParseFault("stop-worker@9")}, 10), 0);
  EXPECT_EQ(StepsLostAllowed({*ParseFault("kill-shard-and-buddy@12")}, 10), 10);
  EXPECT_EQ(StepsLostAllowed({*ParseFault("kill-worker@7:1"), *ParseFault("stop-worker@7:2")}, 10),
            10)
      << "two at one boundary may be an owner and its buddy";
  EXPECT_EQ(StepsLostAllowed({*ParseFault("kill-shard-and-buddy@12"), *ParseFault("disk-full@8:4"),
                              *ParseFault("disk-slow@20:9")},
                             10),
            30)
      << "a full disk's checkpoint (10) and a slow one's (20) may each be missing";
  EXPECT_EQ(
      StepsLostAllowed({*ParseFault("kill-worker@10:1:mid-checkpoint"),
                        *ParseFault("kill-shard-and-buddy@13"), *ParseFault("disk-fail@1:25")},
                       5),
      5 * (1 + 1 + 5))
      << "step-10 cut short; step-5 .. step-25 on a failing disk";
  Timeouts t;
  EXPECT_EQ(RecoveryBound(FaultKind::kKillWorker, t), absl::Seconds(1));
  EXPECT_EQ(RecoveryBound(FaultKind::kHangWorker, t),
            t.collective + t.bootstrap + 2 * t.retry + absl::Seconds(1));
  EXPECT_EQ(RecoveryBound(FaultKind::kDiskFull, t), absl::ZeroDuration());
  EXPECT_EQ(RecoveryBound(FaultKind::kStopWorker, t), t.liveness + absl::Seconds(1));
  EXPECT_EQ(RecoveryBound(FaultKind::kJoinWorker, t), absl::ZeroDuration());
  EXPECT_EQ(
      StepsLostAllowed({*ParseFault("partition-node@7:1"), *ParseFault("kill-worker@7:2")}, 10), 10)
      << "a host cut off and a worker killed at one boundary may be an owner and its buddy";
  EXPECT_EQ(StepsLostAllowed({*ParseFault("drop-node@7:1"), *ParseFault("kill-worker@7:2")}, 10), 0)
      << "a lossy link takes nobody out";
}

// On the lab: every network kind is drawn, a join never (nobody would start the joiner), and the
// hosts cut off count against min_workers like the workers killed.
TEST(ChaosScheduleTest, LabDrawsEveryNetworkKindAndNoJoin) {
  ChaosDraw d = OneHost();
  d.kinds = LabFaultKinds();
  d.min_workers = 2;
  std::set<FaultKind> seen;
  for (int64_t t = 0; t < 2000; ++t) {
    const std::vector<Fault> s = DrawSchedule(3, t, d);
    int removed = 0;
    for (const Fault& f : s) {
      seen.insert(f.kind);
      removed += f.kind == FaultKind::kKillShardAndBuddy ? 2
                 : (f.kind == FaultKind::kKillWorker || f.kind == FaultKind::kStopWorker ||
                    f.kind == FaultKind::kSigtermNode || f.kind == FaultKind::kPartitionNode ||
                    f.kind == FaultKind::kOneWayNode || f.kind == FaultKind::kFlapNode ||
                    f.kind == FaultKind::kHangWorker)
                     ? 1
                     : 0;
    }
    EXPECT_LE(removed, 2) << FormatSchedule(s);
  }
  EXPECT_EQ(seen.size(), LabFaultKinds().size()) << "some kind was never drawn";
  EXPECT_EQ(seen.count(FaultKind::kJoinWorker), 0u);
  EXPECT_EQ(seen.count(FaultKind::kClockStep), 0u);
  for (FaultKind k :
       {FaultKind::kPartitionNode, FaultKind::kOneWayNode, FaultKind::kFlapNode,
        FaultKind::kDropNode, FaultKind::kDelayNode, FaultKind::kKillHead, FaultKind::kStopHead}) {
    EXPECT_EQ(seen.count(k), 1u) << FaultKindName(k);
  }
  // There the coordinator's process is a worker's: killing it takes a worker too.
  d.coordinator_on_a_worker = true;
  for (int64_t t = 0; t < 2000; ++t) {
    const std::vector<Fault> s = DrawSchedule(3, t, d);
    int removed = 0;
    for (const Fault& f : s) {
      removed += f.kind == FaultKind::kKillShardAndBuddy ? 2
                 : (f.kind == FaultKind::kDropNode || f.kind == FaultKind::kDelayNode ||
                    f.kind == FaultKind::kStallCoordinator || IsHeadFault(f.kind) ||
                    IsDiskFault(f.kind) || f.kind == FaultKind::kClockStep)
                     ? 0
                     : 1;
    }
    EXPECT_LE(removed, 2) << FormatSchedule(s);
  }
  EXPECT_EQ(StepsLostAllowed({*ParseFault("kill-coordinator@7"), *ParseFault("kill-worker@7:2")},
                             10, /*coordinator_on_a_worker=*/true),
            10);
  EXPECT_EQ(
      StepsLostAllowed({*ParseFault("kill-coordinator@7"), *ParseFault("kill-worker@7:2")}, 10), 0);
  absl::StatusOr<std::vector<FaultKind>> k = ParseFaultKinds("oneway-node,flap-node");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(*k, (std::vector<FaultKind>{FaultKind::kOneWayNode, FaultKind::kFlapNode}));
}

TEST(ChaosScheduleTest, AnUnknownKindIsNamedWithTheVocabulary) {
  absl::StatusOr<std::vector<FaultKind>> k = ParseFaultKinds("kill-worker, explode");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("'explode'"), std::string::npos) << k.status();
  EXPECT_NE(k.status().message().find("stop-worker"), std::string::npos) << k.status();
  k = ParseFaultKinds("kill-worker,stop-worker,kill-worker");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->size(), 2u);
}

}  // namespace
}  // namespace troupe::train
