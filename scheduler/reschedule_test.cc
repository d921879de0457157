// Rescheduling after node loss: only what the dead nodes held moves; groups are repaired or
// reported broken and released, never left partial.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "troupe/scheduler/scheduler.h"

namespace troupe::scheduler {
namespace {

using testing::Free;
using ::testing::HasSubstr;
using testing::MakeActor;
using testing::MakeGroup;
using testing::MakeNode;
using testing::MustPlace;

TEST(RescheduleTest, OnlyActorsOnDeadNodesMove) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(MakeNode("a", {{"cpu", 4}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("b", {{"cpu", 4}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("c", {{"cpu", 8}})).ok());
  EXPECT_EQ(MustPlace(s, MakeActor("x", {{"cpu", 3}})), "a");
  EXPECT_EQ(MustPlace(s, MakeActor("y", {{"cpu", 3}})), "b");
  EXPECT_EQ(MustPlace(s, MakeActor("z", {{"cpu", 1}})), "a");
  auto report = s.RemoveNodes({"a"});
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->moved.size(), 2u);
  EXPECT_EQ(report->moved[0].actor, "x");  // in placement order
  EXPECT_EQ(report->moved[0].from, "a");
  EXPECT_EQ(report->moved[0].to, "c");
  EXPECT_EQ(report->moved[1].actor, "z");
  EXPECT_EQ(report->moved[1].to, "b");  // tightest fit among the survivors
  EXPECT_EQ(s.ActorNode("y"), "b");     // untouched
  EXPECT_TRUE(report->lost.empty());
  EXPECT_FALSE(s.Node("a").has_value());
  EXPECT_EQ(s.alive_nodes(), 2);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST(RescheduleTest, ActorsThatNoLongerFitAreReportedWithAReason) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(MakeNode("g", {{"gpu", 8}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("c", {{"cpu", 8}})).ok());
  MustPlace(s, MakeActor("trainer", {{"gpu", 8}}));
  MustPlace(s, MakeActor("loader", {{"cpu", 1}}));
  auto report = s.RemoveNodes({"g"});
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->lost.size(), 1u);
  EXPECT_EQ(report->lost[0].actor, "trainer");
  EXPECT_EQ(report->lost[0].from, "g");
  EXPECT_THAT(report->lost[0].why.reason, HasSubstr("needs gpu=8"));
  EXPECT_FALSE(report->lost[0].why.retry_can_help);
  EXPECT_FALSE(s.ActorNode("trainer").has_value());
  EXPECT_EQ(s.ActorNode("loader"), "c");
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST(RescheduleTest, StrictSpreadGroupIsRepairedAwayFromItsOtherNodes) {
  Scheduler s;
  for (const char* n : {"n0", "n1", "n2", "n3"})
    ASSERT_TRUE(s.AddNode(MakeNode(n, {{"cpu", 4}})).ok());
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictSpread, 3, {{"cpu", 1}}));
  ASSERT_TRUE(d.ok() && d->placed());
  const std::vector<std::string> before = d->bundle_nodes;
  auto report = s.RemoveNodes({before[1]});
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->repaired.size(), 1u);
  EXPECT_EQ(report->repaired[0].bundles, std::vector<int>{1});
  const std::vector<std::string> after = *s.GroupNodes("g");
  EXPECT_EQ(after[0], before[0]);
  EXPECT_EQ(after[2], before[2]);
  EXPECT_NE(after[1], before[0]);
  EXPECT_NE(after[1], before[2]);
  EXPECT_NE(after[1], before[1]);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST(RescheduleTest, GroupThatCannotBeCompletedIsBrokenAndReleased) {
  Scheduler s;
  for (const char* n : {"n0", "n1", "n2"}) ASSERT_TRUE(s.AddNode(MakeNode(n, {{"cpu", 4}})).ok());
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictSpread, 3, {{"cpu", 1}}));
  ASSERT_TRUE(d.ok() && d->placed());
  auto report = s.RemoveNodes({"n0"});
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->broken.size(), 1u);
  EXPECT_EQ(report->broken[0].group, "g");
  EXPECT_THAT(report->broken[0].why.reason, HasSubstr("lost 1 bundle(s) on n0"));
  EXPECT_FALSE(report->broken[0].why.retry_can_help);
  EXPECT_FALSE(s.GroupNodes("g").has_value());
  EXPECT_EQ(Free(s, "n1", "cpu"), 4);  // survivors released: gang, never partial
  EXPECT_EQ(Free(s, "n2", "cpu"), 4);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST(RescheduleTest, ActorsMoveWithTheirBundleAndAreLostWithTheirGroup) {
  Scheduler s;
  for (const char* n : {"n0", "n1", "n2"}) ASSERT_TRUE(s.AddNode(MakeNode(n, {{"cpu", 4}})).ok());
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictSpread, 2, {{"cpu", 2}}));
  ASSERT_TRUE(d.ok() && d->placed());
  ActorRequest a = MakeActor("a", {{"cpu", 1}});
  a.group = "g";
  a.bundle = 0;
  ActorRequest b = MakeActor("b", {{"cpu", 1}});
  b.group = "g";
  b.bundle = 1;
  const std::string a_node = MustPlace(s, a);
  const std::string b_node = MustPlace(s, b);
  auto report = s.RemoveNodes({a_node});
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->repaired.size(), 1u);
  ASSERT_EQ(report->moved.size(), 1u);
  EXPECT_EQ(report->moved[0].actor, "a");
  EXPECT_EQ(report->moved[0].from, a_node);
  EXPECT_EQ(s.ActorNode("a"), (*s.GroupNodes("g"))[0]);
  EXPECT_EQ(s.ActorNode("b"), b_node);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
  // Now only 2 nodes are left for 2 bundles; losing one more breaks the group and both actors.
  report = s.RemoveNodes({b_node});
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->broken.size(), 1u);
  ASSERT_EQ(report->lost.size(), 2u);
  EXPECT_THAT(report->lost[0].why.reason, HasSubstr("placement group 'g' broke"));
  EXPECT_FALSE(s.ActorNode("a").has_value());
  EXPECT_FALSE(s.ActorNode("b").has_value());
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST(RescheduleTest, StrictPackGroupMovesWhole) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(MakeNode("n0", {{"gpu", 4}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("n1", {{"gpu", 8}})).ok());
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictPack, 4, {{"gpu", 1}}));
  ASSERT_TRUE(d.ok() && d->placed());
  EXPECT_EQ(d->bundle_nodes[0], "n0");
  auto report = s.RemoveNodes({"n0"});
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->repaired.size(), 1u);
  EXPECT_EQ(*s.GroupNodes("g"), std::vector<std::string>(4, "n1"));
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST(RescheduleTest, UnknownNodeChangesNothing) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(MakeNode("a", {{"cpu", 4}})).ok());
  MustPlace(s, MakeActor("x", {{"cpu", 1}}));
  EXPECT_EQ(s.RemoveNodes({"a", "ghost"}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.ActorNode("x"), "a");
  EXPECT_EQ(s.alive_nodes(), 1);
}

TEST(RescheduleTest, DrainingThenDeadReplacesElsewhere) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(MakeNode("spot", {{"cpu", 4}}, {{"spot", "true"}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("od", {{"cpu", 4}})).ok());
  ActorRequest w = MakeActor("w", {{"cpu", 2}});
  w.spot = SpotPreference::kPreferSpot;
  EXPECT_EQ(MustPlace(s, w), "spot");
  ASSERT_TRUE(s.DrainNode("spot").ok());  // preemption notice
  EXPECT_EQ(s.ActorNode("w"), "spot");
  auto report = s.RemoveNodes({"spot"});
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->moved.size(), 1u);
  EXPECT_EQ(report->moved[0].to, "od");
  // The name can join again as a new node.
  ASSERT_TRUE(s.AddNode(MakeNode("spot", {{"cpu", 4}}, {{"spot", "true"}})).ok());
  EXPECT_EQ(s.Node("spot")->state, NodeState::kAlive);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

}  // namespace
}  // namespace troupe::scheduler
