#include "troupe/runtime/faults.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "internal/test_support.h"

namespace troupe::runtime {
namespace {

using std::chrono::milliseconds;
using testing::ping_atom;
using testing::Received;
using V = std::vector<std::string>;

TEST(FaultInjectorTest, RulesMatchReceiverAtomAndCount) {
  FaultInjector f;
  EXPECT_FALSE(f.armed());
  f.DropMessages({"a", "grad", 2});
  EXPECT_TRUE(f.armed());
  using K = FaultInjector::Decision::Kind;
  EXPECT_EQ(f.OnMessage("b", 1, "grad").kind, K::kDeliver);
  EXPECT_EQ(f.OnMessage("a", 1, "ping").kind, K::kDeliver);
  EXPECT_EQ(f.OnMessage("a", 2, "grad").kind, K::kDrop);
  EXPECT_EQ(f.OnMessage("a", 3, "grad").kind, K::kDrop);
  EXPECT_EQ(f.OnMessage("a", 4, "grad").kind, K::kDeliver) << "count exhausted";
  EXPECT_FALSE(f.armed());
  EXPECT_EQ(f.dropped(), 2u);
  f.FailAtMessage("a", 3);
  EXPECT_EQ(f.OnMessage("a", 2, "").kind, K::kDeliver);
  auto d = f.OnMessage("a", 3, "");
  EXPECT_EQ(d.kind, K::kFail);
  EXPECT_EQ(d.reason, "fault injection: a failed at message 3");
  EXPECT_EQ(f.KillActor("a").code(), absl::StatusCode::kFailedPrecondition);
}

class FaultsOnActorsTest : public testing::DeterministicRuntime {};

TEST_F(FaultsOnActorsTest, DropAndDelayMatchingMessages) {
  ASSERT_TRUE(rt_->SpawnNamed("a", "worker", caf::make_message(int32_t{0})).ok());
  ASSERT_TRUE(rt_->SpawnNamed("b", "worker", caf::make_message(int32_t{1})).ok());
  Run();
  rt_->faults().DropMessages({"a", "ping", 1});
  rt_->faults().DelayMessages({"b", "ping", 1}, milliseconds(50));
  for (const char* n : {"a", "b"}) ASSERT_TRUE(rt_->Send(*rt_->Lookup(n), ping_atom::value).ok());
  Run();
  EXPECT_EQ(Received().Take(), V{}) << "a's ping dropped, b's delayed";
  for (const char* n : {"a", "b"}) ASSERT_TRUE(rt_->Send(*rt_->Lookup(n), ping_atom::value).ok());
  Run();
  EXPECT_EQ(Received().Take(), (V{"a:g1:ping", "b:g1:ping"}));
  Advance(milliseconds(50));
  EXPECT_EQ(Received().Take(), (V{"b:g1:ping"})) << "the delayed ping arrives after 50ms";
  EXPECT_EQ(rt_->faults().dropped(), 1u);
  EXPECT_EQ(rt_->faults().delayed(), 1u);
}

TEST_F(FaultsOnActorsTest, FailAtNthMessageCountsPerIncarnation) {
  ASSERT_TRUE(rt_->SpawnNamed("a", "worker", caf::make_message(int32_t{0})).ok());
  Run();
  rt_->faults().FailAtMessage("a", 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(rt_->Send(*rt_->Lookup("a"), ping_atom::value).ok());
  Run();
  EXPECT_EQ(Received().Take(), (V{"a:g1:ping", "a:g1:ping"}));
  EXPECT_FALSE(rt_->Lookup("a").ok()) << "failed at its third message";
}

}  // namespace
}  // namespace troupe::runtime

namespace troupe::runtime {
namespace {

TEST(CrashPointTest, BadCrashAtOptionIsRejected) {
  RuntimeOptions o;
  o.crash_at = "point:zero";
  auto rt = Runtime::Create(ActorRegistry{}, o);
  EXPECT_EQ(rt.status().message(),
            "option 'crash_at': expected NAME or NAME:HIT (HIT >= 1), got 'point:zero'");
}

class HangTest : public testing::DeterministicRuntime {};

TEST_F(HangTest, HangAtMessageBlocksInsideTheHandlerThenDelivers) {
  auto a = rt_->SpawnNamed("h", "worker", caf::make_message(int32_t{0}));
  ASSERT_TRUE(a.ok());
  Run();
  rt_->faults().HangAtMessage("h", 1, milliseconds(60));
  ASSERT_TRUE(rt_->Send(*a, ping_atom::value).ok());
  auto start = std::chrono::steady_clock::now();
  Run();
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(60));
  EXPECT_EQ(Received().Take(), (V{"h:g1:ping"}));
}

}  // namespace
}  // namespace troupe::runtime

