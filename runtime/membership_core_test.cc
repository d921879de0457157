// The head's membership decisions, exactly: every test drives MembershipCore by hand with
// explicit times and asserts the full action sequence (membership_core.h draws the transitions).
#include "membership_core.h"

#include <gtest/gtest.h>

#include <csignal>

namespace troupe::runtime {
namespace {

using std::chrono::milliseconds;

const TimePoint kT0 = TimePoint{} + std::chrono::hours(1);

constexpr int kExit3 = 3 << 8;  // a wait status: exited with status 3
constexpr int kKill = SIGKILL;  // a wait status: killed by signal 9

MembershipCore::Options TestOptions() {
  MembershipCore::Options o;
  o.heartbeat_interval = milliseconds(100);  // ticks every 25 ms; a stall is a gap over 200 ms
  o.heartbeat_timeout = milliseconds(1000);
  o.hung_timeout = milliseconds(10000);
  o.exit_report_wait = milliseconds(250);
  o.protocol_version = 8;
  o.build_id = "b1";
  return o;
}

MemberInfo NodeJoin(const std::string& name) {
  MemberInfo n;
  n.id = name;
  n.resources = "cpu=2";
  n.labels = "zone=a";
  n.address = "10.0.0.1";
  n.host = "h-" + name;
  return n;
}

MemberInfo WorkerJoin(const std::string& id, const std::string& node, int64_t pid = 100) {
  MemberInfo w;
  w.id = id;
  w.node = node;
  w.pid = pid;
  w.port = 7000;
  w.direct_port = 7001;
  return w;
}

// A cluster of node n1 (generation 1) with the workers given (generations 2, 3, ...), all at kT0.
MembershipCore Cluster(const std::vector<std::string>& workers) {
  MembershipCore core(TestOptions());
  EXPECT_TRUE(core.CheckNodeJoin("n1").ok());
  EXPECT_EQ(DebugString(core.OnNodeJoined(NodeJoin("n1"), kT0)),
            "publish(+g1,node_alive,n1) place_jobs");
  for (const std::string& w : workers) {
    auto a = core.OnRegisterWorker(WorkerJoin(w, "n1"), kT0);
    EXPECT_EQ(a.size(), 1u);
  }
  return core;
}

// The one publish in `actions` of `kind` (fails the test when there is not exactly one).
MembershipEvent Published(const std::vector<MembershipAction>& actions, MembershipKind kind) {
  const MembershipAction* found = nullptr;
  for (const auto& a : actions) {
    if (a.kind == MembershipAction::Kind::kPublish && a.event.kind == kind) {
      EXPECT_EQ(found, nullptr) << "two " << Name(kind) << " in " << DebugString(actions);
      found = &a;
    }
  }
  EXPECT_NE(found, nullptr) << "no " << Name(kind) << " in " << DebugString(actions);
  return found ? found->event : MembershipEvent{};
}

TEST(MembershipCoreTest, AHelloOfAnotherVersionOrBuildIsPublishedAndRefused) {
  MembershipCore core(TestOptions());
  EXPECT_EQ(DebugString(core.OnHello(8, "b1", "node", "n1")), "");
  auto version = core.OnHello(7, "b1", "node", "n1");
  ASSERT_EQ(DebugString(version), "publish(g0,refused,n1) refuse(FAILED_PRECONDITION)");
  EXPECT_EQ(version[0].event.node, "n1") << "a node is its own node";
  EXPECT_EQ(version[0].event.detail,
            "node 'n1' refused: it speaks cluster protocol version 7, this head speaks version 8; "
            "run the same troupe release everywhere");
  EXPECT_EQ(version[1].status.message(), version[0].event.detail);
  auto build = core.OnHello(8, "b2", "worker", "n1/w0");
  ASSERT_EQ(DebugString(build), "publish(g0,refused,n1/w0) refuse(FAILED_PRECONDITION)");
  EXPECT_EQ(build[0].event.node, "");
  EXPECT_EQ(build[0].event.detail,
            "worker 'n1/w0' refused: its build id b2 differs from the head's b1; run the same "
            "binary everywhere");
  EXPECT_FALSE(build[0].bump);
  EXPECT_EQ(core.generation(), 0u) << "a refusal is no membership change";
}

TEST(MembershipCoreTest, ANodeJoinsAliveAndPlacesJobsOnceOnly) {
  MembershipCore core(TestOptions());
  ASSERT_TRUE(core.CheckNodeJoin("n1").ok());
  auto joined = core.OnNodeJoined(NodeJoin("n1"), kT0);
  ASSERT_EQ(DebugString(joined), "publish(+g1,node_alive,n1) place_jobs");
  EXPECT_EQ(joined[0].event.detail, "resources cpu=2 labels zone=a address 10.0.0.1 host h-n1");
  ASSERT_TRUE(joined[0].record.has_value());
  EXPECT_EQ(joined[0].record->state, MemberState::kAlive);
  EXPECT_EQ(joined[0].record->host, "h-n1");
  EXPECT_EQ(core.CheckNodeJoin("n1").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(core.Phase("n1"), MemberPhase::kAlive);
}

TEST(MembershipCoreTest, AWorkerJoinsOnlyAnAliveNodeAndCarriesItsAddress) {
  MembershipCore core = Cluster({});
  auto unknown = core.OnRegisterWorker(WorkerJoin("n9/w0", "n9"), kT0);
  ASSERT_EQ(DebugString(unknown), "refuse(FAILED_PRECONDITION)");
  EXPECT_EQ(unknown[0].status.message(), "worker 'n9/w0' refused: its node 'n9' is unknown");
  auto alive = core.OnRegisterWorker(WorkerJoin("n1/w0", "n1", 42), kT0);
  ASSERT_EQ(DebugString(alive), "publish(+g2,worker_alive,n1/w0)");
  EXPECT_EQ(alive[0].event.pid, 42);
  const MemberInfo* w = core.Find("n1/w0");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->address, "10.0.0.1");
  EXPECT_EQ(w->host, "h-n1");
  EXPECT_EQ(w->direct_port, 7001);
  core.OnDrain("n1", 30000, "SIGTERM");
  auto draining = core.OnRegisterWorker(WorkerJoin("n1/w1", "n1"), kT0);
  ASSERT_EQ(DebugString(draining), "refuse(FAILED_PRECONDITION)");
  EXPECT_EQ(draining[0].status.message(), "worker 'n1/w1' refused: its node 'n1' is draining");
}

TEST(MembershipCoreTest, AnExitStatusDeclaresTheWorkerDeadAtOnceAndOnlyOnce) {
  MembershipCore core = Cluster({"n1/w0"});
  auto exit = core.OnWorkerExit("n1/w0", "boom\n", kExit3, false);
  ASSERT_EQ(DebugString(exit),
            "release_leases(n1/w0) release_actors(n1/w0) sched_drain(n1) flush_after(250ms,n1/w0) "
            "publish(+g3,worker_down,n1/w0,exited)");
  EXPECT_EQ(exit[1].detail, "worker n1/w0 died: process exited with status 3");
  MembershipEvent down = Published(exit, MembershipKind::kWorkerDown);
  EXPECT_EQ(down.detail, "process exited with status 3");
  EXPECT_EQ(down.stderr_tail, "boom\n");
  EXPECT_EQ(down.exit_code, 3);
  EXPECT_EQ(core.Phase("n1/w0"), MemberPhase::kDeadExited);
  EXPECT_EQ(DebugString(core.OnFlush("n1/w0")), "") << "already reported";
  EXPECT_EQ(DebugString(core.OnWorkerExit("n1/w0", "", kExit3, false)), "");
  EXPECT_EQ(DebugString(core.OnConnectionLost("n1/w0", "x")), "");
  auto again = core.OnRegisterWorker(WorkerJoin("n1/w0", "n1"), kT0);
  ASSERT_EQ(DebugString(again), "refuse(FAILED_PRECONDITION)");
  EXPECT_EQ(again[0].status.message(), "worker 'n1/w0' refused: it was declared dead");
}

TEST(MembershipCoreTest, ALostConnectionHoldsTheDownForTheExitStatus) {
  MembershipCore core = Cluster({"n1/w0"});
  auto lost = core.OnConnectionLost("n1/w0", "remote_link_unreachable");
  ASSERT_EQ(DebugString(lost), "release_actors(n1/w0) sched_drain(n1) flush_after(250ms,n1/w0)");
  EXPECT_EQ(core.Phase("n1/w0"), MemberPhase::kDownPending);
  EXPECT_EQ(core.generation(), 2u) << "nothing published yet";
  auto exit = core.OnWorkerExit("n1/w0", "", kKill, false);
  ASSERT_EQ(DebugString(exit), "release_leases(n1/w0) publish(+g3,worker_down,n1/w0,signaled)");
  EXPECT_EQ(exit[1].event.detail, "process killed by signal 9 (Killed)");
  EXPECT_EQ(exit[1].event.signal, 9);
  EXPECT_EQ(DebugString(core.OnFlush("n1/w0")), "") << "the flush finds it reported";
}

TEST(MembershipCoreTest, AFlushWithoutStatusPublishesTheLossAndTheStatusFollowsUnbumped) {
  MembershipCore core = Cluster({"n1/w0"});
  core.OnConnectionLost("n1/w0", "remote_link_unreachable");
  auto flush = core.OnFlush("n1/w0");
  ASSERT_EQ(DebugString(flush), "publish(+g3,worker_down,n1/w0,lost)");
  EXPECT_EQ(flush[0].event.detail, "connection lost (remote_link_unreachable)");
  EXPECT_EQ(core.Phase("n1/w0"), MemberPhase::kDead);
  auto late = core.OnWorkerExit("n1/w0", "tail", kExit3, false);
  ASSERT_EQ(DebugString(late), "release_leases(n1/w0) publish(g3,worker_exit,n1/w0,exited)");
  EXPECT_EQ(late[1].event.detail, "process exited with status 3");
  EXPECT_EQ(late[1].event.stderr_tail, "tail");
  EXPECT_FALSE(late[1].record.has_value()) << "nothing stored for an unbumped event";
  EXPECT_EQ(core.Phase("n1/w0"), MemberPhase::kDeadExited);
  EXPECT_EQ(DebugString(core.OnWorkerExit("n1/w0", "", kExit3, false)), "");
}

TEST(MembershipCoreTest, OnlyTheLastAliveWorkerTakesAnAliveNodeOutOfPlacement) {
  MembershipCore core = Cluster({"n1/w0", "n1/w1"});
  EXPECT_EQ(DebugString(core.OnWorkerExit("n1/w0", "", kKill, false)),
            "release_leases(n1/w0) release_actors(n1/w0) flush_after(250ms,n1/w0) "
            "publish(+g4,worker_down,n1/w0,signaled)");
  EXPECT_EQ(DebugString(core.OnWorkerExit("n1/w1", "", kKill, false)),
            "release_leases(n1/w1) release_actors(n1/w1) sched_drain(n1) flush_after(250ms,n1/w1) "
            "publish(+g5,worker_down,n1/w1,signaled)");
  MembershipCore draining = Cluster({"n1/w0"});
  draining.OnDrain("n1", 1000, "SIGTERM");
  EXPECT_EQ(DebugString(draining.OnWorkerExit("n1/w0", "", kKill, false)),
            "release_leases(n1/w0) release_actors(n1/w0) flush_after(250ms,n1/w0) "
            "publish(+g4,worker_down,n1/w0,signaled)")
      << "a draining node is out of placement already";
}

TEST(MembershipCoreTest, ADrainPublishesOnceAndAReleaseNeedsADrainingNode) {
  MembershipCore core = Cluster({"n1/w0"});
  EXPECT_EQ(DebugString(core.OnRelease("n1")), "") << "alive, not draining";
  auto drain = core.OnDrain("n1", 30000, "aws spot interruption");
  ASSERT_EQ(DebugString(drain), "sched_drain(n1) publish(+g3,node_draining,n1)");
  EXPECT_EQ(drain[1].event.detail,
            "preemption notice (aws spot interruption); leaves within 30000ms");
  EXPECT_EQ(drain[1].record->state, MemberState::kDraining);
  EXPECT_EQ(DebugString(core.OnDrain("n1", 30000, "again")), "");
  EXPECT_EQ(DebugString(core.OnRelease("n1")), "release_node(n1)");
  EXPECT_EQ(DebugString(core.OnRelease("n1/w0")), "") << "a worker is no node";
  EXPECT_EQ(core.Phase("n1/w0"), MemberPhase::kAlive) << "its workers run on until it leaves";
}

TEST(MembershipCoreTest, ALeavingNodeTakesItsWorkersFirstThenFailsItsJobs) {
  MembershipCore core = Cluster({"n1/w0", "n1/w1"});
  auto leave = core.OnLeave("n1");
  ASSERT_EQ(DebugString(leave),
            "release_actors(n1/w0) flush_after(250ms,n1/w0) publish(+g4,worker_down,n1/w0,lost) "
            "release_actors(n1/w1) sched_drain(n1) flush_after(250ms,n1/w1) "
            "publish(+g5,worker_down,n1/w1,lost) fail_jobs(n1) sched_remove(n1) "
            "publish(+g6,node_dead,n1,exited)");
  EXPECT_EQ(leave[2].event.detail, "its node left");
  EXPECT_EQ(leave[7].detail, "its driver's node n1 left");
  EXPECT_EQ(leave[9].event.exit_code, 0) << "a node that left exits 0";
  EXPECT_EQ(leave[9].record->state, MemberState::kDead);
  EXPECT_EQ(DebugString(core.OnLeave("n1")), "");
  EXPECT_TRUE(core.CheckNodeJoin("n1").ok()) << "a dead node's name joins again";
}

// Ticks every 200 ms (two heartbeat intervals: no stall) while only the node heartbeats.
TEST(MembershipCoreTest, ASilentWorkerIsFencedAtTheFirstTickPastTheTimeout) {
  MembershipCore core = Cluster({"n1/w0"});
  for (int ms = 200; ms <= 1000; ms += 200) {
    core.OnHeartbeat("n1", {}, kT0 + milliseconds(ms));
    EXPECT_EQ(DebugString(core.OnTick(kT0 + milliseconds(ms))), "") << ms;
  }
  auto fenced = core.OnTick(kT0 + milliseconds(1200));
  ASSERT_EQ(DebugString(fenced),
            "release_actors(n1/w0) sched_drain(n1) flush_after(250ms,n1/w0) "
            "publish(+g3,worker_down,n1/w0,fenced) fence(n1,n1/w0)");
  EXPECT_EQ(fenced[3].event.detail, "fenced: no heartbeat for 1200ms (timeout 1000ms)");
  // Its node agent killed it on the fence: the status follows, unbumped.
  EXPECT_EQ(DebugString(core.OnWorkerExit("n1/w0", "", kKill, true)),
            "release_leases(n1/w0) publish(g3,worker_exit,n1/w0,fenced)");
  EXPECT_EQ(DebugString(core.OnRegisterWorker(WorkerJoin("n1/w0", "n1"), kT0)),
            "refuse(FAILED_PRECONDITION)");
}

// Silences one after another (bench/scale): each is found, not only the first.
TEST(MembershipCoreTest, WorkersFallingSilentOneAfterAnotherAreEachFenced) {
  MembershipCore core = Cluster({"n1/w0", "n1/w1", "n1/w2"});
  std::set<std::string> silent;
  std::string fenced;
  for (int ms = 100; ms <= 8000; ms += 100) {
    const TimePoint t = kT0 + milliseconds(ms);
    if (ms == 1000) silent.insert("n1/w0");
    if (ms == 3000) silent.insert("n1/w1");
    for (const char* id : {"n1", "n1/w0", "n1/w1", "n1/w2"}) {
      if (!silent.count(id)) core.OnHeartbeat(id, {id == std::string("n1") ? 0u : 1u, 1, {}}, t);
    }
    for (const MembershipAction& a : core.OnTick(t)) {
      if (a.kind == MembershipAction::Kind::kFence) fenced += a.member + " ";
    }
  }
  EXPECT_EQ(fenced, "n1/w0 n1/w1 ");
}

TEST(MembershipCoreTest, ASilentNodeFencesItsWorkersThenDiesWithThem) {
  MembershipCore core = Cluster({"n1/w0"});
  core.OnTick(kT0);
  core.OnTick(kT0 + milliseconds(200));
  core.OnTick(kT0 + milliseconds(400));
  core.OnTick(kT0 + milliseconds(600));
  core.OnTick(kT0 + milliseconds(800));
  core.OnTick(kT0 + milliseconds(1000));
  auto dead = core.OnTick(kT0 + milliseconds(1001));
  ASSERT_EQ(DebugString(dead),
            "fence(n1,n1/w0) release_actors(n1/w0) sched_drain(n1) flush_after(250ms,n1/w0) "
            "publish(+g3,worker_down,n1/w0,lost) fail_jobs(n1) sched_remove(n1) "
            "publish(+g4,node_dead,n1,lost)");
  EXPECT_EQ(dead[4].event.detail, "its node no heartbeat for 1001ms (timeout 1000ms)");
  EXPECT_EQ(dead[7].event.detail, "no heartbeat for 1001ms (timeout 1000ms)");
  EXPECT_EQ(dead[7].event.exit_code, -1);
}

TEST(MembershipCoreTest, ADeadNodeHeardFromAgainIsAskedToRejoinOnceAndRejoinsAsNew) {
  MembershipCore core = Cluster({"n1/w0"});
  core.OnConnectionLost("n1", "remote_link_unreachable");
  EXPECT_EQ(core.Phase("n1"), MemberPhase::kDead);
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1", {}, kT0)), "ask_rejoin(n1)");
  EXPECT_EQ(core.Phase("n1"), MemberPhase::kDeadRejoining);
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1", {}, kT0)), "");
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {}, kT0)), "") << "a dead worker is not";
  ASSERT_TRUE(core.CheckNodeJoin("n1").ok());
  EXPECT_EQ(DebugString(core.OnNodeJoined(NodeJoin("n1"), kT0)),
            "publish(+g5,node_alive,n1) place_jobs");
  EXPECT_EQ(core.Phase("n1"), MemberPhase::kAlive);
  EXPECT_EQ(DebugString(core.OnRegisterWorker(WorkerJoin("n1/w0", "n1"), kT0)),
            "refuse(FAILED_PRECONDITION)")
      << "its old worker stays fenced";
  EXPECT_EQ(DebugString(core.OnRegisterWorker(WorkerJoin("n1/w1", "n1"), kT0)),
            "publish(+g6,worker_alive,n1/w1)");
}

