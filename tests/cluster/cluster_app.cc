// The program the cluster tests run as head, node agents and workers: troupe's RunMain with a
// few actor types for the tests.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "caf/all.hpp"
#include "troupe/runtime/cluster.h"

namespace rt = troupe::runtime;
using echo_atom = caf::atom_constant<caf::atom("echo")>;
using pid_atom = caf::atom_constant<caf::atom("pid")>;
using hang_atom = caf::atom_constant<caf::atom("hang")>;
using gpus_atom = caf::atom_constant<caf::atom("gpus")>;

int main(int argc, char** argv) {
  rt::ActorRegistry registry;
  (void)registry.Register<>("echo", [](rt::Actor*) {
    return caf::behavior{
        [](echo_atom, int64_t x) { return x; },
        [](pid_atom) { return static_cast<int64_t>(getpid()); },
        // The GPUs its node agent gave this worker.
        [](gpus_atom) {
          const char* visible = getenv("CUDA_VISIBLE_DEVICES");
          return std::string(visible == nullptr ? "<unset>" : visible);
        },
        [](hang_atom) {
          std::cerr << "echo: entering an endless handler" << std::endl;
          for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        },
    };
  });
  int rc = rt::RunMain(argc, argv, std::move(registry));
  if (rc < 0) {
    std::cerr << "usage: cluster_app head|node|worker|up ...\n";
    return 2;
  }
  return rc;
}
