// The chaos fault schedule, exactly: which faults are due when (each once), and the actions
// firing each kind takes, in CoordinatorAction's short form ("event" is its fault_armed event,
// whose fields the tests check).
#include "fault_schedule.h"

#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"

namespace troupe::train {
namespace {

std::string Str(const FiredFault& fired) {
  return absl::StrJoin(fired.actions, " ", [](std::string* out, const CoordinatorAction& a) {
    out->append(DebugString(a));
  });
}

// Four workers w0..w3 on nodes n0..n3, buddy offset 2, generation 5.
FaultTargets Targets() {
  FaultTargets t;
  t.workers = {"w0", "w1", "w2", "w3"};
  t.nodes = {"n0", "n1", "n2", "n3"};
  t.buddy = 2;
  t.generation = 5;
  return t;
}

const base::SupervisionEvent& Armed(const FiredFault& fired) {
  EXPECT_EQ(fired.actions.front().kind, CoordinatorAction::Kind::kEvent);
  return fired.actions.front().event;
}

TEST(FaultScheduleTest, AFaultIsDueAtItsStepOnceAndCrashInCheckpointNeverAtAStep) {
  const std::vector<Fault> faults = {
      Fault{FaultKind::kKillWorker, 2}, Fault{FaultKind::kCrashInCheckpoint, 2},
      Fault{FaultKind::kStallCoordinator, 2}, Fault{FaultKind::kJoinWorker, 3}};
  CoordinatorRecord record;
  EXPECT_EQ(TakeDueFaults(faults, 1, &record), (std::vector<size_t>{}));
  EXPECT_EQ(TakeDueFaults(faults, 2, &record), (std::vector<size_t>{0, 2}));
  EXPECT_EQ(record.fired, (std::set<int32_t>{0, 2}));
  EXPECT_TRUE(record.awaiting_recovery);  // kill-worker's recovery is measured
  // The step again (a generation change before it committed): fired already.
  EXPECT_EQ(TakeDueFaults(faults, 2, &record), (std::vector<size_t>{}));
  EXPECT_EQ(TakeDueFaults(faults, 3, &record), (std::vector<size_t>{3}));
  EXPECT_EQ(record.fired, (std::set<int32_t>{0, 2, 3}));
}

TEST(FaultScheduleTest, OnlyFaultsWhoseRecoveryIsMeasuredAwaitIt) {
  const std::vector<Fault> faults = {Fault{FaultKind::kStallCoordinator, 1},
                                     Fault{FaultKind::kSigtermNode, 1},
                                     Fault{FaultKind::kJoinWorker, 1}};
  CoordinatorRecord record;
  EXPECT_EQ(TakeDueFaults(faults, 1, &record).size(), 3u);
  EXPECT_FALSE(record.awaiting_recovery);
}

TEST(FaultScheduleTest, ACheckpointCrashIsTheFirstDueByTheCheckpointsStepOnce) {
  const std::vector<Fault> faults = {Fault{FaultKind::kKillWorker, 1},
                                     Fault{FaultKind::kCrashInCheckpoint, 5},
                                     Fault{FaultKind::kCrashInCheckpoint, 3}};
  CoordinatorRecord record;
  EXPECT_EQ(TakeCheckpointCrash(faults, 2, &record), std::nullopt);
  EXPECT_FALSE(record.awaiting_recovery);
  // Due at or before the checkpoint's step: the one at 3, by the checkpoint of step 4.
  EXPECT_EQ(TakeCheckpointCrash(faults, 4, &record), std::optional<size_t>(2));
  EXPECT_TRUE(record.awaiting_recovery);
  EXPECT_EQ(TakeCheckpointCrash(faults, 4, &record), std::nullopt);
  EXPECT_EQ(TakeCheckpointCrash(faults, 6, &record), std::optional<size_t>(1));
  EXPECT_EQ(record.fired, (std::set<int32_t>{1, 2}));
}

TEST(FaultScheduleTest, AFaultsArgumentNamesARankClampedToTheGroup) {
  EXPECT_EQ(FaultRank(-1, 4), 1);  // none given: rank 1, so rank 0 keeps the job's state
  EXPECT_EQ(FaultRank(0, 4), 0);
  EXPECT_EQ(FaultRank(7, 4), 3);
  EXPECT_EQ(FaultRank(-1, 1), 0);
}

TEST(FaultScheduleTest, KillAndStopWorkerSignalTheirRankInTheStep) {
  FiredFault kill = FireFault(Fault{FaultKind::kKillWorker, 2}, Targets());
  EXPECT_EQ(Str(kill), "event kill(w1,s2)");
  EXPECT_FALSE(kill.hold);
  const base::SupervisionEvent& e = Armed(kill);
  EXPECT_EQ(e.event, "fault_armed");
  EXPECT_EQ(e.generation, 5u);
  EXPECT_EQ(e.Field("kind"), "kill-worker");
  EXPECT_EQ(e.Field("step"), "2");
  EXPECT_EQ(e.Field("rank"), "1");
  EXPECT_EQ(e.Field("worker"), "w1");
  EXPECT_EQ(kill.actions[1].fault, FaultKind::kKillWorker);

  FiredFault stop = FireFault(Fault{FaultKind::kStopWorker, 3, 0}, Targets());
  EXPECT_EQ(Str(stop), "event stop(w0,s3)");
  EXPECT_EQ(stop.actions[1].fault, FaultKind::kStopWorker);
  EXPECT_EQ(kill.actions[1].signal, SIGKILL);
  EXPECT_EQ(stop.actions[1].signal, SIGSTOP);
  // The faults that leave the process running are armed with signal 0.
  for (FaultKind alive : {FaultKind::kHangWorker, FaultKind::kClockStep}) {
    FiredFault f = FireFault(Fault{alive, 3, 0}, Targets());
    ASSERT_EQ(f.actions.size(), 2u) << FaultKindName(alive);
    EXPECT_EQ(f.actions[1].fault, alive);
    EXPECT_EQ(f.actions[1].signal, 0) << FaultKindName(alive);
  }
}

TEST(FaultScheduleTest, KillShardAndBuddyKillsARankAndItsBuddyMirror) {
  FiredFault fired = FireFault(Fault{FaultKind::kKillShardAndBuddy, 4, 3}, Targets());
  // Rank 3's buddy, at offset 2 in a world of 4: rank 1.
  EXPECT_EQ(Str(fired), "event kill(w3,s4) kill(w1,s4)");
  const base::SupervisionEvent& e = Armed(fired);
  EXPECT_EQ(e.Field("rank"), "3");
  EXPECT_EQ(e.Field("buddy_rank"), "1");
  EXPECT_EQ(e.Field("buddy"), "w1");
}

TEST(FaultScheduleTest, NodeFaultsGoToTheNodeOfTheirRank) {
  FiredFault drain = FireFault(Fault{FaultKind::kSigtermNode, 1, 2}, Targets());
  EXPECT_EQ(Str(drain), "event drain_node(w2)");
  EXPECT_EQ(Armed(drain).Field("node"), "n2");
  EXPECT_EQ(Str(FireFault(Fault{FaultKind::kPartitionNode, 1}, Targets())),
            "event partition-node(w1)");
  EXPECT_EQ(Str(FireFault(Fault{FaultKind::kDropNode, 1}, Targets())), "event drop-node(w1)");
  EXPECT_EQ(Str(FireFault(Fault{FaultKind::kDelayNode, 1}, Targets())), "event delay-node(w1)");
  EXPECT_FALSE(drain.hold);
}

TEST(FaultScheduleTest, JoinWorkerAddsANodeAndHoldsTheStepForIt) {
  FiredFault fired = FireFault(Fault{FaultKind::kJoinWorker, 6}, Targets());
  EXPECT_EQ(Str(fired), "event add_node(join6)");
  EXPECT_EQ(Armed(fired).Field("node"), "join6");
  EXPECT_TRUE(fired.hold);
  EXPECT_TRUE(fired.await_join);
}

TEST(FaultScheduleTest, TheCoordinatorsOwnFaultsCrashOrStallIt) {
  FiredFault crash = FireFault(Fault{FaultKind::kKillCoordinator, 2}, Targets());
  EXPECT_EQ(Str(crash), "event crash_self");
  EXPECT_TRUE(crash.hold);
  EXPECT_FALSE(crash.await_join);
  FiredFault stall = FireFault(Fault{FaultKind::kStallCoordinator, 2}, Targets());
  EXPECT_EQ(Str(stall), "event stall_self");
  EXPECT_FALSE(stall.hold);
  // Not a step's fault: ArmCheckpointCrash.
  EXPECT_EQ(Str(FireFault(Fault{FaultKind::kCrashInCheckpoint, 2}, Targets())), "");
}

TEST(FaultScheduleTest, ACheckpointCrashIsArmedAtThePublishOfItsCheckpoint) {
  FiredFault fired = ArmCheckpointCrash(/*step=*/7, /*generation=*/3);
  EXPECT_EQ(Str(fired), "event arm_crash(checkpoint.publish)");
  EXPECT_EQ(fired.actions[1].step, 7);
  const base::SupervisionEvent& e = Armed(fired);
  EXPECT_EQ(e.Field("kind"), "crash-in-checkpoint");
  EXPECT_EQ(e.Field("step"), "7");
  EXPECT_EQ(e.generation, 3u);
  EXPECT_FALSE(fired.hold);
}

}  // namespace
}  // namespace troupe::train
