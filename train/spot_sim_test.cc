// SpotSimTest: the spot what-if (spot_sim.h) — the trace file's errors, and the simulated job's
// time, losses and cost against what the elastic policy must do.
#include "troupe/train/spot_sim.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace troupe::train {
namespace {

constexpr char kTrace[] = R"(
[job]
steps = 101
min_workers = 1
max_workers = 4
[cluster]
on_demand = 1
spot = 3
[timing]
step_s = [0.4, 0.2, 0.15, 0.1]
replan_s = 0.1
detect_s = 1.0
join_s = 0.5
checkpoint_s = 0.05
[[zone]]
name = "a"
spot_price_per_h = 1.0
on_demand_price_per_h = 3.0
notice_s = 2.0
replace_s = 3.0
)";

SpotTrace Trace(const std::string& extra = "") {
  absl::StatusOr<SpotTrace> t = ParseSpotTrace(absl::StrCat(kTrace, extra), "t.toml");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : SpotTrace{};
}

TEST(SpotSimTest, TraceErrorsNameTheFileTheFieldAndWhatWasThere) {
  EXPECT_EQ(ParseSpotTrace("[timing]\nstep_s = [0.1, \"x\"]\n[[zone]]\nname = \"a\"\n", "t.toml")
                .status()
                .message(),
            "t.toml: timing.step_s: expected a non-empty array of step times in seconds (> 0) by "
            "world 1, 2, ..., got another array");
  EXPECT_EQ(ParseSpotTrace("[[zone]]\nname = \"a\"\nnotice = 3\n", "t.toml").status().message(),
            "t.toml: zone[0].notice: expected one of name, notice_s, on_demand_price_per_h, "
            "preemptions_per_h, replace_s, spot_price_per_h, got an unknown key");
  EXPECT_EQ(ParseSpotTrace("[job]\nsteps = 10\n", "t.toml").status().message(),
            "t.toml: zone: expected at least one [[zone]] table, got none");
  EXPECT_EQ(ParseSpotTrace("[jobs]\n", "t.toml").status().message(),
            "t.toml: jobs: expected one of [job], [cluster], [timing], [[zone]], [[preemption]], "
            "got an unknown section");
  EXPECT_EQ(LoadSpotTrace("/nonexistent/trace.toml").status().message(),
            "/nonexistent/trace.toml: cannot open the trace");
  SpotTrace t = Trace("[[preemption]]\nat_s = 1.0\nmachine = \"od0\"\n");
  EXPECT_EQ(SimulateSpot(t, 1, 3).status().message(),
            "t.toml: preemption[0].machine: expected a spot machine (s0, s1, ...), got \"od0\"");
  absl::StatusOr<SpotOutcome> fewer =
      SimulateSpot(Trace("[[preemption]]\nat_s = 1.0\nmachine = \"s3\"\n"), 1, 3);
  ASSERT_TRUE(fewer.ok()) << fewer.status();
  EXPECT_EQ(fewer->ignored_preemptions, 1) << "a mix of three spot machines has no s3 at 1 s";
  EXPECT_EQ(fewer->preemptions, 0);
}

TEST(SpotSimTest, WithoutPreemptionsEveryStepTakesTheFullWorldsStepTime) {
  absl::StatusOr<SpotOutcome> o = SimulateSpot(Trace(), 1, 3);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->steps, 100);  // every step after the first
  EXPECT_NEAR(o->seconds, 100 * 0.1, 1e-6);
  EXPECT_NEAR(o->goodput_steps_per_h, 36000, 1e-3);
  EXPECT_EQ(o->generations, 1);
  EXPECT_EQ(o->preemptions, 0);
  EXPECT_EQ(o->final_world, 4);
  EXPECT_EQ(o->coordinator_machine, "od0") << "the coordinator prefers the on-demand machine";
  // Four machines from the start to the end: configure, 101 steps, the final checkpoint.
  EXPECT_NEAR(o->cost, (3 * 1.0 + 3.0) * (0.1 + 101 * 0.1 + 0.05) / 3600, 1e-9);
}

