// The lease gate, exactly: every test drives LeaseGate by hand with explicit times and asserts
// the whole action sequence (DebugString form; "run(...)" holds the core's action in its own
// short form). Pump() does what the coordinator actor does on run_queue: pull Next() until it
// returns nothing.
#include "lease_gate.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"

namespace troupe::actors {
namespace {

using CoreKind = train::CoordinatorAction::Kind;
using std::chrono::milliseconds;
using std::chrono::seconds;

const train::CoreTime kT0{};
constexpr milliseconds kLease{1000};

std::string Str(const std::vector<LeaseAction>& actions) {
  return absl::StrJoin(actions, " ",
                       [](std::string* out, const LeaseAction& a) { out->append(DebugString(a)); });
}

std::string Pump(LeaseGate& g, train::CoreTime now) {
  std::vector<LeaseAction> out;
  while (std::optional<LeaseAction> a = g.Next(now)) out.push_back(std::move(*a));
  return Str(out);
}

train::CoordinatorAction Save() { return train::CoordinatorAction(CoreKind::kSaveRecord); }
train::CoordinatorAction ToRank(CoreKind kind, const std::string& worker, int64_t step = -1) {
  train::CoordinatorAction a(kind);
  a.worker = worker;
  a.generation = 1;
  a.step = step;
  return a;
}
train::CoordinatorAction Step(const std::string& w, int64_t s) {
  return ToRank(CoreKind::kStep, w, s);
}
train::CoordinatorAction Commit(const std::string& w) { return ToRank(CoreKind::kCommit, w); }
train::CoordinatorAction Abort(const std::string& w) { return ToRank(CoreKind::kAbort, w); }

// A gate whose head is named, holding epoch 1 granted at kT0 for kLease.
LeaseGate Leased() {
  LeaseGate g;
  g.OnHeadNamed();
  g.OnGranted(1, kLease, kT0);
  g.OnClaimed(absl::OkStatus());
  return g;
}

TEST(LeaseGateTest, NothingIsAskedBeforeTheHeadIsNamedAndLeasedActionsWait) {
  LeaseGate g;
  EXPECT_EQ(Str(g.OnTick(kT0)), "tick(50ms)");
  EXPECT_EQ(Str(g.Enqueue({Abort("w0"), Save(), Step("w0", 0)}, false)), "run_queue");
  // What needs no lease runs; the save waits, and the step behind it too.
  EXPECT_EQ(Pump(g, kT0), "run(abort(w0,g1))");
  EXPECT_EQ(g.queued(), 2u);
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(50))), "tick(50ms)");
  EXPECT_EQ(Str(g.OnHeadNamed()), "follow_head ask_lease");
  EXPECT_EQ(Pump(g, kT0 + milliseconds(60)), "");  // asked already
}

TEST(LeaseGateTest, TheFirstGrantClaimsTheStoreThenRunsTheWaitingBatch) {
  LeaseGate g;
  EXPECT_EQ(Str(g.OnHeadNamed()), "follow_head ask_lease");
  EXPECT_EQ(Str(g.Enqueue({Save(), Commit("w0"), Step("w0", 0)}, false)), "run_queue");
  EXPECT_EQ(Pump(g, kT0), "");
  EXPECT_EQ(Str(g.OnGranted(1, kLease, kT0)), "claim(e1)");
  EXPECT_EQ(g.epoch(), 0u);  // not before the store is claimed
  EXPECT_EQ(Str(g.OnClaimed(absl::OkStatus())), "run_queue");
  EXPECT_EQ(g.epoch(), 1u);
  EXPECT_EQ(Pump(g, kT0 + milliseconds(5)),
            "run(save) run(commit(w0,g1,ck-1)) run(step(w0,g1,s0))");
  // Renewed a quarter lease apart.
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(10))), "ask_lease tick(250ms)");
  EXPECT_EQ(Str(g.OnGranted(1, kLease, kT0 + milliseconds(10))), "run_queue");
  EXPECT_TRUE(g.Held(kT0 + milliseconds(1009)));
  EXPECT_FALSE(g.Held(kT0 + milliseconds(1010)));
}

TEST(LeaseGateTest, ABatchStartsOnlyWithAQuarterLeaseToSpareAndThenRunsToItsEnd) {
  LeaseGate g = Leased();  // until kT0 + 1000 ms
  g.Enqueue({Save(), Commit("w0")}, false);
  EXPECT_EQ(Pump(g, kT0 + milliseconds(749)), "run(save) run(commit(w0,g1,ck-1))");
  // 750 ms + a quarter lease reaches the end of the lease: the next batch waits.
  g.Enqueue({Step("w0", 1), Save(), Commit("w0")}, false);
  EXPECT_EQ(Pump(g, kT0 + milliseconds(750)), "run(step(w0,g1,s1)) ask_lease");
  EXPECT_EQ(Str(g.OnGranted(1, kLease, kT0 + milliseconds(760))), "run_queue");
  // Once let through, the batch runs to its end, even past the lease's end.
  ASSERT_EQ(DebugString(*g.Next(kT0 + milliseconds(770))), "run(save)");
  EXPECT_EQ(Pump(g, kT0 + seconds(5)), "run(commit(w0,g1,ck-1))");
}

