// The job's event log: lines written are read back with their fields, the newest fault that
// awaits recovery is found, and the progress text is made from the fields.
#include "troupe/train/job_events.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>

namespace troupe::train {
namespace {

using base::SupervisionEvent;

SupervisionEvent Fired(const std::string& kind, int64_t at_ns) {
  SupervisionEvent e = JobEvent("fault_fired", "n1/w0", "rank");
  e.pid = 42;
  e.signal = SIGKILL;
  e.Set("kind", kind).Set("step", 7).Set("at_ns", at_ns);
  return e;
}

TEST(JobEventsTest, TheLogIsReadBackWithItsFields) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("troupe_job_events_test_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  {
    EventLog log(EventLogPath(dir));  // creates <dir>/logs
    SupervisionEvent g = JobEvent("generation");
    g.generation = 2;
    g.Set("world", 3).Set("workers", "a b c").Set("step", 10).Set("source", "checkpoint");
    g.reason = "workers d down (killed)";
    log.Write(g);
    log.Write(Fired("kill-worker", 1000));
  }
  std::vector<SupervisionEvent> events = ReadEventLog(dir + "/logs/events.log");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].event, "generation");
  EXPECT_EQ(events[0].generation, 2u);
  EXPECT_EQ(events[0].Field("workers"), "a b c");
  EXPECT_EQ(events[0].IntField("step"), 10);
  EXPECT_EQ(events[1].pid, 42);
  EXPECT_EQ(events[1].signal, SIGKILL);
  EXPECT_EQ(events[1].IntField("at_ns"), 1000);
  std::filesystem::remove_all(dir);
}

TEST(JobEventsTest, RecoveryIsMeasuredFromTheNewestFaultThatKillsOrStops) {
  std::vector<SupervisionEvent> events = {Fired("kill-worker", 1000), Fired("stop-worker", 3000),
                                          Fired("sigterm-node", 5000), Fired("join-worker", 6000),
                                          JobEvent("generation")};
  std::optional<SupervisionEvent> f = NewestRecoveryFault(events);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->Field("kind"), "stop-worker");
  EXPECT_EQ(f->IntField("at_ns"), 3000);
  EXPECT_FALSE(NewestRecoveryFault({Fired("sigterm-node", 1)}));
  EXPECT_TRUE(FaultAwaitsRecovery(FaultKind::kCrashInCheckpoint));
  EXPECT_FALSE(FaultAwaitsRecovery(FaultKind::kJoinWorker));
}

TEST(JobEventsTest, ProgressTextIsMadeFromTheFields) {
  SupervisionEvent g = JobEvent("generation");
  g.generation = 3;
  g.Set("world", 2).Set("workers", "a b").Set("step", 20).Set("source", "checkpoint");
  g.reason = "job start";
  EXPECT_EQ(DescribeEvent(g),
            "generation 3: world 2 [a b] at step 20, state from checkpoint step-20 — job start");
  g.Set("source", "mirrors");
  EXPECT_NE(DescribeEvent(g).find("memory (owners + buddy mirrors)"), std::string::npos);

  SupervisionEvent armed = JobEvent("fault_armed");
  armed.Set("kind", "stop-worker").Set("step", 7).Set("rank", 1).Set("worker", "n1/w0");
  EXPECT_EQ(DescribeEvent(armed),
            "chaos: SIGSTOP of rank 1 (n1/w0) in the middle of step 7's gradient exchange");

  SupervisionEvent dropped = JobEvent("checkpoint_dropped");
  dropped.Set("step", 10).Set("shard", 0);
  dropped.reason = "RESOURCE_EXHAUSTED: No space left on device";
  EXPECT_EQ(DescribeEvent(dropped),
            "warning: checkpoint step-10: shard 0: RESOURCE_EXHAUSTED: No space left on device "
            "(dropped; training goes on)");

  SupervisionEvent eval = JobEvent("eval");
  eval.Set("step", 10).Set("val_loss", "4.512345").Set("eval_s", "0.031000");
  EXPECT_EQ(DescribeEvent(eval), "validation loss 4.512345 after step 10 (0.031000 s)");

  // The job supervisor's own events (runtime/supervisor.cc): the coordinator's exits, the end.
  SupervisionEvent exit{
      {}, "j.job", "j.coordinator", 4, "exit", "error: lease lost", "restart after 500us"};
  EXPECT_EQ(DescribeEvent(exit),
            "j.coordinator (incarnation 4) exited: error: lease lost; restart after 500us");
  SupervisionEvent escalate{{},
                            "j.job",
                            "j.job",
                            1,
                            "escalate",
                            "restart intensity exceeded",
                            "stop supervisor; parent decides"};
  EXPECT_EQ(DescribeEvent(escalate), "j.job gives up: restart intensity exceeded");

  SupervisionEvent unknown = JobEvent("something_new");
  unknown.Set("x", 1);
  EXPECT_NE(DescribeEvent(unknown).find("event=something_new"), std::string::npos)
      << "an event without a description is shown as its line";
}

}  // namespace
}  // namespace troupe::train
