// Single-actor semantics: best fit, least loaded, selectors, spot preference, affinity,
// exact accounting, node states and Unschedulable reasons. Every test runs on both placers.
#include "troupe/scheduler/scheduler.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace troupe::scheduler {
namespace {

using testing::Free;
using ::testing::HasSubstr;
using testing::MakeActor;
using testing::MakeNode;
using testing::MustPlace;

class SingleActorTest : public ::testing::TestWithParam<Scheduler::Placer> {
 protected:
  Scheduler Make() { return Scheduler(Scheduler::Options{GetParam()}); }
};

TEST_P(SingleActorTest, PackPicksTheTightestFit) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("a", {{"cpu", 8}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("b", {{"cpu", 4}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("c", {{"cpu", 16}})).ok());
  EXPECT_EQ(MustPlace(s, MakeActor("x", {{"cpu", 3}})), "b");
  EXPECT_EQ(MustPlace(s, MakeActor("y", {{"cpu", 2}})), "a");  // b has 1 left
  EXPECT_EQ(MustPlace(s, MakeActor("z", {{"cpu", 1}})), "b");  // exactly fills b
  EXPECT_EQ(MustPlace(s, MakeActor("w", {{"cpu", 10}})), "c");
}

TEST_P(SingleActorTest, SpreadPicksTheLeastLoaded) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("a", {{"cpu", 8}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("b", {{"cpu", 4}})).ok());
  EXPECT_EQ(MustPlace(s, MakeActor("1", {{"cpu", 2}}, Strategy::kSpread)), "a");  // tie: lower id
  EXPECT_EQ(MustPlace(s, MakeActor("2", {{"cpu", 1}}, Strategy::kSpread)), "b");  // a at 25%
  EXPECT_EQ(MustPlace(s, MakeActor("3", {{"cpu", 1}}, Strategy::kSpread)), "a");  // b at 25%, a 25%
  EXPECT_EQ(MustPlace(s, MakeActor("4", {{"cpu", 1}}, Strategy::kSpread)), "b");  // a 37.5%
}

TEST_P(SingleActorTest, SecondaryResourcesAreRespected) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("g1", {{"cpu", 2}, {"gpu", 1}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("g2", {{"cpu", 16}, {"gpu", 2}})).ok());
  // g1 is the tighter gpu fit but lacks cpu.
  EXPECT_EQ(MustPlace(s, MakeActor("x", {{"gpu", 1}, {"cpu", 4}})), "g2");
  EXPECT_EQ(MustPlace(s, MakeActor("y", {{"gpu", 1}, {"cpu", 2}})), "g1");
}

TEST_P(SingleActorTest, InfeasibleSaysWhatTheLargestNodeHas) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("node-1", {{"cpu", 8}, {"gpu", 2}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("node-3", {{"cpu", 8}, {"gpu", 4}})).ok());
  auto d = s.PlaceActor(MakeActor("big", {{"gpu", 8}}));
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->placed());
  EXPECT_THAT(d->unschedulable->reason, HasSubstr("needs gpu=8"));
  EXPECT_THAT(d->unschedulable->reason, HasSubstr("node-3 with gpu=4"));
  EXPECT_FALSE(d->unschedulable->retry_can_help);
  EXPECT_EQ(d->unschedulable->ToStatus().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(s.ActorNode("big").has_value());
}

TEST_P(SingleActorTest, BusySaysTheLargestFreeAndThatRetryCanHelp) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("node-1", {{"gpu", 8}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("node-3", {{"gpu", 8}})).ok());
  MustPlace(s, MakeActor("a", {{"gpu", 6}}));
  MustPlace(s, MakeActor("b", {{"gpu", 4}}));
  auto d = s.PlaceActor(MakeActor("c", {{"gpu", 8}}));
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->placed());
  EXPECT_THAT(d->unschedulable->reason,
              HasSubstr("needs gpu=8; the largest free is node-3 with gpu=4"));
  EXPECT_TRUE(d->unschedulable->retry_can_help);
  EXPECT_EQ(d->unschedulable->ToStatus().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.ReleaseActor("b").ok());
  EXPECT_EQ(MustPlace(s, MakeActor("c", {{"gpu", 8}})), "node-3");
}

TEST_P(SingleActorTest, UnknownResourceIsInfeasible) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("n", {{"cpu", 8}})).ok());
  auto d = s.PlaceActor(MakeActor("x", {{"tpu", 1}}));
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->placed());
  EXPECT_THAT(d->unschedulable->reason, HasSubstr("'tpu'"));
  EXPECT_FALSE(d->unschedulable->retry_can_help);
}