namespace troupe::runtime {
namespace {

TEST(ActorFaultScheduleTest, ParsesOrdersAndFormatsBack) {
  auto faults = ParseActorFaults(
      "kill:worker-2@1500  stop:worker-1@800+2000\tdelay:n1/w0@300+1000/50 kill:a@b@0");
  ASSERT_TRUE(faults.ok()) << faults.status();
  using K = ActorFault::Kind;
  const std::vector<ActorFault> want = {{K::kKill, "a@b", 0, 0, 0},
                                        {K::kDelay, "n1/w0", 300, 1000, 50},
                                        {K::kStop, "worker-1", 800, 2000, 0},
                                        {K::kKill, "worker-2", 1500, 0, 0}};
  EXPECT_EQ(*faults, want) << "ordered by at_ms; a name ends at the last '@'";
  EXPECT_EQ(FormatActorFaults(*faults),
            "kill:a@b@0 delay:n1/w0@300+1000/50 stop:worker-1@800+2000 kill:worker-2@1500");
  EXPECT_EQ(*ParseActorFaults(FormatActorFaults(*faults)), *faults);
  EXPECT_TRUE(ParseActorFaults("  ")->empty());
  ActorFault::Kind k;
  EXPECT_TRUE(ParseActorFaultKind("delay", &k) && k == K::kDelay);
  EXPECT_FALSE(ParseActorFaultKind("pause", &k));
}

TEST(ActorFaultScheduleTest, AMalformedFaultIsNamedWithWhatWasExpected) {
  const std::pair<const char*, const char*> cases[] = {
      {"kill:w1@1 kil:w2@5",
       "fault 'kil:w2@5': expected KIND:NAME@AT_MS[...] with KIND one of kill, stop, delay, got "
       "kind 'kil'"},
      {"w2@5",
       "fault 'w2@5': expected KIND:NAME@AT_MS[...] with KIND one of kill, stop, delay, "
       "got no ':'"},
      {"kill:w1", "fault 'kill:w1': expected kill:NAME@AT_MS, got no '@'"},
      {"kill:@5", "fault 'kill:@5': expected kill:NAME@AT_MS, got no NAME"},
      {"kill:w1@soon", "fault 'kill:w1@soon': expected kill:NAME@AT_MS, got '@soon'"},
      {"kill:w1@-5", "fault 'kill:w1@-5': expected kill:NAME@AT_MS, got '@-5'"},
      {"kill:w1@5+10", "fault 'kill:w1@5+10': expected kill:NAME@AT_MS, got '@5+10'"},
      {"stop:w1@5", "fault 'stop:w1@5': expected stop:NAME@AT_MS+FOR_MS (FOR_MS > 0), got '@5'"},
      {"stop:w1@5+0",
       "fault 'stop:w1@5+0': expected stop:NAME@AT_MS+FOR_MS (FOR_MS > 0), got '@5+0'"},
      {"delay:w1@5+10",
       "fault 'delay:w1@5+10': expected delay:NAME@AT_MS+FOR_MS/DELAY_MS (FOR_MS, DELAY_MS > 0), "
       "got '@5+10'"},
      {"delay:w1@5/10+3",
       "fault 'delay:w1@5/10+3': expected delay:NAME@AT_MS+FOR_MS/DELAY_MS (FOR_MS, DELAY_MS > "
       "0), got '@5/10+3'"},
  };
  for (const auto& [text, message] : cases) {
    auto faults = ParseActorFaults(text);
    EXPECT_EQ(faults.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(faults.status().message(), message) << text;
  }
}

TEST(FaultInjectorTest, FaultsWithAnEndStopAtIt) {
  using K = FaultInjector::Decision::Kind;
  const auto now = std::chrono::steady_clock::now();
  FaultInjector f;
  f.HangNextMessageUntil("a", now + std::chrono::hours(1));
  EXPECT_EQ(f.OnMessage("b", 1, "").kind, K::kDeliver);
  auto d = f.OnMessage("a", 7, "");
  EXPECT_EQ(d.kind, K::kHang) << "the next message, whatever its index";
  EXPECT_GT(d.delay, std::chrono::minutes(59)) << "hangs until the end";
  EXPECT_LE(d.delay, std::chrono::hours(1));
  EXPECT_EQ(f.OnMessage("a", 8, "").kind, K::kDeliver) << "one message hangs";
  f.DelayMessagesUntil({"a", "", -1}, milliseconds(50), now + std::chrono::hours(1));
  f.DelayMessagesUntil({"b", "", -1}, milliseconds(50), now - milliseconds(1));
  EXPECT_EQ(f.OnMessage("a", 9, "").kind, K::kDelay);
  EXPECT_EQ(f.OnMessage("a", 10, "").kind, K::kDelay) << "every message until the end";
  EXPECT_EQ(f.OnMessage("b", 2, "").kind, K::kDeliver) << "past its end";
  f.HangNextMessageUntil("c", now - milliseconds(1));
  EXPECT_EQ(f.OnMessage("c", 1, "").kind, K::kDeliver) << "a stop past its end never hangs";
}

using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// TROUPE_CHAOS_* set for one test (each test runs in a process of its own), unset after.
class ActorChaosTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* v : {"TROUPE_CHAOS_ACTORS", "TROUPE_CHAOS_LOG", "TROUPE_CHAOS_ACTORS_LIST"}) {
      unsetenv(v);
    }
  }
};

