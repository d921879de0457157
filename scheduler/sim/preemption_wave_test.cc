// Failure traces on generated clusters: a spot preemption wave (30% of the spot nodes vanish
// at once) and a zone loss. Every affected actor is re-placed or reported with a reason, every
// affected group is repaired or reported broken, and nothing unaffected moves (asserted by
// CheckReschedule against a snapshot taken before the failure).
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/generators.h"
#include "sim/invariants.h"
#include "sim/rng.h"
#include "troupe/scheduler/scheduler.h"

namespace troupe::scheduler::sim {
namespace {

struct Loaded {
  Scheduler scheduler;
  std::vector<NodeSpec> nodes;
  int placed = 0;
  int in_groups = 0;  // actors inside placement-group bundles
};

// A cluster filled with actors (mostly spot-preferring workers) and placement groups.
Loaded Load(uint64_t seed, int nodes, int actors, int groups) {
  Loaded l;
  ClusterShape shape;
  shape.nodes = nodes;
  l.nodes = GenerateCluster(seed, shape);
  for (const NodeSpec& n : l.nodes) EXPECT_TRUE(l.scheduler.AddNode(n).ok());
  SplitMix64 rng(seed ^ 0xABCDEF);
  WorkloadShape work;
  work.gpu_fraction = 0.2;
  for (int i = 0; i < actors; ++i) {
    auto d = l.scheduler.PlaceActor(RandomActor(rng, i, work, shape.zones));
    EXPECT_TRUE(d.ok());
    l.placed += d.ok() && d->placed();
  }
  for (int i = 0; i < groups; ++i) {
    PlacementGroupRequest g = RandomGroup(rng, i, 16, shape.zones);
    auto d = l.scheduler.CreatePlacementGroup(g);
    EXPECT_TRUE(d.ok());
    if (!d.ok() || !d->placed()) continue;
    for (int b = 0; b < static_cast<int>(g.bundles.size()); ++b) {  // one actor per bundle
      ActorRequest a;
      a.actor = absl::StrCat(g.group, "-member-", b);
      a.demands = {{"cpu", 1}};
      a.group = g.group;
      a.bundle = b;
      auto placed = l.scheduler.PlaceActor(a);
      EXPECT_TRUE(placed.ok() && placed->placed()) << a.actor;
      ++l.in_groups;
    }
  }
  return l;
}

void WaveAndCheck(Loaded& l, const std::vector<std::string>& dead) {
  ASSERT_FALSE(dead.empty());
  absl::Status loaded = CheckCluster(l.scheduler);
  ASSERT_TRUE(loaded.ok()) << loaded;
  const Snapshot before = TakeSnapshot(l.scheduler);
  absl::StatusOr<RescheduleReport> report = l.scheduler.RemoveNodes(dead);
  ASSERT_TRUE(report.ok()) << report.status();
  absl::Status st = CheckReschedule(before, dead, *report, l.scheduler);
  ASSERT_TRUE(st.ok()) << st;
  // The wave must actually have hit something, or the test proves nothing.
  EXPECT_GT(report->moved.size() + report->lost.size(), 0u);
  for (const auto& lost : report->lost) {
    EXPECT_THAT(lost.why.reason, ::testing::HasSubstr("needs")) << lost.actor;
  }
}

TEST(PreemptionWaveTest, ThirtyPercentOfSpotNodesVanish1k) {
  for (uint64_t seed : {1, 2, 3}) {
    Loaded l = Load(seed, 1000, 12000, 40);
    ASSERT_GT(l.placed, 10000);
    ASSERT_GT(l.in_groups, 50);
    SplitMix64 rng(seed);
    WaveAndCheck(l, PreemptionWave(rng, l.scheduler, l.nodes, 0.3));
    if (HasFatalFailure()) return;
  }
}

TEST(PreemptionWaveTest, ThirtyPercentOfSpotNodesVanish10k) {
  Loaded l = Load(10, 10000, 100000, 100);
  ASSERT_GT(l.placed, 90000);
  SplitMix64 rng(10);
  const std::vector<std::string> wave = PreemptionWave(rng, l.scheduler, l.nodes, 0.3);
  EXPECT_GT(wave.size(), 1000u);
  WaveAndCheck(l, wave);
}

TEST(PreemptionWaveTest, DrainedSpotNodesThenTheWave) {
  Loaded l = Load(4, 1000, 10000, 30);
  SplitMix64 rng(4);
  const std::vector<std::string> wave = PreemptionWave(rng, l.scheduler, l.nodes, 0.3);
  for (const std::string& n : wave) ASSERT_TRUE(l.scheduler.DrainNode(n).ok());
  ASSERT_TRUE(CheckCluster(l.scheduler).ok());
  WaveAndCheck(l, wave);
}

TEST(PreemptionWaveTest, ZoneLoss) {
  Loaded l = Load(5, 1000, 10000, 40);
  WaveAndCheck(l, ZoneLoss(l.scheduler, l.nodes, "z2"));
}

TEST(PreemptionWaveTest, RepeatedWavesUntilTheClusterIsSmall) {
  Loaded l = Load(6, 1000, 12000, 40);
  SplitMix64 rng(6);
  for (int wave = 0; wave < 4; ++wave) {
    WaveAndCheck(l, PreemptionWave(rng, l.scheduler, l.nodes, 0.3));
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace troupe::scheduler::sim