TEST(SpotSimTest, ANoticedMachineIsHandedOverFromMemoryAndItsReplacementFoldedIn) {
  absl::StatusOr<SpotOutcome> quiet = SimulateSpot(Trace(), 1, 3);
  absl::StatusOr<SpotOutcome> o =
      SimulateSpot(Trace("[[preemption]]\nat_s = 1.0\nmachine = \"s1\"\n"), 1, 3);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->preemptions, 1);
  EXPECT_EQ(o->generations, 3) << "start, the drain, the replacement's join";
  EXPECT_EQ(o->steps_lost, 0);
  EXPECT_EQ(o->handover_checkpoints, 0);
  EXPECT_EQ(o->final_world, 4);
  // Two re-plans and some steps at world 3 (0.15 s): slower than without, by less than the
  // replacement's whole absence at 0.05 s per step more.
  EXPECT_GT(o->seconds, quiet->seconds + 2 * 0.1);
  EXPECT_LT(o->seconds, quiet->seconds + 2 * 0.1 + 0.05 * (2.0 + 3.0 + 0.5 + 1.0) / 0.15);
}

TEST(SpotSimTest, AMachineGoneWithoutNoticeIsSeenLateAndItsStepRunsAgain) {
  absl::StatusOr<SpotOutcome> noticed =
      SimulateSpot(Trace("[[preemption]]\nat_s = 1.0\nmachine = \"s1\"\n"), 1, 3);
  SpotTrace t = Trace("[[preemption]]\nat_s = 1.0\nmachine = \"s1\"\n");
  t.zones[0].notice_s = 0;
  absl::StatusOr<SpotOutcome> o = SimulateSpot(t, 1, 3);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->steps_lost, 0) << "its buddy's mirror holds its range";
  EXPECT_GT(o->seconds, noticed->seconds) << "a second of detection with nothing committed";
}

TEST(SpotSimTest, AnOwnerAndItsBuddyNoticedTogetherCheckpointFirst) {
  absl::StatusOr<SpotOutcome> o = SimulateSpot(
      Trace("[[preemption]]\nat_s = 1.0\nmachine = \"s1\"\n[[preemption]]\nat_s = 1.0\n"
            "machine = \"s2\"\n"),
      1, 3);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->handover_checkpoints, 1);
  EXPECT_EQ(o->steps_lost, 0);
}

TEST(SpotSimTest, TheCoordinatorsMachineGoingMovesItAndTheJobFinishes) {
  // No on-demand machine: the coordinator is on s0 (the scheduler's first choice).
  absl::StatusOr<SpotOutcome> o =
      SimulateSpot(Trace("[[preemption]]\nat_s = 1.0\nmachine = \"s0\"\n"), 0, 3);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator_machine, "s0");
  EXPECT_EQ(o->coordinator_moves, 1);
  EXPECT_EQ(o->steps, 100);
  EXPECT_EQ(o->steps_lost, 0);
}

TEST(SpotSimTest, DrawnPreemptionsAreSeededAndOnDemandAloneIsNeverPreemptedButCostsMore) {
  SpotTrace t = Trace();
  t.zones[0].preemptions_per_h = 600;  // one per machine every 6 s
  t.steps = 1001;
  absl::StatusOr<SpotOutcome> a = SimulateSpot(t, 1, 3), b = SimulateSpot(t, 1, 3);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GT(a->preemptions, 5);
  EXPECT_EQ(a->preemptions, b->preemptions);
  EXPECT_EQ(a->seconds, b->seconds);
  t.seed = 2;
  absl::StatusOr<SpotOutcome> c = SimulateSpot(t, 1, 3);
  EXPECT_NE(a->seconds, c->seconds) << "another seed, other preemptions";
  absl::StatusOr<SpotOutcome> od = SimulateSpot(t, 4, 0);
  ASSERT_TRUE(od.ok()) << od.status();
  EXPECT_EQ(od->preemptions, 0);
  EXPECT_GT(od->goodput_steps_per_h, a->goodput_steps_per_h);
  EXPECT_GT(od->cost_per_1k_steps, a->cost_per_1k_steps);
}

TEST(SpotSimTest, EveryMachineNoticedStopsThePreemptedJob) {
  absl::StatusOr<SpotOutcome> o = SimulateSpot(
      Trace("[[preemption]]\nat_s = 1.0\nmachine = \"s0\"\n[[preemption]]\nat_s = 1.0\n"
            "machine = \"s1\"\n"),
      0, 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->preempted);
  EXPECT_LT(o->steps, 100);
}

}  // namespace
}  // namespace troupe::train
