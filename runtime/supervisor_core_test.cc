// Supervision decisions, exactly: every test drives SupervisorCore by hand with explicit times
// and asserts the full action sequence.
#include "supervisor_core.h"

#include <gtest/gtest.h>

#include "absl/strings/str_join.h"

namespace troupe::runtime {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const TimePoint kT0{};

std::string Str(const std::vector<Action>& actions) {
  return absl::StrJoin(actions, " ",
                       [](std::string* out, const Action& a) { out->append(DebugString(a)); });
}

BackoffPolicy NoJitter() {
  BackoffPolicy b;
  b.initial = milliseconds(10);
  b.max = seconds(1);
  b.jitter = 0;
  return b;
}

SupervisorCore Make(Strategy s, std::vector<RestartType> types, Intensity in = {3, seconds(5)},
                    BackoffPolicy b = NoJitter()) {
  std::vector<CoreChild> children;
  for (size_t i = 0; i < types.size(); ++i) {
    children.push_back(CoreChild{"c" + std::to_string(i), types[i], b});
  }
  return SupervisorCore("sup", s, in, children, /*seed=*/42);
}

TEST(SupervisorCoreTest, StartsChildrenInOrderAtGenerationOne) {
  auto core = Make(Strategy::kOneForOne,
                   {RestartType::kPermanent, RestartType::kPermanent, RestartType::kPermanent});
  EXPECT_EQ(Str(core.Start(kT0)), "start(0,g1) start(1,g1) start(2,g1)");
}

// Restart type x exit reason: the OTP table.
struct TypeCase {
  RestartType type;
  ExitKind kind;
  bool restarts;
};

class RestartTypeTest : public ::testing::TestWithParam<TypeCase> {};

TEST_P(RestartTypeTest, RestartsExactlyWhenOtpSays) {
  const TypeCase& c = GetParam();
  auto core = Make(Strategy::kOneForOne, {c.type});
  core.Start(kT0);
  std::string decision;
  auto actions = core.OnExit(0, 1, c.kind, kT0 + milliseconds(1), &decision);
  if (c.restarts) {
    EXPECT_EQ(Str(actions), "restart_after(10ms,t1)");
    EXPECT_EQ(Str(core.OnTimer(1, kT0 + milliseconds(11))), "start(0,g2)");
    EXPECT_EQ(core.generation(0), 2u);
  } else {
    EXPECT_EQ(Str(actions), "");
    EXPECT_FALSE(core.running(0));
    EXPECT_NE(decision.find("no restart"), std::string::npos) << decision;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, RestartTypeTest,
    ::testing::Values(TypeCase{RestartType::kPermanent, ExitKind::kNormal, true},
                      TypeCase{RestartType::kPermanent, ExitKind::kError, true},
                      TypeCase{RestartType::kPermanent, ExitKind::kKilled, true},
                      TypeCase{RestartType::kTransient, ExitKind::kNormal, false},
                      TypeCase{RestartType::kTransient, ExitKind::kError, true},
                      TypeCase{RestartType::kTransient, ExitKind::kKilled, true},
                      TypeCase{RestartType::kTemporary, ExitKind::kNormal, false},
                      TypeCase{RestartType::kTemporary, ExitKind::kError, false},
                      TypeCase{RestartType::kTemporary, ExitKind::kKilled, false}));

// Strategy x one child fails.
TEST(SupervisorCoreTest, OneForOneRestartsOnlyTheFailedChild) {
  auto core = Make(Strategy::kOneForOne,
                   {RestartType::kPermanent, RestartType::kPermanent, RestartType::kPermanent});
  core.Start(kT0);
  EXPECT_EQ(Str(core.OnExit(1, 1, ExitKind::kError, kT0)), "restart_after(10ms,t1)");
  EXPECT_EQ(Str(core.OnTimer(1, kT0 + milliseconds(10))), "start(1,g2)");
  EXPECT_EQ(core.generation(0), 1u);
  EXPECT_EQ(core.generation(2), 1u);
}

TEST(SupervisorCoreTest, OneForAllStopsOthersInReverseThenRestartsAllInOrder) {
  auto core = Make(Strategy::kOneForAll, {RestartType::kPermanent, RestartType::kPermanent,
                                          RestartType::kPermanent, RestartType::kPermanent});
  core.Start(kT0);
  EXPECT_EQ(Str(core.OnExit(1, 1, ExitKind::kKilled, kT0)),
            "stop(3,g1) stop(2,g1) stop(0,g1) restart_after(10ms,t1)");
  EXPECT_EQ(Str(core.OnTimer(1, kT0 + milliseconds(10))),
            "start(0,g2) start(1,g2) start(2,g2) start(3,g2)");
}

TEST(SupervisorCoreTest, RestForOneRestartsExactlyTheLaterSiblingsInOrder) {
  auto core = Make(Strategy::kRestForOne, {RestartType::kPermanent, RestartType::kPermanent,
                                           RestartType::kPermanent, RestartType::kPermanent});
  core.Start(kT0);
  EXPECT_EQ(Str(core.OnExit(1, 1, ExitKind::kError, kT0)),
            "stop(3,g1) stop(2,g1) restart_after(10ms,t1)");
  EXPECT_EQ(Str(core.OnTimer(1, kT0 + milliseconds(10))), "start(1,g2) start(2,g2) start(3,g2)");
  EXPECT_EQ(core.generation(0), 1u) << "an earlier sibling is left alone";
}

// Strategy x sibling temporary child: a temporary sibling stopped for a group restart is gone.
TEST(SupervisorCoreTest, OneForAllDropsTemporarySibling) {
  auto core = Make(Strategy::kOneForAll,
                   {RestartType::kPermanent, RestartType::kTemporary, RestartType::kPermanent});
  core.Start(kT0);
  EXPECT_EQ(Str(core.OnExit(0, 1, ExitKind::kError, kT0)),
            "stop(2,g1) stop(1,g1) restart_after(10ms,t1)");
  EXPECT_EQ(Str(core.OnTimer(1, kT0 + milliseconds(10))), "start(0,g2) start(2,g2)");
  EXPECT_FALSE(core.running(1));
}

TEST(SupervisorCoreTest, RestForOneDropsTemporaryLaterSibling) {
  auto core = Make(Strategy::kRestForOne,
                   {RestartType::kPermanent, RestartType::kPermanent, RestartType::kTemporary});
  core.Start(kT0);
  EXPECT_EQ(Str(core.OnExit(1, 1, ExitKind::kError, kT0)), "stop(2,g1) restart_after(10ms,t1)");
  EXPECT_EQ(Str(core.OnTimer(1, kT0 + milliseconds(10))), "start(1,g2)");
}

TEST(SupervisorCoreTest, OneForOneTemporarySiblingFailureChangesNothing) {
  auto core = Make(Strategy::kOneForOne, {RestartType::kPermanent, RestartType::kTemporary});
  core.Start(kT0);
  EXPECT_EQ(Str(core.OnExit(1, 1, ExitKind::kError, kT0)), "");
  EXPECT_TRUE(core.running(0));
}

// Strategy x intensity exceeded -> escalation.
class IntensityTest : public ::testing::TestWithParam<Strategy> {};

TEST_P(IntensityTest, EscalatesAfterMaxRestartsWithinPeriod) {
  auto core = Make(GetParam(), {RestartType::kPermanent, RestartType::kPermanent},
                   Intensity{2, seconds(1)});
  core.Start(kT0);
  TimePoint t = kT0;
  for (uint64_t gen = 1; gen <= 2; ++gen) {
    auto a = core.OnExit(0, gen, ExitKind::kError, t);
    ASSERT_EQ(a.back().kind, Action::Kind::kRestartAfter) << Str(a);
    t += milliseconds(100);
    core.OnTimer(a.back().timer, t);
  }
  std::string decision;
  auto a = core.OnExit(0, 3, ExitKind::kError, t, &decision);
  EXPECT_EQ(Str(a), "stop(1,g" + std::to_string(core.generation(1)) +
                        ") escalate(restart intensity exceeded: more than 2 restarts in 1000ms)");
  EXPECT_EQ(decision, "escalate");
  EXPECT_EQ(Str(core.OnExit(1, core.generation(1), ExitKind::kError, t)), "")
      << "an escalated supervisor decides nothing more";
}

INSTANTIATE_TEST_SUITE_P(Strategies, IntensityTest,
                         ::testing::Values(Strategy::kOneForOne, Strategy::kOneForAll,
                                           Strategy::kRestForOne));

TEST(SupervisorCoreTest, RestartsOutsideThePeriodDoNotCount) {
  auto core = Make(Strategy::kOneForOne, {RestartType::kPermanent}, Intensity{1, seconds(1)});
  core.Start(kT0);
  auto a = core.OnExit(0, 1, ExitKind::kError, kT0);
  core.OnTimer(a.back().timer, kT0 + milliseconds(10));
  a = core.OnExit(0, 2, ExitKind::kError, kT0 + seconds(2));
  EXPECT_EQ(a.back().kind, Action::Kind::kRestartAfter) << Str(a);
}

TEST(SupervisorCoreTest, BackoffDoublesUpToMaxAndResetsAfterHealthyRun) {
  BackoffPolicy b = NoJitter();
  b.max = milliseconds(50);
  b.reset_after = seconds(10);
  auto core = Make(Strategy::kOneForOne, {RestartType::kPermanent}, Intensity{100, seconds(1)}, b);
  core.Start(kT0);
  TimePoint t = kT0;
  std::vector<int64_t> delays_ms;
  for (uint64_t gen = 1; gen <= 5; ++gen) {
    auto a = core.OnExit(0, gen, ExitKind::kError, t);
    delays_ms.push_back(std::chrono::duration_cast<milliseconds>(a.back().delay).count());
    t += a.back().delay;
    core.OnTimer(a.back().timer, t);
  }
  EXPECT_EQ(delays_ms, (std::vector<int64_t>{10, 20, 40, 50, 50}));
  // A child that then ran healthily for longer than reset_after starts over at `initial`.
  auto a = core.OnExit(0, 6, ExitKind::kError, t + seconds(11));
  EXPECT_EQ(a.back().delay, milliseconds(10));
}

TEST(SupervisorCoreTest, JitterStaysWithinBoundsAndIsSeeded) {
  BackoffPolicy b = NoJitter();
  b.jitter = 0.5;
  b.multiplier = 1.0;
  auto run = [&](uint64_t seed) {
    SupervisorCore core("s", Strategy::kOneForOne, Intensity{1000, seconds(1)},
                        {CoreChild{"c", RestartType::kPermanent, b}}, seed);
    core.Start(kT0);
    std::vector<int64_t> out;
    TimePoint t = kT0;
    for (uint64_t gen = 1; gen <= 50; ++gen) {
      auto a = core.OnExit(0, gen, ExitKind::kError, t);
      out.push_back(a.back().delay.count());
      core.OnTimer(a.back().timer, t);
    }
    return out;
  };
  auto d1 = run(7), d2 = run(7), d3 = run(8);
  EXPECT_EQ(d1, d2) << "same seed, same delays";
  EXPECT_NE(d1, d3) << "another seed, other delays";
  std::set<int64_t> distinct(d1.begin(), d1.end());
  EXPECT_GT(distinct.size(), 40u);
  for (int64_t d : d1) {
    EXPECT_GE(d, 5'000'000);
    EXPECT_LT(d, 15'000'000);
  }
}

TEST(SupervisorCoreTest, ShutdownStopsInReverseStartOrderAndEndsRestarts) {
  auto core = Make(Strategy::kOneForOne,
                   {RestartType::kPermanent, RestartType::kPermanent, RestartType::kPermanent});
  core.Start(kT0);
  auto a = core.OnExit(1, 1, ExitKind::kError, kT0);  // child 1 waits for its restart timer
  EXPECT_EQ(Str(core.Shutdown()), "stop(2,g1) stop(0,g1)");
  EXPECT_EQ(Str(core.OnTimer(a.back().timer, kT0 + seconds(1))), "")
      << "no restart after shutdown began";
}

TEST(SupervisorCoreTest, StaleExitIsIgnored) {
  auto core = Make(Strategy::kOneForOne, {RestartType::kPermanent});
  core.Start(kT0);
  auto a = core.OnExit(0, 1, ExitKind::kError, kT0);
  core.OnTimer(a.back().timer, kT0 + milliseconds(10));
  std::string decision;
  EXPECT_EQ(Str(core.OnExit(0, 1, ExitKind::kError, kT0, &decision)), "");
  EXPECT_EQ(decision, "ignore (stale generation)");
  EXPECT_TRUE(core.running(0));
}

}  // namespace
}  // namespace troupe::runtime