// The head itself went unscheduled for 1.5 s: its members were not silent, it was.
TEST(MembershipCoreTest, AStalledHeadShiftsSilenceByTheStallInsteadOfBlamingItsMembers) {
  MembershipCore core = Cluster({"n1/w0"});
  EXPECT_EQ(DebugString(core.OnTick(kT0)), "");
  // 1500 ms late: everyone's last heartbeat moves by 1500 - 25 (one tick period) = 1475 ms.
  EXPECT_EQ(DebugString(core.OnTick(kT0 + milliseconds(1500))), "");
  // Silence is counted from kT0 + 1475 ms now: ticks 200 ms apart (no stall) stay within the
  // timeout up to kT0 + 2300 ms...
  for (int ms = 1700; ms <= 2300; ms += 200) {
    EXPECT_EQ(DebugString(core.OnTick(kT0 + milliseconds(ms))), "") << ms;
  }
  // ...and pass it at kT0 + 2500 ms, 1025 ms after the shifted heartbeat.
  auto dead = core.OnTick(kT0 + milliseconds(2500));
  ASSERT_EQ(Published(dead, MembershipKind::kNodeDead).detail,
            "no heartbeat for 1025ms (timeout 1000ms)");
}

// The boundary: a gap of exactly two heartbeat intervals is no stall, one more millisecond is.
TEST(MembershipCoreTest, AStallIsAGapOfMoreThanTwoIntervalsLessOneTick) {
  MembershipCore exact = Cluster({});
  exact.OnTick(kT0);
  for (int ms = 200; ms <= 1000; ms += 200) {
    EXPECT_EQ(DebugString(exact.OnTick(kT0 + milliseconds(ms))), "") << ms;
  }
  EXPECT_EQ(Published(exact.OnTick(kT0 + milliseconds(1001)), MembershipKind::kNodeDead).detail,
            "no heartbeat for 1001ms (timeout 1000ms)");

  MembershipCore late = Cluster({});
  late.OnTick(kT0);
  // 201 ms late: a stall of 201 - 25 = 176 ms, so the silence is counted from kT0 + 176 ms.
  EXPECT_EQ(DebugString(late.OnTick(kT0 + milliseconds(201))), "");
  for (int ms = 401; ms <= 1001; ms += 200) {
    EXPECT_EQ(DebugString(late.OnTick(kT0 + milliseconds(ms))), "") << ms;
  }
  EXPECT_EQ(DebugString(late.OnTick(kT0 + milliseconds(1176))), "") << "exactly the timeout";
  EXPECT_EQ(Published(late.OnTick(kT0 + milliseconds(1177)), MembershipKind::kNodeDead).detail,
            "no heartbeat for 1001ms (timeout 1000ms)");
}