TEST_F(ActorChaosTest, AMalformedScheduleFailsTheRuntimeNamingTheVariable) {
  setenv("TROUPE_CHAOS_ACTORS", "kill:w1@10 stop:w2@soon+5", 1);
  auto rt = Runtime::Create(testing::TestRegistry());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.status().message(),
            "environment variable TROUPE_CHAOS_ACTORS: fault 'stop:w2@soon+5': expected "
            "stop:NAME@AT_MS+FOR_MS (FOR_MS > 0), got '@soon+5'");
}

TEST_F(ActorChaosTest, TheScheduleFiresAsEventsAndLogLines) {
  const std::string dir = ::testing::TempDir() + "/actor-chaos-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  setenv("TROUPE_CHAOS_ACTORS", "stop:b@400+30 kill:a@600 delay:ghost@800+10/5", 1);
  setenv("TROUPE_CHAOS_LOG", (dir + "/faults.log").c_str(), 1);
  setenv("TROUPE_CHAOS_ACTORS_LIST", (dir + "/actors.txt").c_str(), 1);
  auto rt = Runtime::Create(testing::TestRegistry());
  ASSERT_TRUE(rt.ok()) << rt.status();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<base::SupervisionEvent> fired;
  (*rt)->SetEventSink([&](const base::SupervisionEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e.event == "chaos_fault") fired.push_back(e);
    cv.notify_all();
  });
  ASSERT_TRUE((*rt)->SpawnNamed("a", "worker", caf::make_message(int32_t{0})).ok());
  ASSERT_TRUE((*rt)->SpawnNamed("b", "worker", caf::make_message(int32_t{1})).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return fired.size() == 3; }));
  }
  std::vector<std::string> got;
  for (const auto& e : fired) {
    got.push_back(absl::StrCat(e.Field("fault"), " ", e.child, " ", e.Field("kind"), " ",
                               e.Field("at_ms"), " ", e.Field("result")));
    EXPECT_GE(e.IntField("fired_ms"), e.IntField("at_ms"));
  }
  // Hundreds of ms after the runtime starts: a and b are spawned by then, also on a loaded host.
  EXPECT_EQ(got, (V{"stop:b@400+30 b stop 400 ok", "kill:a@600 a kill 600 ok",
                    "delay:ghost@800+10/5 ghost delay 800 no_actor"}));
  for (int i = 0; i < 500 && (*rt)->Lookup("a").ok(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE((*rt)->Lookup("a").ok()) << "killed";
  (*rt)->Shutdown();
  std::istringstream log(Slurp(dir + "/faults.log"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(log, line);) {
    base::SupervisionEvent e;
    ASSERT_TRUE(base::ParseEvent(line, &e)) << line;
    lines.push_back(e.Field("fault") + " " + e.Field("result"));
  }
  EXPECT_EQ(lines, (V{"stop:b@400+30 ok", "kill:a@600 ok", "delay:ghost@800+10/5 no_actor"}));
  EXPECT_EQ(Slurp(dir + "/actors.txt"), "b\n") << "the directory at Shutdown";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace troupe::runtime