TEST_P(SingleActorTest, LabelSelectors) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("a", {{"cpu", 8}}, {{"zone", "a"}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("b", {{"cpu", 4}}, {{"zone", "b"}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("c", {{"cpu", 2}})).ok());
  ActorRequest in_a = MakeActor("x", {{"cpu", 1}});
  in_a.selector = {{"zone", LabelTerm::Op::kIn, {"a"}}};
  EXPECT_EQ(MustPlace(s, in_a), "a");
  ActorRequest not_b = MakeActor("y", {{"cpu", 1}});
  not_b.selector = {{"zone", LabelTerm::Op::kNotIn, {"b"}}};
  EXPECT_EQ(MustPlace(s, not_b), "c");  // unlabelled matches NotIn; tightest fit
  ActorRequest nowhere = MakeActor("z", {{"cpu", 1}});
  nowhere.selector = {{"zone", LabelTerm::Op::kIn, {"q"}}};
  auto d = s.PlaceActor(nowhere);
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->placed());
  EXPECT_THAT(d->unschedulable->reason, HasSubstr("zone in {q}"));
  EXPECT_FALSE(d->unschedulable->retry_can_help);
}

TEST_P(SingleActorTest, SpotPreferenceIsSoft) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("spot", {{"cpu", 2}}, {{"spot", "true"}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("ondemand", {{"cpu", 4}}, {{"spot", "false"}})).ok());
  ActorRequest coord = MakeActor("coordinator", {{"cpu", 2}});
  coord.spot = SpotPreference::kPreferOnDemand;
  EXPECT_EQ(MustPlace(s, coord), "ondemand");  // although spot is the tighter fit
  ActorRequest worker = MakeActor("worker", {{"cpu", 1}});
  worker.spot = SpotPreference::kPreferSpot;
  EXPECT_EQ(MustPlace(s, worker), "spot");
  ActorRequest writer = MakeActor("writer", {{"cpu", 2}});
  writer.spot = SpotPreference::kPreferOnDemand;
  EXPECT_EQ(MustPlace(s, writer), "ondemand");
  ActorRequest overflow = MakeActor("writer2", {{"cpu", 1}});
  overflow.spot = SpotPreference::kPreferOnDemand;
  EXPECT_EQ(MustPlace(s, overflow), "spot");  // on-demand full: falls back
}

TEST_P(SingleActorTest, AffinityAndAntiAffinity) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("a1", {{"cpu", 8}}, {{"zone", "a"}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("a2", {{"cpu", 8}}, {{"zone", "a"}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("b1", {{"cpu", 16}}, {{"zone", "b"}})).ok());
  EXPECT_EQ(MustPlace(s, MakeActor("r0", {{"cpu", 1}})), "a1");
  ActorRequest same = MakeActor("buddy", {{"cpu", 1}});
  same.affinity = {{"r0", false, ""}};
  EXPECT_EQ(MustPlace(s, same), "a1");
  ActorRequest other_node = MakeActor("r1", {{"cpu", 1}});
  other_node.affinity = {{"r0", true, ""}};
  EXPECT_EQ(MustPlace(s, other_node), "a2");
  ActorRequest other_zone = MakeActor("r2", {{"cpu", 1}});
  other_zone.affinity = {{"r0", true, "zone"}};
  EXPECT_EQ(MustPlace(s, other_zone), "b1");
  ActorRequest third = MakeActor("r3", {{"cpu", 1}});
  third.affinity = {{"r0", true, "zone"}, {"r2", true, "zone"}};
  auto d = s.PlaceActor(third);
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->placed());
  EXPECT_THAT(d->unschedulable->reason, HasSubstr("not on the zone of actor 'r0'"));
  ActorRequest orphan = MakeActor("o", {{"cpu", 1}});
  orphan.affinity = {{"missing", false, ""}};
  d = s.PlaceActor(orphan);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->placed());
  EXPECT_TRUE(d->unschedulable->retry_can_help);
}