// Cluster({...}) plus node n2 with worker n2/w0, all at kT0.
MembershipCore TwoNodes() {
  MembershipCore core = Cluster({"n1/w0"});
  EXPECT_TRUE(core.CheckNodeJoin("n2").ok());
  core.OnNodeJoined(NodeJoin("n2"), kT0);
  core.OnRegisterWorker(WorkerJoin("n2/w0", "n2"), kT0);
  return core;
}

// Seen in the suite: a head whose ticks ran on time heard none of its 3 nodes and 6 workers for
// ~1 s (their last beats within 10 ms of each other) and declared them all dead, the job with
// them. Nobody heard at all is the head's side (or everyone starved at once), not 9 deaths.
TEST(MembershipCoreTest, AHeadThatHearsNoMemberGivesNoVerdictAndCreditsItWhenBeatsResume) {
  MembershipCore core = TwoNodes();
  auto beat = [&core](std::vector<const char*> ids, int ms) {
    for (const char* id : ids) core.OnHeartbeat(id, {}, kT0 + milliseconds(ms));
  };
  // Beats every 100 ms up to 1000 ms, then none; ticks every 100 ms (the head is on time).
  for (int ms = 100; ms <= 2400; ms += 100) {
    if (ms <= 1000) beat({"n1", "n1/w0", "n2", "n2/w0"}, ms);
    EXPECT_EQ(DebugString(core.OnTick(kT0 + milliseconds(ms))), "") << ms;
  }
  // n1's backlog arrives first: everyone's silence moves by the 1400 ms of deafness less one
  // interval, so the others are not blamed before theirs arrives too.
  beat({"n1"}, 2410);
  EXPECT_EQ(DebugString(core.OnTick(kT0 + milliseconds(2425))), "");
  beat({"n1", "n1/w0", "n2", "n2/w0"}, 2450);
  // From here n2 and its worker are silent for real while n1's beats come: n2 is declared dead
  // one timeout after its last beat.
  for (int ms = 2500; ms <= 3400; ms += 100) {
    beat({"n1", "n1/w0"}, ms);
    EXPECT_EQ(DebugString(core.OnTick(kT0 + milliseconds(ms))), "") << ms;
  }
  beat({"n1", "n1/w0"}, 3500);
  auto dead = core.OnTick(kT0 + milliseconds(3500));
  EXPECT_EQ(Published(dead, MembershipKind::kNodeDead).detail,
            "no heartbeat for 1050ms (timeout 1000ms)");
  EXPECT_EQ(Published(dead, MembershipKind::kNodeDead).subject, "n2");
}

