// The membership enums of cluster.h: text round trips, the errors at the text edge, and how a
// MembershipEvent prints and travels.
#include <gtest/gtest.h>

#include <vector>

#include "caf/binary_deserializer.hpp"
#include "caf/binary_serializer.hpp"
#include "caf/deep_to_string.hpp"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime {
namespace {

TEST(MembershipNamesTest, MemberKindRoundTrips) {
  for (MemberKind k : {MemberKind::kNode, MemberKind::kWorker}) {
    absl::StatusOr<MemberKind> back = ParseMemberKind(Name(k));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, k) << Name(k);
  }
  EXPECT_STREQ(Name(MemberKind::kNode), "node");
  EXPECT_STREQ(Name(MemberKind::kWorker), "worker");
}

TEST(MembershipNamesTest, MemberStateRoundTrips) {
  const std::vector<std::pair<MemberState, std::string>> all = {
      {MemberState::kJoining, "joining"},
      {MemberState::kAlive, "alive"},
      {MemberState::kDraining, "draining"},
      {MemberState::kDead, "dead"}};
  for (const auto& [s, text] : all) {
    EXPECT_EQ(Name(s), text);
    absl::StatusOr<MemberState> back = ParseMemberState(text);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, s) << text;
  }
}

TEST(MembershipNamesTest, MembershipKindRoundTrips) {
  const std::vector<std::pair<MembershipKind, std::string>> all = {
      {MembershipKind::kNodeAlive, "node_alive"},
      {MembershipKind::kNodeDraining, "node_draining"},
      {MembershipKind::kNodeDead, "node_dead"},
      {MembershipKind::kWorkerAlive, "worker_alive"},
      {MembershipKind::kWorkerDown, "worker_down"},
      {MembershipKind::kWorkerExit, "worker_exit"},
      {MembershipKind::kActorHung, "actor_hung"},
      {MembershipKind::kRefused, "refused"}};
  for (const auto& [k, text] : all) {
    EXPECT_EQ(Name(k), text);
    absl::StatusOr<MembershipKind> back = ParseMembershipKind(text);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, k) << text;
  }
}

TEST(MembershipNamesTest, UnknownNamesNameTheFieldTheChoicesAndTheText) {
  absl::StatusOr<MemberKind> kind = ParseMemberKind("head");
  ASSERT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kind.status().message(), "member kind: expected node or worker, got 'head'");

  absl::StatusOr<MemberState> state = ParseMemberState("Alive");
  ASSERT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state.status().message(),
            "member state: expected joining, alive, draining or dead, got 'Alive'");

  absl::StatusOr<MembershipKind> event = ParseMembershipKind("");
  ASSERT_EQ(event.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(event.status().message(),
            "membership event kind: expected node_alive, node_draining, node_dead, worker_alive, "
            "worker_down, worker_exit, actor_hung or refused, got ''");

  EXPECT_STREQ(Name(static_cast<MemberState>(42)), "?");
}

MembershipEvent WorkerDown() {
  MembershipEvent e;
  e.generation = 7;
  e.kind = MembershipKind::kWorkerDown;
  e.subject = "n1/w0";
  e.node = "n1";
  e.pid = 4242;
  e.detail = "process killed by signal 9 (Killed)";
  e.stderr_tail = "a\nb";
  e.cause = base::ExitCause::kSignaled;
  e.signal = 9;
  return e;
}

TEST(MembershipEventTest, DebugStringPrintsTheNames) {
  EXPECT_EQ(WorkerDown().DebugString(),
            "gen=7 event=worker_down subject=n1/w0 node=n1 pid=4242 cause=signaled signal=9 "
            "detail=\"process killed by signal 9 (Killed)\" stderr_tail=\"a|b\"");
  MembershipEvent alive;
  alive.generation = 1;
  alive.kind = MembershipKind::kNodeAlive;
  alive.subject = "n1";
  EXPECT_EQ(alive.DebugString(), "gen=1 event=node_alive subject=n1");
}

TEST(MembershipEventTest, ProcessExitCarriesTheCauseAndTheKindsName) {
  base::SupervisionEvent p = WorkerDown().ToProcessExit("head");
  EXPECT_EQ(p.event, "process_exit");
  EXPECT_EQ(p.cause, base::ExitCause::kSignaled);
  EXPECT_EQ(p.reason, "worker_down: process killed by signal 9 (Killed)");
  MembershipEvent dead;
  dead.kind = MembershipKind::kNodeDead;
  EXPECT_EQ(dead.ToProcessExit("head").cause, base::ExitCause::kLost) << "no status seen: lost";
}

// x written by CAF's binary serializer and read back.
template <class T>
T ThroughCaf(T x) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  EXPECT_FALSE(sink(x));
  T back{};
  caf::binary_deserializer source{nullptr, buf};
  EXPECT_FALSE(source(back));
  return back;
}

// CAF 0.17 carries the enums as their underlying integers; CAF's own printing shows the names.
TEST(MembershipEventTest, EnumsSurviveCafSerialization) {
  MembershipEvent e = WorkerDown();
  EXPECT_EQ(ThroughCaf(e).DebugString(), e.DebugString());

  MemberInfo m{"n1/w0", MemberKind::kWorker, "n1",       MemberState::kDraining, 7, "",
               "",      "10.0.0.7",          "machine-7"};
  MemberInfo m2 = ThroughCaf(m);
  EXPECT_EQ(m2.kind, MemberKind::kWorker);
  EXPECT_EQ(m2.state, MemberState::kDraining);
  EXPECT_EQ(m2.address, "10.0.0.7");
  EXPECT_EQ(m2.host, "machine-7");

  const std::string text = caf::deep_to_string(e);
  EXPECT_NE(text.find("worker_down"), std::string::npos) << text;
  EXPECT_NE(text.find("signaled"), std::string::npos) << text;
  EXPECT_NE(caf::deep_to_string(m).find("draining"), std::string::npos);

  NodeFault f{NodeFaultKind::kDrop, 3000, 5};
  NodeFault f2 = ThroughCaf(f);
  EXPECT_EQ(f2.kind, NodeFaultKind::kDrop);
  EXPECT_EQ(f2.duration_ms, 3000);
  EXPECT_EQ(f2.drop_percent, 5);
  EXPECT_NE(caf::deep_to_string(f).find("drop"), std::string::npos) << caf::deep_to_string(f);
  NodeFault d{NodeFaultKind::kDelay, 2000, 0, 5000, 1000};
  NodeFault d2 = ThroughCaf(d);
  EXPECT_EQ(d2.kind, NodeFaultKind::kDelay);
  EXPECT_EQ(d2.delay_us, 5000);
  EXPECT_EQ(d2.jitter_us, 1000);
  NodeFault flap{NodeFaultKind::kFlap, 4000, 0, 0, 0, 500};
  NodeFault flap2 = ThroughCaf(flap);
  EXPECT_EQ(flap2.kind, NodeFaultKind::kFlap);
  EXPECT_EQ(flap2.period_ms, 500);
}

}  // namespace
}  // namespace troupe::runtime
