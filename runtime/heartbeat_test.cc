// What a process's heartbeat carries (internal/heartbeat.h): only handlers that have run past
// the floor, once when reported and once when they end, chained by versions.
#include "internal/heartbeat.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace troupe::runtime::internal {
namespace {

constexpr int64_t kMs = 1000000;

std::string Show(const HeartbeatMessage& m) {
  std::string s = std::to_string(m.base) + "->" + std::to_string(m.version) + ":";
  for (const ActorStat& a : m.changes) {
    s += " " + a.name + "@" + std::to_string(a.progress) + "=" + std::to_string(a.busy_ms);
  }
  return s;
}

TEST(HeartbeatDiffTest, OnlyHandlersPastTheFloorAreReportedOnceAndTheirEndOnce) {
  HeartbeatDiff diff(100 * kMs);
  const int64_t t = 1000000 * kMs;
  std::vector<ActorSample> actors = {
      {"short", 1, 3, t - 50 * kMs}, {"long", 1, 7, t - 150 * kMs}, {"idle", 1, 9, 0}};
  EXPECT_EQ(Show(diff.Next(actors, t, /*full=*/true)), "0->1: long@7=150");
  actors[0].busy_since_ns = 0;  // the short handler ended before it was worth telling
  EXPECT_EQ(Show(diff.Next(actors, t + 500 * kMs, false)), "1->1:") << "told already";
  actors[1].busy_since_ns = 0;  // its handler ended
  actors[1].progress = 8;
  EXPECT_EQ(Show(diff.Next(actors, t + 600 * kMs, false)), "1->2: long@8=0");
  EXPECT_EQ(Show(diff.Next(actors, t + 700 * kMs, false)), "2->2:");
  actors[0].busy_since_ns = t + 600 * kMs;  // a new handler, past the floor at 750 ms
  EXPECT_EQ(Show(diff.Next(actors, t + 750 * kMs, false)), "2->3: short@3=150");
  actors[0].busy_since_ns = t + 760 * kMs;  // another one, too short to tell yet
  EXPECT_EQ(Show(diff.Next(actors, t + 800 * kMs, false)), "3->4: short@3=0");
}

TEST(HeartbeatDiffTest, AnActorGoneWhileReportedBusyIsReportedIdle) {
  HeartbeatDiff diff(100 * kMs);
  const int64_t t = 1000000 * kMs;
  EXPECT_EQ(Show(diff.Next({{"a", 2, 1, t - 300 * kMs}}, t, true)), "0->1: a@1=300");
  EXPECT_EQ(Show(diff.Next({}, t + 100 * kMs, false)), "1->2: a@0=0");
  EXPECT_EQ(Show(diff.Next({}, t + 200 * kMs, false)), "2->2:");
}

TEST(HeartbeatDiffTest, AFullOneReportsEveryBusyActorAgainAndTheVersionGoesOn) {
  HeartbeatDiff diff(100 * kMs);
  const int64_t t = 1000000 * kMs;
  const std::vector<ActorSample> actors = {{"a", 1, 1, t - 300 * kMs}, {"b", 1, 4, t - 200 * kMs}};
  EXPECT_EQ(Show(diff.Next(actors, t, true)), "0->1: a@1=300 b@4=200");
  EXPECT_EQ(Show(diff.Next(actors, t, false)), "1->1:");
  EXPECT_EQ(Show(diff.Next(actors, t + 100 * kMs, true)), "0->2: a@1=400 b@4=300")
      << "a head that asked for it gets the whole picture, never version 1 again";
}

}  // namespace
}  // namespace troupe::runtime::internal
