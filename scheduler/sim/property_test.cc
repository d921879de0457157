// Seeded property tests over thousands of random clusters and requests: the indexed placer and
// the brute-force oracle make identical decisions, and after every event the invariants hold:
// no over-commit, strict strategies respected, gang atomicity, every actor placed or reported,
// and a node loss moves only what the node held.
#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "sim/generators.h"
#include "sim/invariants.h"
#include "sim/rng.h"
#include "troupe/scheduler/scheduler.h"

namespace troupe::scheduler::sim {
namespace {

// Sum of free amounts over the named nodes, per resource: a failed gang must not change it.
std::map<std::string, double> FreeSum(const Scheduler& s, const std::vector<NodeSpec>& nodes) {
  std::map<std::string, double> sum;
  for (const NodeSpec& n : nodes) {
    if (auto v = s.Node(n.name)) {
      for (const auto& [r, amount] : v->free) sum[r] += amount;
    }
  }
  return sum;
}

void ExpectSameActorDecision(const absl::StatusOr<ActorDecision>& a,
                             const absl::StatusOr<ActorDecision>& b, const std::string& ctx) {
  ASSERT_EQ(a.ok(), b.ok()) << ctx;
  if (!a.ok()) return;
  ASSERT_EQ(a->placed(), b->placed()) << ctx;
  if (a->placed()) {
    ASSERT_EQ(a->node, b->node) << ctx;
  } else {
    ASSERT_EQ(a->unschedulable->reason, b->unschedulable->reason) << ctx;
    ASSERT_FALSE(a->unschedulable->reason.empty()) << ctx;
  }
}

// How often each outcome occurred, so a test can insist that none of its checks was vacuous.
struct Tally {
  int placed = 0, unschedulable = 0, busy = 0, infeasible = 0, in_bundle = 0;
  int groups_placed = 0, groups_refused = 0, moved = 0, lost = 0, repaired = 0, broken = 0;
};

// The same cluster's alive nodes with nothing placed: where "retry can help" is checked.
Scheduler IdleCopy(const Scheduler& s, const std::vector<NodeSpec>& nodes) {
  Scheduler idle;
  for (const NodeSpec& n : nodes) {
    auto v = s.Node(n.name);
    if (v && v->state == NodeState::kAlive) {
      EXPECT_TRUE(idle.AddNode(n).ok());
    }
  }
  return idle;
}

// Busy (retry can help) must mean the request fits the idle cluster, infeasible that it does
// not. Exact for actors without affinity; for groups the "infeasible" side is definite.
void CheckRetryFlag(const Scheduler& s, const std::vector<NodeSpec>& nodes, const ActorRequest& a,
                    const Unschedulable& why, const std::string& ctx) {
  if (!a.affinity.empty() || !a.group.empty()) return;
  Scheduler idle = IdleCopy(s, nodes);
  auto d = idle.PlaceActor(a);
  ASSERT_TRUE(d.ok()) << ctx;
  ASSERT_EQ(d->placed(), why.retry_can_help) << ctx << ": " << why.reason;
}

void CheckGroupRetryFlag(const Scheduler& s, const std::vector<NodeSpec>& nodes,
                         const PlacementGroupRequest& g, const Unschedulable& why,
                         const std::string& ctx) {
  if (why.retry_can_help) return;
  Scheduler idle = IdleCopy(s, nodes);
  auto d = idle.CreatePlacementGroup(g);
  ASSERT_TRUE(d.ok()) << ctx;
  ASSERT_FALSE(d->placed()) << ctx
                            << ": said infeasible, but fits the idle cluster: " << why.reason;
}

// One random cluster and event sequence, applied to both placers in lock step.
void RunScenario(uint64_t seed, int events, Tally& tally) {
  SplitMix64 rng(seed);
  ClusterShape shape;
  shape.nodes = 4 + static_cast<int>(rng.Uniform(40));
  shape.zones = 1 + static_cast<int>(rng.Uniform(4));
  shape.spot_fraction = rng.Real();
  std::vector<NodeSpec> nodes = GenerateCluster(seed * 7919 + 1, shape);
  Scheduler fast(Scheduler::Options{Scheduler::Placer::kIndexed});
  Scheduler brute(Scheduler::Options{Scheduler::Placer::kBruteForce});
  for (const NodeSpec& n : nodes) {
    ASSERT_TRUE(fast.AddNode(n).ok());
    ASSERT_TRUE(brute.AddNode(n).ok());
  }
  WorkloadShape work;
  work.gpu_fraction = 0.3;
  work.selector_fraction = 0.2;
  work.anti_affinity_fraction = 0.2;
  int next_actor = 0, next_group = 0, next_node = 0;
  for (int e = 0; e < events; ++e) {
    const std::string ctx = absl::StrCat("seed ", seed, " event ", e);
    const double kind = rng.Real();
    if (kind < 0.6) {
      ActorRequest a = RandomActor(rng, next_actor++, work, shape.zones);
      const std::vector<std::string> groups = fast.GroupIds();
      if (!groups.empty() && rng.Bernoulli(0.25)) {  // an actor inside a group's bundle
        a.group = groups[rng.Uniform(groups.size())];
        a.bundle = static_cast<int>(rng.Uniform(4)) - 1;
        a.demands = {{"cpu", 1}};
      }
      auto da = fast.PlaceActor(a);
      ExpectSameActorDecision(da, brute.PlaceActor(a), ctx);
      ASSERT_TRUE(da.ok());
      if (da->placed()) {
        ++tally.placed;
        tally.in_bundle += !a.group.empty();
        ASSERT_EQ(fast.ActorNode(a.actor), da->node) << ctx;
      } else {
        ++tally.unschedulable;
        ++(da->unschedulable->retry_can_help ? tally.busy : tally.infeasible);
        CheckRetryFlag(fast, nodes, a, *da->unschedulable, ctx);
        ASSERT_FALSE(fast.ActorNode(a.actor).has_value()) << ctx;
      }
    } else if (kind < 0.72) {
      PlacementGroupRequest g = RandomGroup(rng, next_group++, 8, shape.zones);
      const auto free_before = FreeSum(fast, nodes);
      auto ga = fast.CreatePlacementGroup(g);
      auto gb = brute.CreatePlacementGroup(g);
      ASSERT_TRUE(ga.ok() && gb.ok()) << ctx;
      ASSERT_EQ(ga->placed(), gb->placed()) << ctx;
      if (ga->placed()) {
        ++tally.groups_placed;
        ASSERT_EQ(ga->bundle_nodes, gb->bundle_nodes) << ctx;
      } else {
        ++tally.groups_refused;
        CheckGroupRetryFlag(fast, nodes, g, *ga->unschedulable, ctx);
        ASSERT_EQ(ga->unschedulable->reason, gb->unschedulable->reason) << ctx;
        ASSERT_EQ(ga->unschedulable->retry_can_help, gb->unschedulable->retry_can_help) << ctx;
        ASSERT_EQ(FreeSum(fast, nodes), free_before) << ctx << ": gang left something";
        ASSERT_FALSE(fast.GroupNodes(g.group).has_value()) << ctx;
      }
    } else if (kind < 0.84) {
      const std::vector<std::string> ids = fast.ActorIds();
      if (ids.empty()) continue;
      const std::string& victim = ids[rng.Uniform(ids.size())];
      ASSERT_TRUE(fast.ReleaseActor(victim).ok()) << ctx;
      ASSERT_TRUE(brute.ReleaseActor(victim).ok()) << ctx;
    } else if (kind < 0.88) {
      const std::vector<std::string> ids = fast.GroupIds();
      if (ids.empty()) continue;
      const std::string& victim = ids[rng.Uniform(ids.size())];
      ASSERT_TRUE(fast.RemovePlacementGroup(victim).ok()) << ctx;
      ASSERT_TRUE(brute.RemovePlacementGroup(victim).ok()) << ctx;
    } else if (kind < 0.92) {
      const NodeSpec& n = nodes[rng.Uniform(nodes.size())];
      const bool drain = rng.Bernoulli(0.6);
      auto f = drain ? fast.DrainNode(n.name) : fast.UndrainNode(n.name);
      auto b = drain ? brute.DrainNode(n.name) : brute.UndrainNode(n.name);
      ASSERT_EQ(f.code(), b.code()) << ctx;
    } else if (kind < 0.97) {
      std::vector<std::string> dead;
      for (const NodeSpec& n : nodes) {
        if (fast.Node(n.name) && rng.Bernoulli(0.15)) dead.push_back(n.name);
      }
      const Snapshot before = TakeSnapshot(fast);
      auto ra = fast.RemoveNodes(dead);
      auto rb = brute.RemoveNodes(dead);
      ASSERT_TRUE(ra.ok() && rb.ok()) << ctx;
      ASSERT_EQ(ra->moved.size(), rb->moved.size()) << ctx;
      for (size_t i = 0; i < ra->moved.size(); ++i) {
        ASSERT_EQ(ra->moved[i].to, rb->moved[i].to) << ctx;
      }
      ASSERT_EQ(ra->lost.size(), rb->lost.size()) << ctx;
      ASSERT_EQ(ra->broken.size(), rb->broken.size()) << ctx;
      tally.moved += ra->moved.size();
      tally.lost += ra->lost.size();
      tally.repaired += ra->repaired.size();
      tally.broken += ra->broken.size();
      absl::Status st = CheckReschedule(before, dead, *ra, fast);
      ASSERT_TRUE(st.ok()) << ctx << ": " << st;
    } else {
      NodeSpec n = nodes[rng.Uniform(nodes.size())];
      n.name = absl::StrCat("joined-", next_node++);
      nodes.push_back(n);
      ASSERT_TRUE(fast.AddNode(n).ok());
      ASSERT_TRUE(brute.AddNode(n).ok());
    }
    absl::Status st = CheckCluster(fast);
    ASSERT_TRUE(st.ok()) << ctx << ": " << st;
    st = CheckCluster(brute);
    ASSERT_TRUE(st.ok()) << ctx << ": " << st;
  }
  ASSERT_EQ(TakeSnapshot(fast).actors, TakeSnapshot(brute).actors) << "seed " << seed;
  ASSERT_EQ(TakeSnapshot(fast).groups, TakeSnapshot(brute).groups) << "seed " << seed;
}

// 2,000 random clusters x 60 events each (~70k requests), split over shards so that ctest
// can run them in parallel and a failure names its seed range.
class PropertyTest : public ::testing::TestWithParam<int> {};

TEST_P(PropertyTest, IndexedMatchesBruteForceAndInvariantsHold) {
  const int shard = GetParam();
  Tally t;
  for (uint64_t seed = shard * 500; seed < static_cast<uint64_t>(shard + 1) * 500; ++seed) {
    RunScenario(seed, 60, t);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Every kind of outcome occurred, so none of the checks above was vacuous.
  for (int n : {t.placed, t.busy, t.infeasible, t.in_bundle, t.groups_placed, t.groups_refused,
                t.moved, t.lost, t.repaired, t.broken}) {
    EXPECT_GT(n, 10);
  }
  std::printf(
      "shard %d: placed %d (in bundles %d), busy %d, infeasible %d; groups placed %d, "
      "refused %d; after node loss: moved %d, lost %d, repaired %d, broken %d\n",
      shard, t.placed, t.in_bundle, t.busy, t.infeasible, t.groups_placed, t.groups_refused,
      t.moved, t.lost, t.repaired, t.broken);
}

INSTANTIATE_TEST_SUITE_P(Seeds, PropertyTest, ::testing::Range(0, 4));

// Larger clusters, fewer of them: the index's paths (many nodes per key) get exercised too.
TEST(PropertyTestLarge, ThousandNodeClustersAgree) {
  SplitMix64 rng(99);
  for (int round = 0; round < 3; ++round) {
    ClusterShape shape;
    shape.nodes = 1000;
    std::vector<NodeSpec> nodes = GenerateCluster(1000 + round, shape);
    Scheduler fast(Scheduler::Options{Scheduler::Placer::kIndexed});
    Scheduler brute(Scheduler::Options{Scheduler::Placer::kBruteForce});
    for (const NodeSpec& n : nodes) {
      ASSERT_TRUE(fast.AddNode(n).ok());
      ASSERT_TRUE(brute.AddNode(n).ok());
    }
    WorkloadShape work;
    work.gpu_fraction = 0.15;
    for (int i = 0; i < 4000; ++i) {
      ActorRequest a = RandomActor(rng, i, work, shape.zones);
      ExpectSameActorDecision(fast.PlaceActor(a), brute.PlaceActor(a), absl::StrCat("actor ", i));
      if (::testing::Test::HasFatalFailure()) return;
      if (i % 50 == 0) {
        PlacementGroupRequest g = RandomGroup(rng, i, 64, shape.zones);
        auto ga = fast.CreatePlacementGroup(g);
        auto gb = brute.CreatePlacementGroup(g);
        ASSERT_TRUE(ga.ok() && gb.ok());
        ASSERT_EQ(ga->bundle_nodes, gb->bundle_nodes) << g.group;
      }
    }
    absl::Status st = CheckCluster(fast);
    ASSERT_TRUE(st.ok()) << st;
  }
}

}  // namespace
}  // namespace troupe::scheduler::sim
