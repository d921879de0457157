// The serving process of the direct-channel tests: a troupe Runtime with a named actor
// "echo-1" behind a DirectServer. Prints `port=N`, then serves until its stdin closes (or it is
// killed). `--no-inline` hands every request to the CAF scheduler instead of running the actor
// on the connection thread.
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "caf/all.hpp"
#include "troupe/runtime/direct.h"
#include "troupe/runtime/runtime.h"
#include "troupe/runtime/status.h"

namespace rt = troupe::runtime;
using echo_atom = caf::atom_constant<caf::atom("echo")>;
using pid_atom = caf::atom_constant<caf::atom("pid")>;
using hang_atom = caf::atom_constant<caf::atom("hang")>;
using fail_atom = caf::atom_constant<caf::atom("fail")>;

int main(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  bool run_inline = !(argc > 1 && std::strcmp(argv[1], "--no-inline") == 0);
  rt::ActorRegistry registry;
  (void)registry.Register<>("echo", [](rt::Actor*) {
    return caf::behavior{
        [](echo_atom, int64_t x) { return x; },
        [](pid_atom) { return static_cast<int64_t>(getpid()); },
        [](fail_atom) -> caf::result<int64_t> {
          return troupe::runtime::StatusToError(absl::FailedPreconditionError("asked to fail"));
        },
        [](hang_atom) -> int64_t {
          for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        },
    };
  });
  rt::RuntimeOptions ro;
  ro.log_events = false;
  auto runtime = rt::Runtime::Create(std::move(registry), ro);
  if (!runtime.ok()) return 1;
  if (!(*runtime)->SpawnNamed("echo-1", "echo").ok()) return 1;
  rt::DirectServerOptions o;
  o.run_inline = run_inline;
  o.max_frame_bytes = 4096;
  auto server = rt::DirectServer::Start(**runtime, o);
  if (!server.ok()) {
    std::fprintf(stderr, "direct_app: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  // The test reads the port line from stdout, then closes its end of that pipe, and may call at
  // once: stdout must point at stderr before the line goes out, or a call that makes CAF print
  // (an unexpected message) could write to the closed pipe and kill this process with SIGPIPE.
  const int port_out = dup(1);
  dup2(2, 1);
  dprintf(port_out, "port=%u\n", (*server)->port());
  close(port_out);
  char buf[64];
  while (read(0, buf, sizeof(buf)) > 0) {
  }
  std::fflush(nullptr);
  _exit(0);  // an actor may be hung on purpose: do not wait for it
}
