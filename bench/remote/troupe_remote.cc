// bench_remote_troupe: troupe — the server is a troupe Runtime (middleman loaded, as in a
// worker) hosting a named echo actor, served by a DirectServer; the client calls it through a
// DirectClient from its own thread.
#include <unistd.h>

#include <cstring>

#include "caf/all.hpp"
#include "remote_common.h"
#include "troupe/runtime/direct.h"
#include "troupe/runtime/runtime.h"

namespace rt = troupe::runtime;

namespace {

int Server(bool run_inline) {
  bench_remote::StartContextSwitchReporter();
  rt::ActorRegistry registry;
  (void)registry.Register<>("echo",
                            [](rt::Actor*) { return caf::behavior{[](int64_t x) { return x; }}; });
  rt::RuntimeOptions ro;
  ro.network = true;
  ro.log_events = false;
  auto runtime = rt::Runtime::Create(std::move(registry), ro);
  if (!runtime.ok()) {
    std::fprintf(stderr, "%s\n", std::string(runtime.status().message()).c_str());
    return 1;
  }
  if (auto ref = (*runtime)->SpawnNamed("echo-1", "echo"); !ref.ok()) return 1;
  rt::DirectServerOptions o;
  o.run_inline = run_inline;
  auto server = rt::DirectServer::Start(**runtime, o);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  bench_remote::PrintPort((*server)->port());
  for (;;) pause();
}

int Client(int port, double seconds) {
  rt::RuntimeOptions ro;
  ro.threads = 1;
  ro.log_events = false;
  auto runtime = rt::Runtime::Create(rt::ActorRegistry{}, ro);
  if (!runtime.ok()) return 1;
  auto client =
      rt::DirectClient::Connect(**runtime, "127.0.0.1", static_cast<uint16_t>(port), "echo-1");
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  auto stats = bench_remote::Measure(
      [&](int64_t x) {
        auto reply = (*client)->Call(caf::make_message(x));
        return reply.ok() && reply->match_elements<int64_t>() && reply->get_as<int64_t>(0) == x;
      },
      seconds);
  int rc = bench_remote::Print(stats);
  std::fflush(nullptr);
  _exit(rc);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "server") == 0)
    return Server(!(argc > 2 && std::strcmp(argv[2], "--no-inline") == 0));
  if (argc >= 3 && std::strcmp(argv[1], "client") == 0)
    return Client(std::atoi(argv[2]), argc > 3 ? std::atof(argv[3]) : 1.5);
  return bench_remote::Usage(argv[0]);
}
