// FormatEvent and ParseEvent are inverses, the further fields included.
#include "troupe/base/events.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

namespace troupe::base {
namespace {

void ExpectSame(const SupervisionEvent& a, const SupervisionEvent& b) {
  EXPECT_EQ(a.supervisor, b.supervisor);
  EXPECT_EQ(a.child, b.child);
  EXPECT_EQ(a.generation, b.generation);
  EXPECT_EQ(a.event, b.event);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.decision, b.decision);
  EXPECT_EQ(a.pid, b.pid);
  EXPECT_EQ(a.cause, b.cause);
  EXPECT_EQ(a.exit_code, b.exit_code);
  EXPECT_EQ(a.signal, b.signal);
  EXPECT_EQ(a.fields, b.fields);
}

SupervisionEvent RoundTrip(const SupervisionEvent& e) {
  SupervisionEvent back;
  EXPECT_TRUE(ParseEvent(FormatEvent(e), &back)) << FormatEvent(e);
  return back;
}

TEST(EventsTest, SupervisionEventRoundTrips) {
  SupervisionEvent e;
  e.wall_time = std::chrono::system_clock::now();
  e.supervisor = "job";
  e.child = "worker-1";
  e.generation = 2;
  e.event = "exit";
  e.reason = "killed \"hard\" = \\ bye";
  e.decision = "restart after 10000us";
  ExpectSame(RoundTrip(e), e);
}

TEST(EventsTest, ProcessExitRoundTrips) {
  for (int status : {0 << 8, 3 << 8, SIGKILL}) {
    SupervisionEvent e = ProcessExitEvent("node:n1", "n1/w0", 4242, status, false);
    ExpectSame(RoundTrip(e), e);
  }
  SupervisionEvent fenced = ProcessExitEvent("node:n1", "n1/w0", 7, SIGKILL, true);
  EXPECT_EQ(fenced.cause, ExitCause::kFenced);
  ExpectSame(RoundTrip(fenced), fenced);
}

TEST(EventsTest, FieldsRoundTripInKeyOrderBeforeTheReason) {
  SupervisionEvent e;
  e.supervisor = "coordinator";
  e.generation = 3;
  e.event = "generation";
  e.Set("world", 3).Set("workers", "n0/w0 n1/w0 n3/w0").Set("source", "checkpoint");
  e.Set("step", int64_t{10}).Set("empty", "");
  e.reason = "workers n2/w0 down (killed)";
  const std::string line = FormatEvent(e);
  EXPECT_NE(line.find(" empty=\"\" source=checkpoint step=10 workers=\"n0/w0 n1/w0 n3/w0\" "
                      "world=3 reason="),
            std::string::npos)
      << line;
  SupervisionEvent back = RoundTrip(e);
  ExpectSame(back, e);
  EXPECT_EQ(back.Field("source"), "checkpoint");
  EXPECT_EQ(back.IntField("step"), 10);
  EXPECT_EQ(back.IntField("world"), 3);
  EXPECT_EQ(back.Field("absent"), "");
  EXPECT_EQ(back.IntField("absent", -7), -7);
  EXPECT_EQ(back.IntField("source", -7), -7) << "not an integer";
}

TEST(EventsTest, PidAndSignalWithoutAnExitCause) {
  SupervisionEvent e;
  e.supervisor = "rank";
  e.child = "n1/w0";
  e.event = "fault_fired";
  e.pid = 99;
  e.signal = SIGSTOP;
  e.Set("kind", "stop-worker").Set("at_ns", int64_t{1764000000123456789});
  const std::string line = FormatEvent(e);
  EXPECT_NE(line.find(" pid=99 signal=19 at_ns=1764000000123456789 kind=stop-worker"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find("cause="), std::string::npos) << line;
  SupervisionEvent back = RoundTrip(e);
  ExpectSame(back, e);
  EXPECT_EQ(back.IntField("at_ns"), int64_t{1764000000123456789});
}

TEST(EventsTest, ReservedKeysAreNotWrittenAsFields) {
  SupervisionEvent e;
  e.event = "x";
  e.Set("gen", "7").Set("reason", "no").Set("ts", "0").Set("ok", "yes");
  SupervisionEvent back = RoundTrip(e);
  EXPECT_EQ(back.generation, 0u);
  EXPECT_EQ(back.reason, "");
  EXPECT_EQ(back.fields, (std::map<std::string, std::string>{{"ok", "yes"}}));
}

TEST(EventsTest, ParseRejectsWhatIsNotAnEvent) {
  SupervisionEvent e;
  EXPECT_FALSE(ParseEvent("hello world", &e));
  EXPECT_FALSE(ParseEvent("supervisor=a child=b", &e)) << "no event=";
  EXPECT_FALSE(ParseEvent("event=x reason=\"unterminated", &e));
  EXPECT_FALSE(ParseEvent("event=x gen=notanumber", &e));
  ASSERT_TRUE(ParseEvent("ts=2026-11-22T10:00:00.000001Z event=x later=1", &e));
  EXPECT_EQ(e.event, "x");
  EXPECT_EQ(e.IntField("later"), 1) << "keys unknown to this version are kept";
}

}  // namespace
}  // namespace troupe::base
