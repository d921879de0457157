// Placement-group semantics per strategy, gang atomicity and busy/infeasible, on both placers.
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "troupe/scheduler/scheduler.h"

namespace troupe::scheduler {
namespace {

using ::testing::ElementsAre;
using testing::Free;
using ::testing::HasSubstr;
using testing::MakeActor;
using testing::MakeGroup;
using testing::MakeNode;
using testing::MustPlace;

class GroupTest : public ::testing::TestWithParam<Scheduler::Placer> {
 protected:
  // Four nodes: two in zone a, two in zone b.
  Scheduler Make() {
    Scheduler s(Scheduler::Options{GetParam()});
    EXPECT_TRUE(s.AddNode(MakeNode("a1", {{"cpu", 8}, {"gpu", 2}}, {{"zone", "a"}})).ok());
    EXPECT_TRUE(s.AddNode(MakeNode("a2", {{"cpu", 8}, {"gpu", 2}}, {{"zone", "a"}})).ok());
    EXPECT_TRUE(s.AddNode(MakeNode("b1", {{"cpu", 8}, {"gpu", 2}}, {{"zone", "b"}})).ok());
    EXPECT_TRUE(s.AddNode(MakeNode("b2", {{"cpu", 16}, {"gpu", 4}}, {{"zone", "b"}})).ok());
    return s;
  }
};

TEST_P(GroupTest, StrictSpreadUsesDistinctNodes) {
  Scheduler s = Make();
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictSpread, 4, {{"gpu", 1}}));
  ASSERT_TRUE(d.ok() && d->placed());
  EXPECT_EQ(std::set<std::string>(d->bundle_nodes.begin(), d->bundle_nodes.end()).size(), 4u);
  EXPECT_EQ(*s.GroupNodes("g"), d->bundle_nodes);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST_P(GroupTest, StrictSpreadBeyondTheNodeCountIsInfeasibleAndHoldsNothing) {
  Scheduler s = Make();
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictSpread, 5, {{"cpu", 1}}));
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->placed());
  EXPECT_FALSE(d->unschedulable->retry_can_help);
  EXPECT_THAT(d->unschedulable->reason, HasSubstr("STRICT_SPREAD group 'g' of 5 bundles"));
  EXPECT_EQ(Free(s, "a1", "cpu"), 8);
  EXPECT_EQ(Free(s, "b2", "cpu"), 16);
  EXPECT_FALSE(s.GroupNodes("g").has_value());
}

TEST_P(GroupTest, StrictSpreadByZone) {
  Scheduler s = Make();
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictSpread, 2, {{"cpu", 1}}, "zone"));
  ASSERT_TRUE(d.ok() && d->placed());
  EXPECT_NE(s.Node(d->bundle_nodes[0])->labels.at("zone"),
            s.Node(d->bundle_nodes[1])->labels.at("zone"));
  auto three =
      s.CreatePlacementGroup(MakeGroup("h", Strategy::kStrictSpread, 3, {{"cpu", 1}}, "zone"));
  ASSERT_TRUE(three.ok());
  EXPECT_FALSE(three->placed());
  EXPECT_FALSE(three->unschedulable->retry_can_help);
}

TEST_P(GroupTest, StrictPackUsesOneNode) {
  Scheduler s = Make();
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictPack, 3, {{"gpu", 1}}));
  ASSERT_TRUE(d.ok() && d->placed());
  EXPECT_THAT(d->bundle_nodes, ElementsAre("b2", "b2", "b2"));  // the only node with 3 gpus
  auto too_big = s.CreatePlacementGroup(MakeGroup("h", Strategy::kStrictPack, 5, {{"gpu", 1}}));
  ASSERT_TRUE(too_big.ok());
  ASSERT_FALSE(too_big->placed());
  EXPECT_THAT(too_big->unschedulable->reason, HasSubstr("needs gpu=5"));
  EXPECT_FALSE(too_big->unschedulable->retry_can_help);
  auto busy = s.CreatePlacementGroup(MakeGroup("k", Strategy::kStrictPack, 3, {{"gpu", 1}}));
  ASSERT_TRUE(busy.ok());
  ASSERT_FALSE(busy->placed());
  EXPECT_TRUE(busy->unschedulable->retry_can_help);
}

