// The CAF supervisor actor on the deterministic test scheduler: each test asserts the exact
// sequence of starts, exits, stops and restarts it observed; time moves only when advanced.
#include "troupe/runtime/supervisor.h"

#include <gtest/gtest.h>

#include "internal/test_support.h"

namespace troupe::runtime {
namespace {

using std::chrono::milliseconds;
using testing::ping_atom;
using testing::Received;
using V = std::vector<std::string>;

SupervisorSpec Workers(std::string name, Strategy s, int n,
                       Intensity in = {3, std::chrono::seconds(5)}) {
  SupervisorSpec spec{std::move(name), s, in, /*children=*/{}};
  for (int i = 0; i < n; ++i) {
    ChildSpec c =
        ChildSpec::Actor("w" + std::to_string(i), "worker", caf::make_message(int32_t{i}));
    c.backoff.initial = milliseconds(10);
    c.backoff.jitter = 0;
    spec.children.push_back(c);
  }
  return spec;
}

class SupervisorTest : public testing::DeterministicRuntime {};

TEST_F(SupervisorTest, KilledChildIsRestartedAfterBackoffAsNextGeneration) {
  ASSERT_TRUE(rt_->StartSupervisor(Workers("sup", Strategy::kOneForOne, 3)).ok());
  Run();
  EXPECT_EQ(Events(), (V{"w0:g1:start", "w1:g1:start", "w2:g1:start"}));
  ASSERT_TRUE(rt_->faults().KillActor("w1").ok());
  Run();
  EXPECT_EQ(Events(), (V{"w1:g1:exit:killed", "w1:g1:restart_scheduled"}));
  Advance(milliseconds(9));
  EXPECT_EQ(Events(), V{}) << "no restart before the backoff elapsed";
  Advance(milliseconds(1));
  EXPECT_EQ(Events(), (V{"w1:g2:start"}));
  EXPECT_EQ(rt_->Lookup("w1")->generation, 2u);
}

TEST_F(SupervisorTest, StaleGenerationMessageIsDroppedNotDeliveredToNewIncarnation) {
  ASSERT_TRUE(rt_->StartSupervisor(Workers("sup", Strategy::kOneForOne, 1)).ok());
  Run();
  ActorRef old_ref = *rt_->Lookup("w0");
  ASSERT_TRUE(rt_->Send(old_ref, ping_atom::value).ok());
  Run();
  EXPECT_EQ(Received().Take(), (V{"w0:g1:ping"}));
  ASSERT_TRUE(rt_->faults().KillActor("w0").ok());
  Advance(milliseconds(10));
  Events();
  ActorRef new_ref = *rt_->Lookup("w0");
  ASSERT_EQ(new_ref.generation, 2u);
  ASSERT_TRUE(rt_->Send(old_ref, ping_atom::value).ok());
  Run();
  EXPECT_EQ(Received().Take(), V{});
  EXPECT_EQ(Events(), (V{"w0:g2:drop"}));
  ASSERT_TRUE(rt_->Send(new_ref, ping_atom::value).ok());
  Run();
  EXPECT_EQ(Received().Take(), (V{"w0:g2:ping"}));
}

TEST_F(SupervisorTest, RestForOneRestartsExactlyTheLaterSiblingsInOrder) {
  ASSERT_TRUE(rt_->StartSupervisor(Workers("sup", Strategy::kRestForOne, 4)).ok());
  Run();
  Events();
  ASSERT_TRUE(rt_->faults().KillActor("w1").ok());
  Run();
  Advance(milliseconds(10));
  EXPECT_EQ(Events(), (V{"w1:g1:exit:killed", "w3:g1:stop", "w2:g1:stop", "w1:g1:restart_scheduled",
                         "w1:g2:start", "w2:g2:start", "w3:g2:start"}));
}

TEST_F(SupervisorTest, OneForAllRestartsEveryChild) {
  ASSERT_TRUE(rt_->StartSupervisor(Workers("sup", Strategy::kOneForAll, 3)).ok());
  Run();
  Events();
  rt_->faults().FailAtMessage("w2", 1);
  ASSERT_TRUE(rt_->Send(*rt_->Lookup("w2"), ping_atom::value).ok());
  Run();
  Advance(milliseconds(10));
  EXPECT_EQ(Events(), (V{"w2:g1:exit:error", "w1:g1:stop", "w0:g1:stop", "w2:g1:restart_scheduled",
                         "w0:g2:start", "w1:g2:start", "w2:g2:start"}));
  EXPECT_EQ(Received().Take(), V{}) << "the failing message was not handled";
}

TEST_F(SupervisorTest, NestedSupervisorEscalatesAndParentRestartsIt) {
  SupervisorSpec root{"root", Strategy::kOneForOne, Intensity{5, std::chrono::seconds(5)},
                      /*children=*/{}};
  ChildSpec inner = ChildSpec::Supervisor(
      "inner", Workers("inner", Strategy::kOneForOne, 1, Intensity{1, std::chrono::seconds(5)}));
  inner.backoff.jitter = 0;
  inner.backoff.initial = milliseconds(100);
  root.children.push_back(inner);
  ASSERT_TRUE(rt_->StartSupervisor(root).ok());
  Run();
  EXPECT_EQ(Events(), (V{"inner:g1:start", "w0:g1:start"}));
  ASSERT_TRUE(rt_->faults().KillActor("w0").ok());
  Advance(milliseconds(10));
  EXPECT_EQ(Events(), (V{"w0:g1:exit:killed", "w0:g1:restart_scheduled", "w0:g2:start"}));
  ASSERT_TRUE(rt_->faults().KillActor("w0").ok());
  Run();
  EXPECT_EQ(Events(), (V{"w0:g2:exit:killed", "inner:g1:escalate", "inner:g1:exit:error",
                         "inner:g1:restart_scheduled"}));
  Advance(milliseconds(100));
  EXPECT_EQ(Events(), (V{"inner:g2:start", "w0:g3:start"}))
      << "generations never repeat, even under a new supervisor incarnation";
}

TEST_F(SupervisorTest, ShutdownStopsChildrenInReverseOrderKillingAfterTimeout) {
  SupervisorSpec spec = Workers("sup", Strategy::kOneForOne, 2);
  ChildSpec stubborn = ChildSpec::Actor("s", "stubborn");
  stubborn.shutdown_timeout = milliseconds(500);
  spec.children.insert(spec.children.begin() + 1, stubborn);
  auto sup = rt_->StartSupervisor(spec);
  ASSERT_TRUE(sup.ok());
  Run();
  EXPECT_EQ(Events(), (V{"w0:g1:start", "s:g1:start", "w1:g1:start"}));
  caf::anon_send_exit(sup->handle, caf::exit_reason::user_shutdown);
  Run();
  EXPECT_EQ(Events(), (V{"w1:g1:stop"})) << "waiting for the stubborn child";
  Advance(milliseconds(499));
  EXPECT_EQ(Events(), V{});
  Advance(milliseconds(1));
  EXPECT_EQ(Events(), (V{"s:g1:stop", "s:g1:stop", "w0:g1:stop"}));
  EXPECT_FALSE(rt_->Lookup("w0").ok());
  EXPECT_FALSE(rt_->Lookup("sup").ok());
}

TEST_F(SupervisorTest, InvalidTreeIsRejectedBeforeAnythingStarts) {
  SupervisorSpec spec = Workers("sup", Strategy::kOneForOne, 1);
  spec.children.push_back(ChildSpec::Actor("x", "no-such-type"));
  auto s = rt_->StartSupervisor(spec);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("child 'x': unknown actor type 'no-such-type'"),
            std::string::npos)
      << s.status();
  spec.children.back() = ChildSpec::Actor("x", "worker", caf::make_message(std::string("one")));
  s = rt_->StartSupervisor(spec);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("expects arguments (int32), got (string)"), std::string::npos)
      << s.status();
  spec.children.back() = ChildSpec::Actor("w0", "worker", caf::make_message(int32_t{1}));
  s = rt_->StartSupervisor(spec);
  EXPECT_NE(s.status().message().find("duplicate child name"), std::string::npos) << s.status();
  Run();
  EXPECT_EQ(Events(), V{});
}

}  // namespace
}  // namespace troupe::runtime