// A whole cluster silent for real (the head cut off from it) is declared dead, one timeout later
// than a single silent node.
TEST(MembershipCoreTest, AClusterSilentTogetherIsDeclaredDeadAfterTwoTimeouts) {
  MembershipCore core = TwoNodes();
  for (int ms = 100; ms <= 2000; ms += 100) {
    EXPECT_EQ(DebugString(core.OnTick(kT0 + milliseconds(ms))), "") << ms;
  }
  std::vector<std::string> dead;
  for (const MembershipAction& a : core.OnTick(kT0 + milliseconds(2100))) {
    if (a.kind == MembershipAction::Kind::kPublish && a.event.kind == MembershipKind::kNodeDead) {
      dead.push_back(a.event.subject + ": " + a.event.detail);
    }
  }
  EXPECT_EQ(dead, (std::vector<std::string>{"n1: no heartbeat for 2100ms (timeout 1000ms)",
                                            "n2: no heartbeat for 2100ms (timeout 1000ms)"}));
}

TEST(MembershipCoreTest, TheFirstTickHasNoStallToCompensate) {
  MembershipCore core = Cluster({"n1/w0"});
  auto dead = core.OnTick(kT0 + milliseconds(5000));
  EXPECT_EQ(DebugString(dead),
            "fence(n1,n1/w0) release_actors(n1/w0) sched_drain(n1) flush_after(250ms,n1/w0) "
            "publish(+g3,worker_down,n1/w0,lost) fail_jobs(n1) sched_remove(n1) "
            "publish(+g4,node_dead,n1,lost)");
}