TEST_P(GroupTest, StrictPackByZoneStaysInOneZone) {
  Scheduler s = Make();
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictPack, 3, {{"cpu", 6}}, "zone"));
  ASSERT_TRUE(d.ok() && d->placed()) << d->unschedulable->reason;
  std::set<std::string> zones;
  for (const auto& n : d->bundle_nodes) zones.insert(s.Node(n)->labels.at("zone"));
  EXPECT_EQ(zones.size(), 1u);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST_P(GroupTest, PackPrefersTheGroupsOwnNode) {
  Scheduler s = Make();
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kPack, 6, {{"cpu", 2}}));
  ASSERT_TRUE(d.ok() && d->placed());
  // 4 bundles fill a1 (tightest), the rest go to the next tightest.
  EXPECT_THAT(d->bundle_nodes, ElementsAre("a1", "a1", "a1", "a1", "a2", "a2"));
}

TEST_P(GroupTest, SpreadPrefersNewNodesThenReusesThem) {
  Scheduler s = Make();
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kSpread, 6, {{"cpu", 1}}));
  ASSERT_TRUE(d.ok() && d->placed());
  std::set<std::string> first4(d->bundle_nodes.begin(), d->bundle_nodes.begin() + 4);
  EXPECT_EQ(first4.size(), 4u);
}

TEST_P(GroupTest, GangIsAllOrNothing) {
  Scheduler s = Make();
  MustPlace(s, MakeActor("hog", {{"gpu", 4}}));  // b2's gpus
  // 4 bundles of gpu=2 need 4 nodes' worth; only 3 are left: nothing may stay allocated.
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kSpread, 4, {{"gpu", 2}}));
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->placed());
  EXPECT_TRUE(d->unschedulable->retry_can_help);
  EXPECT_EQ(Free(s, "a1", "gpu"), 2);
  EXPECT_EQ(Free(s, "a2", "gpu"), 2);
  EXPECT_EQ(Free(s, "b1", "gpu"), 2);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
  ASSERT_TRUE(s.ReleaseActor("hog").ok());
  d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kSpread, 4, {{"gpu", 2}}));
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->placed());
}

TEST_P(GroupTest, RemoveReleasesEverything) {
  Scheduler s = Make();
  ASSERT_TRUE(
      s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictSpread, 4, {{"cpu", 3}}))->placed());
  EXPECT_EQ(Free(s, "a1", "cpu"), 5);
  ASSERT_TRUE(s.RemovePlacementGroup("g").ok());
  EXPECT_EQ(Free(s, "a1", "cpu"), 8);
  EXPECT_EQ(Free(s, "b2", "cpu"), 16);
  EXPECT_EQ(s.RemovePlacementGroup("g").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST_P(GroupTest, BadGroupsAreInvalidArgument) {
  Scheduler s = Make();
  PlacementGroupRequest empty;
  empty.group = "e";
  EXPECT_EQ(s.CreatePlacementGroup(empty).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      s.CreatePlacementGroup(MakeGroup("n", Strategy::kPack, 1, {{"cpu", -2}})).status().code(),
      absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.CreatePlacementGroup(MakeGroup("d", Strategy::kPack, 1, {{"cpu", 1}}))->placed());
  EXPECT_EQ(
      s.CreatePlacementGroup(MakeGroup("d", Strategy::kPack, 1, {{"cpu", 1}})).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_P(GroupTest, ActorsRunInsideBundleReservations) {
  Scheduler s = Make();
  auto d =
      s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictSpread, 2, {{"gpu", 1}, {"cpu", 2}}));
  ASSERT_TRUE(d.ok() && d->placed());
  const std::string node1 = d->bundle_nodes[1];
  const double cpu_free = Free(s, node1, "cpu");
  ActorRequest a = MakeActor("a", {{"gpu", 1}, {"cpu", 1}});
  a.group = "g";
  a.bundle = 1;
  EXPECT_EQ(MustPlace(s, a), node1);
  EXPECT_EQ(Free(s, node1, "cpu"), cpu_free);  // taken from the reservation, not the node
  ActorRequest b = MakeActor("b", {{"gpu", 1}});
  b.group = "g";
  b.bundle = 1;
  auto busy = s.PlaceActor(b);
  ASSERT_TRUE(busy.ok());
  ASSERT_FALSE(busy->placed());
  EXPECT_TRUE(busy->unschedulable->retry_can_help);
  EXPECT_THAT(busy->unschedulable->reason, HasSubstr("inside bundle 1 of group 'g'"));
  b.bundle = -1;  // any bundle with room: bundle 0
  EXPECT_EQ(MustPlace(s, b), d->bundle_nodes[0]);
  ActorRequest big = MakeActor("big", {{"gpu", 2}});
  big.group = "g";
  auto never = s.PlaceActor(big);
  ASSERT_TRUE(never.ok());
  ASSERT_FALSE(never->placed());
  EXPECT_FALSE(never->unschedulable->retry_can_help);
  ActorRequest nogroup = MakeActor("n", {{"cpu", 1}});
  nogroup.group = "missing";
  EXPECT_FALSE(s.PlaceActor(nogroup)->unschedulable->retry_can_help);
  nogroup.group = "g";
  nogroup.bundle = 7;
  EXPECT_FALSE(s.PlaceActor(nogroup)->placed());
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
  ASSERT_TRUE(s.ReleaseActor("a").ok());
  b.actor = "b2";
  b.bundle = 1;
  EXPECT_EQ(MustPlace(s, b), node1);  // the reservation is free again
  ASSERT_TRUE(s.RemovePlacementGroup("g").ok());
  EXPECT_FALSE(s.ActorNode("b2").has_value());  // actors go with their group
  EXPECT_FALSE(s.ActorNode("b").has_value());
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST_P(GroupTest, SoftSpreadByZonePrefersNewZones) {
  Scheduler s = Make();
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kSpread, 3, {{"cpu", 1}}, "zone"));
  ASSERT_TRUE(d.ok() && d->placed());
  // Two zones for three bundles: the first two take one zone each, the third reuses one.
  EXPECT_NE(s.Node(d->bundle_nodes[0])->labels.at("zone"),
            s.Node(d->bundle_nodes[1])->labels.at("zone"));
}

