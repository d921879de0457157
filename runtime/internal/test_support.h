// internal/test_support.h — a Runtime on CAF's deterministic test scheduler, for tests: nothing
// runs until the test pumps it, and time moves only when the test advances it.
#ifndef TROUPE_RUNTIME_INTERNAL_TEST_SUPPORT_H_
#define TROUPE_RUNTIME_INTERNAL_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "caf/all.hpp"
#include "caf/scheduler/test_coordinator.hpp"
#include "troupe/runtime/runtime.h"

namespace troupe::runtime::testing {

using ping_atom = caf::atom_constant<caf::atom("ping")>;

// What worker actors received, in order ("w1:g2:ping").
class Journal {
 public:
  void Add(std::string s) {
    std::lock_guard<std::mutex> l(mu_);
    lines_.push_back(std::move(s));
  }
  std::vector<std::string> Take() {
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(lines_, {});
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

inline Journal& Received() {
  static Journal j;
  return j;
}

// "worker": (int32 id) records every ping; "stubborn": ignores shutdown requests.
inline ActorRegistry TestRegistry() {
  ActorRegistry r;
  (void)r.Register<int32_t>("worker", [](Actor* self, int32_t) {
    return caf::behavior{[self](ping_atom) {
      Received().Add(absl::StrCat(self->actor_name(), ":g", self->generation(), ":ping"));
    }};
  });
  (void)r.Register<>("stubborn", [](Actor* self) {
    self->set_exit_handler([](caf::exit_msg&) {});
    return caf::behavior{[](ping_atom) {}};
  });
  return r;
}

class DeterministicRuntime : public ::testing::Test {
 protected:
  void SetUp() override {
    RuntimeOptions o;
    o.scheduler = "testing";
    o.threads = 1;
    auto rt = Runtime::Create(TestRegistry(), o);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = std::move(*rt);
    rt_->SetEventSink([this](const base::SupervisionEvent& e) {
      std::string s = absl::StrCat(e.child, ":g", e.generation, ":", e.event);
      if (e.event == "exit") absl::StrAppend(&s, ":", e.reason.substr(0, e.reason.find(':')));
      std::lock_guard<std::mutex> l(mu_);
      events_.push_back(s);
    });
    Received().Take();
  }
  void TearDown() override { rt_.reset(); }

  caf::scheduler::test_coordinator& sched() {
    return dynamic_cast<caf::scheduler::test_coordinator&>(rt_->system().scheduler());
  }
  void Run() { sched().run(); }
  // Runs everything due now, then moves time forward by `d` and runs what became due.
  void Advance(Duration d) {
    Run();
    sched().advance_time(std::chrono::duration_cast<caf::timespan>(d));
    Run();
  }
  std::vector<std::string> Events() {
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(events_, {});
  }

  std::unique_ptr<Runtime> rt_;
  std::mutex mu_;
  std::vector<std::string> events_;
};

}  // namespace troupe::runtime::testing

#endif  // TROUPE_RUNTIME_INTERNAL_TEST_SUPPORT_H_