TEST(MembershipCoreTest, AHeartbeatKeepsAMemberAliveAndAHungActorIsPublishedOnce) {
  MembershipCore core = Cluster({"n1/w0"});
  for (int ms = 200; ms <= 3000; ms += 200) {
    core.OnHeartbeat("n1", {}, kT0 + milliseconds(ms));
    core.OnHeartbeat("n1/w0", {0, 1, {ActorBusy{"a1", 7, 0}}}, kT0 + milliseconds(ms));
    EXPECT_EQ(DebugString(core.OnTick(kT0 + milliseconds(ms))), "") << ms;
  }
  // A handler reported once (busy 9999 ms, version 1): the beats after it carry nothing, and the
  // head's own clock says when it has run for hung_timeout.
  const TimePoint t = kT0 + milliseconds(3000);
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {0, 1, {ActorBusy{"a1", 7, 9999}}}, t)), "");
  auto hung = core.OnHeartbeat("n1/w0", {1, 1, {}}, t + milliseconds(1));
  ASSERT_EQ(DebugString(hung), "publish(g2,actor_hung,a1)");
  EXPECT_EQ(hung[0].event.detail, "handler running for 10000ms on worker n1/w0 (progress 7)");
  EXPECT_EQ(hung[0].event.node, "n1");
  EXPECT_EQ(hung[0].event.pid, 100);
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {1, 1, {}}, t + milliseconds(3000))), "")
      << "published once";
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {1, 2, {ActorBusy{"a1", 8, 0}}}, t)), "");
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {2, 3, {ActorBusy{"a1", 8, 10001}}}, t)),
            "publish(g2,actor_hung,a1)")
      << "hung again after it was seen idle";
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {3, 4, {ActorBusy{"a1", 9, 0}}}, t)), "");
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {4, 4, {}}, t + milliseconds(20000))), "")
      << "idle: nothing to publish however long it stays so";
  EXPECT_EQ(core.generation(), 2u);
}