TEST(LeaseGateTest, AnActionsConsequencesGoAheadOfWhatFollowedIt) {
  LeaseGate g = Leased();
  g.Enqueue({ToRank(CoreKind::kCheckpoint, ""), Step("w0", 2)}, false);
  ASSERT_EQ(DebugString(*g.Next(kT0)), "run(checkpoint(s-1,g1,w0,0 shards))");
  // The checkpoint's outcome, while it is carried out: before the step.
  EXPECT_EQ(Str(g.Enqueue({ToRank(CoreKind::kFinal, "w0")}, /*from_action=*/true)), "run_queue");
  EXPECT_EQ(Pump(g, kT0), "run(final(w0,g1)) run(step(w0,g1,s2))");
  // From a message (not inside an action): behind the queue.
  g.Enqueue({Step("w0", 3)}, false);
  g.Enqueue({Abort("w0")}, false);
  EXPECT_EQ(Pump(g, kT0), "run(step(w0,g1,s3)) run(abort(w0,g1))");
}

TEST(LeaseGateTest, AHeadThatTookOverGrantsANewEpochWhichIsClaimedAndAnnounced) {
  LeaseGate g = Leased();
  EXPECT_EQ(Str(g.OnGranted(1, kLease, kT0 + milliseconds(100))), "run_queue");  // renewal
  EXPECT_EQ(Str(g.OnGranted(2, milliseconds(2000), kT0 + milliseconds(200))), "claim(e2)");
  EXPECT_EQ(Str(g.OnClaimed(absl::OkStatus())), "announce_epoch(e2) run_queue");
  EXPECT_EQ(g.epoch(), 2u);
  EXPECT_TRUE(g.Held(kT0 + milliseconds(2199)));
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(300))), "ask_lease tick(500ms)");
}

TEST(LeaseGateTest, AClaimTheStoreRefusesLosesTheLeaseAndNothingRunsAgain) {
  LeaseGate g = Leased();
  g.OnHeadLost("gone", kT0 + milliseconds(10));
  g.OnHeadTick(true, kT0 + milliseconds(20));
  g.Enqueue({Step("w0", 0), Save(), Commit("w0")}, false);
  EXPECT_EQ(Pump(g, kT0 + milliseconds(900)), "run(step(w0,g1,s0))");
  EXPECT_EQ(Str(g.OnGranted(3, kLease, kT0 + milliseconds(900))), "claim(e3)");
  EXPECT_EQ(Str(g.OnClaimed(absl::FailedPreconditionError("epoch 4 claimed the store"))),
            "lose_lease(e1,held2)");
  EXPECT_TRUE(g.stopped());
  EXPECT_EQ(g.queued(), 0u);
  EXPECT_EQ(Pump(g, kT0 + milliseconds(900)), "");
  EXPECT_EQ(Str(g.Enqueue({Save()}, false)), "");
  EXPECT_EQ(Str(g.OnTick(kT0 + seconds(1))), "");
  EXPECT_EQ(Str(g.OnGranted(3, kLease, kT0 + seconds(1))), "");
  EXPECT_EQ(Str(g.OnRefused(absl::FailedPreconditionError("replaced"))), "");
}

TEST(LeaseGateTest, AnUnavailableHeadIsAskedAgainAtTheTickAReplacedIncarnationGivesUp) {
  LeaseGate g;
  EXPECT_EQ(Str(g.OnHeadNamed()), "follow_head ask_lease");
  // Another incarnation's lease still runs.
  EXPECT_EQ(Str(g.OnRefused(absl::UnavailableError("held by another"))), "");
  EXPECT_EQ(Str(g.OnTick(kT0)), "ask_lease tick(50ms)");
  EXPECT_EQ(Str(g.OnRefused(absl::FailedPreconditionError("replaced by a later incarnation"))),
            "lose_lease(e0,held0)");
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(50))), "");
}

TEST(LeaseGateTest, AnExpiredLeaseTheHeadDoesNotRenewWithinTheWaitIsLost) {
  LeaseGate g = Leased();  // until kT0 + 1000 ms
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(100))), "ask_lease tick(250ms)");  // unanswered
  // Expired: the wait starts at this tick, the first with the lease needed.
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(1000))), "tick(250ms)");
  g.Enqueue({Save()}, false);
  EXPECT_EQ(Pump(g, kT0 + milliseconds(1100)), "");                   // waits; asked already
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(4000))), "tick(250ms)");  // 3 s: not over it
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(4001))), "lose_lease(e1,held1)");
  EXPECT_TRUE(g.stopped());
}