TEST_P(SingleActorTest, AllocateReleaseIsExact) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("n", {{"cpu", 1}, {"memory", 3.3}})).ok());
  for (int i = 0; i < 10; ++i)
    MustPlace(s, MakeActor("a" + std::to_string(i), {{"cpu", 0.1}, {"memory", 0.33}}));
  EXPECT_EQ(Free(s, "n", "cpu"), 0.0);
  EXPECT_EQ(Free(s, "n", "memory"), 0.0);
  EXPECT_FALSE(s.PlaceActor(MakeActor("more", {{"cpu", 0.1}}))->placed());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s.ReleaseActor("a" + std::to_string(i)).ok());
  EXPECT_EQ(Free(s, "n", "cpu"), 1.0);
  EXPECT_EQ(Free(s, "n", "memory"), 3.3);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST_P(SingleActorTest, DrainingNodesTakeNothingNew) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("a", {{"cpu", 4}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("b", {{"cpu", 8}})).ok());
  EXPECT_EQ(MustPlace(s, MakeActor("x", {{"cpu", 1}})), "a");
  ASSERT_TRUE(s.DrainNode("a").ok());
  EXPECT_EQ(s.ActorNode("x"), "a");  // keeps what it holds
  EXPECT_EQ(MustPlace(s, MakeActor("y", {{"cpu", 1}})), "b");
  EXPECT_EQ(s.Node("a")->state, NodeState::kDraining);
  ASSERT_TRUE(s.UndrainNode("a").ok());
  EXPECT_EQ(MustPlace(s, MakeActor("z", {{"cpu", 1}})), "a");
  EXPECT_EQ(s.DrainNode("nope").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST_P(SingleActorTest, NoAliveNodeIsNotBusy) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("a", {{"cpu", 4}})).ok());
  ASSERT_TRUE(s.DrainNode("a").ok());
  auto d = s.PlaceActor(MakeActor("x", {{"cpu", 1}}));
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->placed());
  EXPECT_THAT(d->unschedulable->reason, HasSubstr("no node is alive (1 draining node(s) could"));
  EXPECT_FALSE(d->unschedulable->retry_can_help);
}

TEST_P(SingleActorTest, BadInputIsInvalidArgument) {
  Scheduler s = Make();
  EXPECT_EQ(s.AddNode(MakeNode("", {{"cpu", 1}})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.AddNode(MakeNode("n", {{"cpu", -1}})).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.AddNode(MakeNode("n", {{"cpu", 4}})).ok());
  EXPECT_EQ(s.AddNode(MakeNode("n", {{"cpu", 4}})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.PlaceActor(MakeActor("", {{"cpu", 1}})).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad = s.PlaceActor(MakeActor("x", {{"cpu", std::nan("")}}));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'cpu'"));
  EXPECT_EQ(s.PlaceActor(MakeActor("x", {{"cpu", 1}}, Strategy::kStrictPack)).status().code(),
            absl::StatusCode::kInvalidArgument);
  MustPlace(s, MakeActor("x", {{"cpu", 1}}));
  EXPECT_EQ(s.PlaceActor(MakeActor("x", {{"cpu", 1}})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ReleaseActor("y").code(), absl::StatusCode::kNotFound);
}

TEST_P(SingleActorTest, DebugStringSummarisesTheCluster) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode(MakeNode("n", {{"cpu", 4}})).ok());
  MustPlace(s, MakeActor("x", {{"cpu", 1.5}}));
  EXPECT_THAT(s.DebugString(), HasSubstr("alive=1"));
  EXPECT_THAT(s.DebugString(), HasSubstr("actors=1"));
  EXPECT_THAT(s.DebugString(), HasSubstr("cpu=2.5/4"));
}

// The example in scheduler.h's banner, kept true.
TEST_P(SingleActorTest, BannerExample) {
  Scheduler s = Make();
  ASSERT_TRUE(s.AddNode({"node-1", {{"cpu", 32}, {"gpu", 4}}, {{"zone", "a"}}}).ok());
  ASSERT_TRUE(s.AddNode({"node-2", {{"cpu", 32}, {"gpu", 4}}, {{"zone", "b"}}}).ok());
  auto d = s.PlaceActor(MakeActor("w0", {{"gpu", 8}}));
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->placed());
  EXPECT_EQ(d->unschedulable->reason,
            "needs gpu=8; no alive node could ever fit it: the largest is node-1 with gpu=4");
  EXPECT_FALSE(d->unschedulable->retry_can_help);
  PlacementGroupRequest pg;
  pg.group = "pg";
  pg.bundles = {{{"gpu", 1}}, {{"gpu", 1}}};
  pg.strategy = Strategy::kStrictSpread;
  auto g = s.CreatePlacementGroup(pg);
  ASSERT_TRUE(g.ok() && g->placed());
  EXPECT_EQ(g->bundle_nodes, (std::vector<std::string>{"node-1", "node-2"}));
  ActorRequest member = MakeActor("w1", {{"gpu", 1}});
  member.group = "pg";
  member.bundle = 1;
  EXPECT_EQ(MustPlace(s, member), "node-2");
  auto report = s.RemoveNodes({"node-1"});
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->broken.size(), 1u);  // one node left for two STRICT_SPREAD bundles
  ASSERT_EQ(report->lost.size(), 1u);
  EXPECT_EQ(report->lost[0].actor, "w1");
}

INSTANTIATE_TEST_SUITE_P(Placers, SingleActorTest,
                         ::testing::Values(Scheduler::Placer::kIndexed,
                                           Scheduler::Placer::kBruteForce),
                         [](const auto& info) {
                           return info.param == Scheduler::Placer::kIndexed ? "Indexed" : "Brute";
                         });

}  // namespace
}  // namespace troupe::scheduler