// A heartbeat whose base is not the head's copy (a head that took over, a member it registered
// again) changes nothing and asks the member for a full one, once per heartbeat_timeout; the
// member stays alive meanwhile.
TEST(MembershipCoreTest, HeartbeatsThatDoNotChainAskForAFullOneAndChangeNothing) {
  MembershipCore core = Cluster({"n1/w0"});
  const ActorBusy long_handler{"a1", 5, 20000};
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {4, 5, {long_handler}}, kT0 + milliseconds(600))),
            "sync_heartbeats(n1/w0)");
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {5, 6, {}}, kT0 + milliseconds(1200))), "")
      << "asked already";
  core.OnHeartbeat("n1", {}, kT0 + milliseconds(1200));
  EXPECT_EQ(DebugString(core.OnTick(kT0 + milliseconds(1500))), "") << "alive all the same";
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {6, 7, {}}, kT0 + milliseconds(1600))),
            "sync_heartbeats(n1/w0)")
      << "asked again after heartbeat_timeout";
  EXPECT_EQ(
      DebugString(core.OnHeartbeat("n1/w0", {0, 8, {long_handler}}, kT0 + milliseconds(1700))),
      "publish(g2,actor_hung,a1)")
      << "the full heartbeat applies";
  EXPECT_EQ(DebugString(core.OnHeartbeat("n1/w0", {8, 9, {ActorBusy{"a1", 6, 0}}},
                                         kT0 + milliseconds(1750))),
            "");
  EXPECT_EQ(
      DebugString(core.OnHeartbeat("n1/w0", {8, 10, {long_handler}}, kT0 + milliseconds(1800))),
      "sync_heartbeats(n1/w0)")
      << "a delta from a version the head has passed";
}

