// bench_remote_caf: the peer — raw CAF 0.17 remote actors. The server publishes an echo actor
// with the middleman; the client gets it with remote_actor() and makes blocking requests from a
// scoped_actor. CAF options pass through (`--scheduler.policy=sharing`, `--middleman.workers=0`,
// ...) after the mode arguments, so the script can run CAF's defaults and its best settings.
#include <unistd.h>

#include <cstring>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "remote_common.h"

namespace {

caf::behavior Echo() {
  return {[](int64_t x) { return x; }};
}

// CAF options are the arguments after the mode ones; CAF's own parser reads them.
void Configure(caf::actor_system_config& cfg, int argc, char** argv, int first) {
  cfg.load<caf::io::middleman>();
  cfg.set("logger.verbosity", caf::atom("quiet"));
  std::vector<std::string> args(argv + first, argv + argc);
  cfg.parse(args);
}

int Server(int argc, char** argv) {
  bench_remote::StartContextSwitchReporter();
  caf::actor_system_config cfg;
  Configure(cfg, argc, argv, 2);
  caf::actor_system sys{cfg};
  auto echo = sys.spawn(Echo);
  auto port = sys.middleman().publish(echo, 0, "127.0.0.1");
  if (!port) {
    std::fprintf(stderr, "publish: %s\n", sys.render(port.error()).c_str());
    return 1;
  }
  bench_remote::PrintPort(*port);
  for (;;) pause();
}

int Client(int argc, char** argv) {
  int port = std::atoi(argv[2]);
  double seconds = argc > 3 && argv[3][0] != '-' ? std::atof(argv[3]) : 1.5;
  caf::actor_system_config cfg;
  Configure(cfg, argc, argv, argc > 3 && argv[3][0] != '-' ? 4 : 3);
  caf::actor_system sys{cfg};
  auto echo = sys.middleman().remote_actor("127.0.0.1", static_cast<uint16_t>(port));
  if (!echo) {
    std::fprintf(stderr, "remote_actor: %s\n", sys.render(echo.error()).c_str());
    return 1;
  }
  int rc;
  {
    caf::scoped_actor self{sys};
    auto stats = bench_remote::Measure(
        [&](int64_t x) {
          bool ok = false;
          self->request(*echo, caf::infinite, x)
              .receive([&](int64_t y) { ok = y == x; }, [&](caf::error&) { ok = false; });
          return ok;
        },
        seconds);
    rc = bench_remote::Print(stats);
  }
  std::fflush(nullptr);
  _exit(rc);  // the server does not expect a clean goodbye
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "server") == 0) return Server(argc, argv);
  if (argc >= 3 && std::strcmp(argv[1], "client") == 0) return Client(argc, argv);
  return bench_remote::Usage(argv[0]);
}