TEST_P(GroupTest, SelectorAndSpotPreferenceApplyToEveryBundle) {
  Scheduler s(Scheduler::Options{GetParam()});
  ASSERT_TRUE(s.AddNode(MakeNode("spot1", {{"cpu", 4}}, {{"spot", "true"}, {"zone", "a"}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("spot2", {{"cpu", 4}}, {{"spot", "true"}, {"zone", "a"}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("od1", {{"cpu", 8}}, {{"zone", "a"}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("od2", {{"cpu", 8}}, {{"zone", "b"}})).ok());
  PlacementGroupRequest g = MakeGroup("writers", Strategy::kStrictSpread, 2, {{"cpu", 1}});
  g.spot = SpotPreference::kPreferOnDemand;
  auto d = s.CreatePlacementGroup(g);
  ASSERT_TRUE(d.ok() && d->placed());
  EXPECT_EQ(std::set<std::string>(d->bundle_nodes.begin(), d->bundle_nodes.end()),
            (std::set<std::string>{"od1", "od2"}));
  PlacementGroupRequest in_a = MakeGroup("a-only", Strategy::kStrictSpread, 3, {{"cpu", 1}});
  in_a.selector = {{"zone", LabelTerm::Op::kIn, {"a"}}};
  in_a.spot = SpotPreference::kPreferOnDemand;  // only one on-demand node in zone a: falls back
  d = s.CreatePlacementGroup(in_a);
  ASSERT_TRUE(d.ok() && d->placed());
  EXPECT_EQ(std::set<std::string>(d->bundle_nodes.begin(), d->bundle_nodes.end()),
            (std::set<std::string>{"od1", "spot1", "spot2"}));
  in_a.group = "a-four";
  in_a.bundles.resize(4, in_a.bundles[0]);
  d = s.CreatePlacementGroup(in_a);
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->placed());
  EXPECT_FALSE(d->unschedulable->retry_can_help);  // zone a has only 3 nodes
}

TEST_P(GroupTest, UnlabelledNodesAreTheirOwnDomain) {
  Scheduler s(Scheduler::Options{GetParam()});
  ASSERT_TRUE(s.AddNode(MakeNode("a", {{"cpu", 4}}, {{"zone", "a"}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("x", {{"cpu", 4}})).ok());
  ASSERT_TRUE(s.AddNode(MakeNode("y", {{"cpu", 4}})).ok());
  auto d = s.CreatePlacementGroup(MakeGroup("g", Strategy::kStrictSpread, 3, {{"cpu", 1}}, "zone"));
  ASSERT_TRUE(d.ok() && d->placed());
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

INSTANTIATE_TEST_SUITE_P(Placers, GroupTest,
                         ::testing::Values(Scheduler::Placer::kIndexed,
                                           Scheduler::Placer::kBruteForce),
                         [](const auto& info) {
                           return info.param == Scheduler::Placer::kIndexed ? "Indexed" : "Brute";
                         });

}  // namespace
}  // namespace troupe::scheduler