TEST(MembershipCoreTest, ARestoredHeadGoesOnFromItsGenerationAndRefusesTheDead) {
  MembershipCore core(TestOptions());
  MemberInfo dead = WorkerJoin("n1/w0", "n1");
  dead.kind = MemberKind::kWorker;
  dead.state = MemberState::kDead;
  MemberInfo node = NodeJoin("n1");
  node.state = MemberState::kAlive;
  core.Restore(41, {node, dead});
  EXPECT_EQ(core.Phase("n1"), MemberPhase::kAbsent) << "members re-register as they reconnect";
  EXPECT_EQ(DebugString(core.OnNodeJoined(NodeJoin("n1"), kT0)),
            "publish(+g42,node_alive,n1) place_jobs");
  EXPECT_EQ(DebugString(core.OnRegisterWorker(WorkerJoin("n1/w0", "n1"), kT0)),
            "refuse(FAILED_PRECONDITION)");
  EXPECT_EQ(DebugString(core.OnRegisterWorker(WorkerJoin("n1/w1", "n1"), kT0)),
            "publish(+g43,worker_alive,n1/w1)");
}

// Found by `troupe chaos run --lab` (kill-head@25 stop-worker@33:1): a worker stopped while the
// head restarted never registered with the new head, which did not know it, so nobody declared
// it dead and every generation counting on it waited out its bootstrap. The restored head expects
// the previous head's alive members back within 2 × heartbeat_timeout of its first tick; one that
// is not back is declared dead as silent, and fenced through its node if that came back.
TEST(MembershipCoreTest, ARestoredMemberThatNeverComesBackIsDeclaredDeadAndFenced) {
  MembershipCore core(TestOptions());
  MemberInfo node = NodeJoin("n1");
  node.state = MemberState::kAlive;
  MemberInfo back = WorkerJoin("n1/w0", "n1"), stopped = WorkerJoin("n1/w1", "n1", 101);
  back.kind = stopped.kind = MemberKind::kWorker;
  back.state = stopped.state = MemberState::kAlive;
  core.Restore(41, {node, back, stopped});
  EXPECT_EQ(DebugString(core.OnTick(kT0)), "");
  EXPECT_EQ(DebugString(core.OnNodeJoined(NodeJoin("n1"), kT0 + milliseconds(300))),
            "publish(+g42,node_alive,n1) place_jobs");
  EXPECT_EQ(DebugString(core.OnRegisterWorker(WorkerJoin("n1/w0", "n1"), kT0 + milliseconds(300))),
            "publish(+g43,worker_alive,n1/w0)");
  std::string out;
  for (int ms = 25; ms <= 2000; ms += 25) {
    if (ms % 100 == 0) {
      core.OnHeartbeat("n1", {}, kT0 + milliseconds(ms));
      core.OnHeartbeat("n1/w0", {}, kT0 + milliseconds(ms));
    }
    out += DebugString(core.OnTick(kT0 + milliseconds(ms)));
  }
  EXPECT_EQ(out, "") << "within 2 × heartbeat_timeout, nobody is declared dead";
  {
    // A stall of the head's own inside that window is not the members': it extends the wait
    // (here by 1.875 s: nobody is expected before 3.875 s).
    MembershipCore stalled(TestOptions());
    stalled.Restore(41, {node, back, stopped});
    EXPECT_EQ(DebugString(stalled.OnTick(kT0)), "");
    std::string early, late;
    for (int ms = 1900; ms <= 4000; ms += 25) {
      (ms <= 3875 ? early : late) += DebugString(stalled.OnTick(kT0 + milliseconds(ms)));
    }
    EXPECT_EQ(early, "");
    EXPECT_NE(late.find("release_actors(n1/w1)"), std::string::npos) << late;
    EXPECT_NE(late.find("node_dead,n1"), std::string::npos) << "its node never came back either";
  }
  EXPECT_EQ(core.Phase("n1/w1"), MemberPhase::kAbsent);
  out = DebugString(core.OnTick(kT0 + milliseconds(2025)));
  EXPECT_NE(out.find("fence(n1,n1/w1)"), std::string::npos) << out;
  EXPECT_NE(out.find("release_actors(n1/w1)"), std::string::npos) << out;
  EXPECT_EQ(out.find("n1/w0"), std::string::npos) << "the worker that came back stays: " << out;
  EXPECT_EQ(core.Phase("n1/w0"), MemberPhase::kAlive);
  core.OnFlush("n1/w1");
  EXPECT_EQ(core.Phase("n1/w1"), MemberPhase::kDead);
  EXPECT_EQ(DebugString(core.OnRegisterWorker(stopped, kT0 + milliseconds(3000))),
            "refuse(FAILED_PRECONDITION)")
      << "declared dead: it stays out";
}

TEST(MembershipCoreTest, EventsAboutStrangersChangeNothing) {
  MembershipCore core = Cluster({"n1/w0"});
  const std::string before = core.DebugString();
  EXPECT_EQ(DebugString(core.OnHeartbeat("x", {}, kT0)), "");
  EXPECT_EQ(DebugString(core.OnWorkerExit("x", "", kKill, false)), "");
  EXPECT_EQ(DebugString(core.OnFlush("x")), "");
  EXPECT_EQ(DebugString(core.OnFlush("n1/w0")), "") << "alive: nothing to flush";
  EXPECT_EQ(DebugString(core.OnConnectionLost("x", "r")), "");
  EXPECT_EQ(DebugString(core.OnDrain("x", 1, "n")), "");
  EXPECT_EQ(DebugString(core.OnRelease("x")), "");
  EXPECT_EQ(DebugString(core.OnLeave("x")), "");
  EXPECT_EQ(core.DebugString(), before);
  EXPECT_EQ(before, "generation 2; n1 node alive; n1/w0 worker alive");
}

}  // namespace
}  // namespace troupe::runtime
