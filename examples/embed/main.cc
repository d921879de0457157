// Embedding troupe: a runtime, a supervisor with three workers, one worker killed through the
// fault-injection API, and the restart it causes — printed as it happens.
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>

#include "caf/scoped_actor.hpp"
#include "troupe/runtime/runtime.h"

namespace rt = troupe::runtime;
using work_atom = caf::atom_constant<caf::atom("work")>;

int main(int argc, char** argv) {
  rt::ActorRegistry registry;
  (void)registry.Register<int32_t>("worker", [](rt::Actor* /*self*/, int32_t id) {
    return caf::behavior{[=](work_atom, int32_t x) { return x * id; }};
  });
  auto runtime = rt::Runtime::FromArgs(std::move(registry), argc, argv);
  if (!runtime.ok()) {
    std::cerr << "embed: " << runtime.status() << "\n";
    return 2;
  }
  std::mutex mu;
  std::condition_variable cv;
  bool restarted = false;
  (*runtime)->SetEventSink([&](const troupe::base::SupervisionEvent& e) {
    std::cout << troupe::base::FormatEvent(e) << std::endl;
    std::lock_guard<std::mutex> lock(mu);
    if (e.child == "worker-2" && e.event == "start" && e.generation == 2) restarted = true;
    cv.notify_all();
  });

  rt::SupervisorSpec spec;
  spec.name = "workers";
  spec.strategy = rt::Strategy::kOneForOne;
  for (int32_t i = 1; i <= 3; ++i) {
    spec.children.push_back(
        rt::ChildSpec::Actor("worker-" + std::to_string(i), "worker", caf::make_message(i)));
  }
  if (auto sup = (*runtime)->StartSupervisor(spec); !sup.ok()) {
    std::cerr << "embed: " << sup.status() << "\n";
    return 1;
  }
  while (!(*runtime)->Lookup("worker-2").ok()) std::this_thread::yield();
  std::cout << "killing worker-2 through fault injection" << std::endl;
  if (auto s = (*runtime)->faults().KillActor("worker-2"); !s.ok()) {
    std::cerr << "embed: " << s << "\n";
    return 1;
  }
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return restarted; })) {
    std::cerr << "embed: worker-2 was not restarted within 10s\n";
    return 1;
  }
  lock.unlock();
  auto ref = (*runtime)->Lookup("worker-2");
  caf::scoped_actor self{(*runtime)->system()};
  self->request(ref->handle, std::chrono::seconds(5), work_atom::value, int32_t{21})
      .receive(
          [&](int32_t y) {
            std::cout << "worker-2 restarted as generation " << ref->generation
                      << "; work(21) = " << y << "\n";
          },
          [&](caf::error& e) { std::cerr << "embed: " << caf::to_string(e) << "\n"; });
  return 0;
}
