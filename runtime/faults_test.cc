#include "troupe/runtime/faults.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

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
