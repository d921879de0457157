// bench_remote_troupe: troupe, two ways.
//   server | client PORT [SECONDS]: the server is a troupe Runtime (middleman loaded, as in a
//     worker) hosting a named echo actor, served by a DirectServer; the client calls it through
//     a DirectClient from its own thread (the direct channel alone).
//   cluster [SECONDS] [--tls] [--caf]: the path a user takes — a LocalCluster with one worker
//     (this program is its head, node agent and worker), an echo actor spawned through
//     ClusterClient::Spawn, called through its ActorRef with Runtime::Call. --tls: every role and
//     this driver given certificates from GenerateClusterCertificates, as `troupe certs` makes
//     them; --caf: the ActorRef's handle asked with a CAF request from a scoped_actor instead.
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "caf/all.hpp"
#include "remote_common.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/direct.h"
#include "troupe/runtime/runtime.h"

namespace rt = troupe::runtime;

namespace {

rt::ActorRegistry EchoRegistry() {
  rt::ActorRegistry registry;
  (void)registry.Register<>("echo",
                            [](rt::Actor*) { return caf::behavior{[](int64_t x) { return x; }}; });
  return registry;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  std::fflush(nullptr);
  _exit(1);
}

int Server(bool run_inline) {
  bench_remote::StartContextSwitchReporter();
  rt::ActorRegistry registry = EchoRegistry();
  rt::RuntimeOptions ro;
  ro.network = true;
  ro.log_events = false;
  auto runtime = rt::Runtime::Create(std::move(registry), ro);
  if (!runtime.ok()) return Fail(runtime.status());
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

int Cluster(double seconds, bool tls, bool through_caf) {
  rt::RuntimeOptions ro;
  ro.network = true;
  ro.log_events = false;
  rt::LocalCluster::Options o;
  o.workers = 1;
  char dir[] =
      "/tmp/troupe-bench-certs-XXXXXX";  // with --tls: the certificates, removed at the end
  if (tls) {
    if (mkdtemp(dir) == nullptr) return Fail(absl::InternalError("mkdtemp"));
    if (absl::Status s = rt::GenerateClusterCertificates(dir, {"member"}); !s.ok()) return Fail(s);
    ro.tls_ca = std::string(dir) + "/ca.pem";
    ro.tls_cert = std::string(dir) + "/member.pem";
    ro.tls_key = std::string(dir) + "/member.key";
    o.extra_args = ro.TlsArgs();
  }
  auto runtime = rt::Runtime::Create(EchoRegistry(), ro);
  if (!runtime.ok()) return Fail(runtime.status());
  auto cluster = rt::LocalCluster::Start(o);
  if (!cluster.ok()) return Fail(cluster.status());
  auto client = rt::ClusterClient::Connect(**runtime, "127.0.0.1", (*cluster)->port(),
                                           std::chrono::seconds(10), std::chrono::seconds(10));
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<rt::ActorRef> ref = absl::UnavailableError("no worker yet");
  for (int i = 0; i < 100 && !ref.ok(); ++i) {
    ref = client->Spawn("echo", caf::make_message(), "echo-1");
    if (!ref.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!ref.ok()) return Fail(ref.status());
  caf::scoped_actor self{(*runtime)->system()};
  auto stats = bench_remote::Measure(
      [&](int64_t x) {
        if (through_caf) {
          bool ok = false;
          self->request(ref->handle, std::chrono::seconds(5), x)
              .receive([&](int64_t y) { ok = y == x; }, [&](caf::error&) {});
          return ok;
        }
        auto reply = (*runtime)->Call(*ref, caf::make_message(x));
        return reply.ok() && reply->match_elements<int64_t>() && reply->get_as<int64_t>(0) == x;
      },
      seconds);
  if (tls) std::filesystem::remove_all(dir);  // every process has read them by now
  int rc = bench_remote::Print(stats);
  std::fflush(nullptr);
  cluster->reset();  // its processes and its directory (of /tmp/troupe-cluster-*) go
  _exit(rc);
}

}  // namespace

int main(int argc, char** argv) {
  if (int rc = rt::RunMain(argc, argv, EchoRegistry()); rc >= 0) return rc;
  if (argc >= 2 && std::strcmp(argv[1], "cluster") == 0) {
    double seconds = 1.5;
    bool tls = false, through_caf = false;
    for (int i = 2; i < argc; ++i) {
      if (std::strcmp(argv[i], "--tls") == 0) {
        tls = true;
      } else if (std::strcmp(argv[i], "--caf") == 0) {
        through_caf = true;
      } else {
        seconds = std::atof(argv[i]);
      }
    }
    return Cluster(seconds, tls, through_caf);
  }
  if (argc >= 2 && std::strcmp(argv[1], "server") == 0)
    return Server(!(argc > 2 && std::strcmp(argv[2], "--no-inline") == 0));
  if (argc >= 3 && std::strcmp(argv[1], "client") == 0)
    return Client(std::atoi(argv[2]), argc > 3 ? std::atof(argv[3]) : 1.5);
  return bench_remote::Usage(argv[0]);
}