TEST(LeaseGateTest, AFirstGrantNeverAnsweredIsLostAfterTheWaitFromTheFirstAsk) {
  LeaseGate g;
  g.OnHeadNamed();
  g.Enqueue({Save()}, false);
  EXPECT_EQ(Pump(g, kT0), "");  // asked by OnHeadNamed
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(10))), "tick(50ms)");
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(3010))), "tick(50ms)");
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(3011))), "lose_lease(e0,held1)");
}

TEST(LeaseGateTest, AProcessStalledPastItsLeaseGoesOnWhenTheHeadRenewsIt) {
  LeaseGate g = Leased();
  g.OnTick(kT0 + milliseconds(100));
  g.OnGranted(1, kLease, kT0 + milliseconds(100));  // until kT0 + 1100 ms
  // Blocked 10 s (a slow fsync): the wait counts from this first ask, not from the expiry.
  EXPECT_EQ(Str(g.OnTick(kT0 + seconds(10))), "ask_lease tick(250ms)");
  EXPECT_EQ(Str(g.OnGranted(1, kLease, kT0 + seconds(10))), "run_queue");
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(10250))), "ask_lease tick(250ms)");
  EXPECT_FALSE(g.stopped());
}

TEST(LeaseGateTest, WithTheHeadLostNothingIsAskedNorCountedAndQueuedWorkRunsOnceTheLeaseReturns) {
  LeaseGate g = Leased();
  // A renewal asked of the old head: never answered (or an error at most).
  EXPECT_EQ(Str(g.OnTick(kT0 + milliseconds(100))), "ask_lease tick(250ms)");
  EXPECT_EQ(Str(g.OnHeadLost("connection lost", kT0 + milliseconds(500))),
            "head_lost check_head(0ms)");
  EXPECT_EQ(Str(g.OnHeadLost("again", kT0 + milliseconds(501))), "");
  EXPECT_EQ(Str(g.OnHeadTick(false, kT0 + milliseconds(500))), "check_head(20ms)");
  g.Enqueue({Save(), Commit("w0")}, false);
  EXPECT_EQ(Pump(g, kT0 + milliseconds(2000)), "");  // expired, and no head to ask
  // Silent for far longer than the wait: not counted without a head.
  EXPECT_EQ(Str(g.OnTick(kT0 + seconds(9))), "tick(250ms)");
  EXPECT_EQ(Str(g.OnHeadTick(false, kT0 + seconds(9))), "check_head(20ms)");
  EXPECT_EQ(Str(g.OnHeadTick(true, kT0 + milliseconds(9500))),
            "head_back(9000ms) follow_head ask_lease");
  EXPECT_EQ(Str(g.OnHeadTick(true, kT0 + milliseconds(9510))), "");  // found already
  EXPECT_EQ(Str(g.OnGranted(2, kLease, kT0 + milliseconds(9500))), "claim(e2)");
  EXPECT_EQ(Str(g.OnClaimed(absl::OkStatus())), "announce_epoch(e2) run_queue");
  EXPECT_EQ(Pump(g, kT0 + milliseconds(9520)), "run(save) run(commit(w0,g1,ck-1))");
}

TEST(LeaseGateTest, AStoppedGateRunsAndAsksNothing) {
  LeaseGate g = Leased();
  g.Enqueue({Step("w0", 0)}, false);
  g.Stop();
  EXPECT_EQ(Pump(g, kT0), "");
  EXPECT_EQ(Str(g.OnTick(kT0)), "");
  EXPECT_EQ(Str(g.OnHeadLost("gone", kT0)), "");
  EXPECT_EQ(Str(g.OnGranted(1, kLease, kT0)), "");
  EXPECT_EQ(g.DebugString(),
            "LeaseGate{epoch=1 length=1000ms queued=0 asked=no head=yes waiting=no stopped=yes}");
}

// (An eviction ends a rank's process: a superseded coordinator must not do that either.)
TEST(LeaseGateTest, OnlyWhatOutlivesTheIncarnationNeedsTheLease) {
  std::vector<std::string> leased;
  for (int k = 0; k <= static_cast<int>(CoreKind::kFail); ++k) {
    train::CoordinatorAction a(static_cast<CoreKind>(k));
    if (NeedsLease(a.kind)) leased.push_back(DebugString(a));
  }
  EXPECT_EQ(absl::StrJoin(leased, " "),
            "save configure(,g0,r0/1,s0,init) commit(,g0,ck-1) checkpoint(s-1,g0,w0,0 shards) "
            "evict() committed(s-1,g0,w0) finish(s-1)");
}

}  // namespace
}  // namespace troupe::actors
