// The head, worker and up roles, and what all roles share. The node agent is in node.cc.
#include "internal/roles.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "internal/cluster_protocol.h"
#include "internal/context.h"
#include "internal/head.h"
#include "internal/heartbeat.h"
#include "internal/mesh.h"
#include "internal/ops_http.h"
#include "internal/process.h"
#include "internal/spawn.h"
#include "internal/tls.h"
#include "nlohmann/json.hpp"
#include "troupe/base/crash_point.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/direct.h"
#include "troupe/runtime/log.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime {

absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& text) {
  size_t colon = text.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(text.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--head: expected HOST:PORT (e.g. 127.0.0.1:7000), got '", text, "'"));
  }
  return std::make_pair(text.substr(0, colon), static_cast<uint16_t>(port));
}

namespace internal {

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

absl::StatusOr<std::string> AddressTowards(const std::string& head_addr) {
  TROUPE_ASSIGN_OR_RETURN(auto hp, ParseHostPort(head_addr));
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(hp.first.c_str(), std::to_string(hp.second).c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--head: cannot resolve '", hp.first, "': ", gai_strerror(rc)));
  }
  // A UDP socket's connect sends nothing; it only picks the route and the source address.
  std::string address;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
    address = text;
  }
  const int err = errno;
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  if (address.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no route to the head at ", head_addr, ": ", std::strerror(err)));
  }
  return address;
}

void BlockRoleSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

HeartbeatSender::HeartbeatSender(Runtime& runtime, caf::actor head, std::string id,
                                 Duration interval)
    : head_(std::move(head)) {
  auto ctx = runtime.internal_context();
  thread_ = std::thread([this, ctx, id, interval] {
    // The floor: a handler shorter than one interval is never reported (internal/heartbeat.h).
    HeartbeatDiff diff(std::chrono::duration_cast<std::chrono::nanoseconds>(interval).count());
    bool full = true;  // the first beat
    while (!stop_.load()) {
      std::vector<ActorSample> now;
      for (const auto& s : ctx->Tracked()) {
        now.push_back(ActorSample{s->name, s->generation, s->progress.load(),
                                  s->busy_since_ns.load(std::memory_order_relaxed)});
      }
      caf::actor head;
      {
        std::lock_guard<std::mutex> l(mu_);
        head = head_;
        full |= std::exchange(new_head_, false);
      }
      full |= ctx->TakeFullHeartbeatRequest();
      HeartbeatMessage m =
          diff.Next(now, std::chrono::steady_clock::now().time_since_epoch().count(),
                    std::exchange(full, false));
      caf::anon_send(head, heartbeat_atom::value, id, m.base, m.version, std::move(m.changes));
      std::this_thread::sleep_for(interval);
    }
  });
}

absl::StatusOr<ClusterMember> StartMember(const std::string& head_addr, RuntimeOptions options,
                                          ActorRegistry registry, Duration join_timeout) {
  TROUPE_ASSIGN_OR_RETURN(auto hp, ParseHostPort(head_addr));
  options.network = true;
  ClusterMember m;
  TROUPE_ASSIGN_OR_RETURN(m.runtime, Runtime::Create(std::move(registry), options));
  absl::StatusOr<caf::actor> head = Connect(*m.runtime, hp.first, hp.second, join_timeout);
  if (!head.ok()) return absl::UnavailableError(head.status().message());
  m.head = *head;
  m.runtime->internal_context()->SetHead(m.head);
  return m;
}

absl::StatusOr<uint64_t> JoinCluster(caf::actor_system& sys, const caf::actor& head,
                                     const ClusterOptions& options, const std::string& kind,
                                     const std::string& name, const caf::message& registration) {
  caf::scoped_actor self{sys};
  absl::Status status;
  self->request(head, std::chrono::seconds(10), cluster_hello_atom::value, kClusterProtocolVersion,
                options.EffectiveBuildId(), kind, name)
      .receive([](uint32_t) {}, [&](caf::error& e) { status = ErrorToStatus(e, "head"); });
  TROUPE_RETURN_IF_ERROR(status);
  uint64_t generation = 0;
  self->request(head, std::chrono::seconds(10), registration)
      .receive([&](uint64_t g) { generation = g; },
               [&](caf::error& e) { status = ErrorToStatus(e, "head"); });
  TROUPE_RETURN_IF_ERROR(status);
  return generation;
}

void ExitRole(const std::string& role, const std::string& name, const absl::Status& status) {
  Log(status.code() == absl::StatusCode::kUnavailable ? LogLevel::kWarn : LogLevel::kError,
      name.empty() ? role : absl::StrCat(role, " ", name), status.ToString());
  std::fflush(nullptr);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      _exit(2);
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      _exit(3);
    default:
      _exit(1);
  }
}

void HeartbeatSender::SetHead(caf::actor head) {
  std::lock_guard<std::mutex> l(mu_);
  head_ = std::move(head);
  new_head_ = true;  // it knows nothing of this process's deltas
}

absl::StatusOr<caf::actor> RejoinHead(Runtime& runtime, const std::string& head_addr,
                                      const ClusterOptions& options, const std::string& kind,
                                      const std::string& name, const caf::message& registration) {
  TROUPE_ASSIGN_OR_RETURN(auto hp, ParseHostPort(head_addr));
  const auto deadline = std::chrono::steady_clock::now() + options.head_grace;
  absl::Status last = absl::UnavailableError("nothing answered");
  while (std::chrono::steady_clock::now() < deadline) {
    absl::StatusOr<caf::actor> head =
        Connect(runtime, hp.first, hp.second, std::chrono::milliseconds(200));
    if (head.ok()) {
      absl::StatusOr<uint64_t> joined =
          JoinCluster(runtime.system(), *head, options, kind, name, registration);
      if (joined.ok()) {
        runtime.internal_context()->SetHead(*head);
        return *head;
      }
      last = joined.status();
      // Another build or protocol, or a duplicate: no retry makes it join.
      if (last.code() == absl::StatusCode::kAlreadyExists) return last;
    } else {
      last = head.status();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::UnavailableError(
      absl::StrCat("lost the head at ", head_addr, " and no head took over within head_grace (",
                   FormatDuration(options.head_grace), "); last: ", last.message()));
}

HeartbeatSender::~HeartbeatSender() {
  stop_ = true;
  thread_.join();
}

namespace {

// Waits for SIGTERM or SIGINT (blocked beforehand with BlockRoleSignals).
int WaitForStopSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

caf::behavior WorkerBehavior(caf::event_based_actor* self, std::shared_ptr<Context> ctx) {
  return {
      [self, ctx](spawn_atom, const std::string& type, const caf::message& args,
                  const std::string& name, uint64_t gen) -> caf::result<caf::actor> {
        base::CrashPoint("worker.spawn");
        auto h = SpawnChild(self->system(), nullptr, ChildSpec::Actor(name, type, args), gen, ctx);
        if (!h.ok()) return StatusToError(h.status());
        ctx->Own(*h);
        return *h;
      },
      [ctx](heartbeat_sync_atom) { ctx->RequestFullHeartbeat(); },
  };
}

// The head's own flags, beside the runtime's and the cluster's.
struct HeadFlags {
  int64_t port = 0;
  std::string host = "127.0.0.1", port_file;
  int64_t http_port = 0;
  std::string http_port_file;
  std::string store_path;
  Duration leader_ttl = std::chrono::seconds(5);

  void Register(ConfigRegistry& config) {
    config.AddInt("port", &port, "port to listen on (0: ephemeral, reported)", InRange(0, 65535));
    config.AddString("host", &host, "address to listen on");
    config.AddString("port_file", &port_file, "write the port chosen here (for scripts and tests)");
    config.AddInt("http_port", &http_port,
                  "port of the dashboard, the JSON API and /metrics, on --host (0: ephemeral, "
                  "reported; -1: none); HTTPS with client certificates when TLS is on",
                  InRange(-1, 65535));
    config.AddString("http_port_file", &http_port_file, "write the HTTP port chosen here");
    config.AddString("store", &store_path,
                     "the head's durable state: a SQLite file, or etcd://HOST:PORT[/PREFIX] (heads "
                     "on several machines: one leads, the others stand by); a head that takes over "
                     "goes on from it, under a new epoch that fences the old one; \"\": none");
    config.AddDuration("leader_ttl", &leader_ttl,
                       "etcd store: a leading head that stops renewing its lease for this long is "
                       "replaced by a standby",
                       Positive());
  }
};

// --store etcd://`etcd`: 0, or the exit status after logging why not.
int OpenEtcdStore(const HeadFlags& f, absl::string_view etcd, std::shared_ptr<HeadStore>* store) {
  EtcdStoreOptions eo;
  const size_t slash = etcd.find('/');
  eo.endpoint = absl::StrCat("http://", etcd.substr(0, slash));
  if (slash != absl::string_view::npos) eo.prefix = std::string(etcd.substr(slash));
  eo.address = absl::StrCat(f.host, ":", f.port);
  eo.leader_ttl = f.leader_ttl;
  eo.on_lost = [](const absl::Status& why) {
    std::cerr << "troupe head: no longer the leader: " << why.message() << "; stopping"
              << std::endl;
    std::fflush(nullptr);
    _exit(3);
  };
  auto opened = OpenEtcdHeadStore(eo);
  if (!opened.ok()) {
    LogError("head", std::string(opened.status().message()));
    return opened.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  *store = std::move(*opened);
  PrintLine(absl::StrCat("troupe head: leading ", f.store_path, ", epoch ", (*store)->epoch()));
  return 0;
}

// The store --store names (none for ""): 0, or the exit status after logging why not.
int OpenStore(const HeadFlags& f, std::shared_ptr<HeadStore>* store) {
  if (absl::string_view etcd = f.store_path; absl::ConsumePrefix(&etcd, "etcd://")) {
    return OpenEtcdStore(f, etcd, store);
  }
  if (f.store_path.empty()) return 0;
  auto opened = OpenSqliteHeadStore(f.store_path);
  if (!opened.ok()) {
    LogError("head", std::string(opened.status().message()));
    return 2;
  }
  *store = std::move(*opened);
  PrintLine(absl::StrCat("troupe head: store ", f.store_path, ", epoch ", (*store)->epoch()));
  return 0;
}

// Writes `port` to `file` (nothing for ""), through a rename so a reader never sees it
// half-written.
void WritePortFile(const std::string& file, int port) {
  if (file.empty()) return;
  std::string tmp = file + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), file.c_str());
}

}  // namespace

int HeadMain(const std::vector<std::string>& args, ActorRegistry registry) {
  RuntimeOptions ro;
  ClusterOptions co;
  HeadFlags flags;
  ConfigRegistry config;
  ro.Register(config);
  co.Register(config);
  flags.Register(config);
  if (int rc =
          ParseCommandLine("head", "usage: troupe head [--port P] [--host ADDR]", args, config);
      rc >= 0)
    return rc;
  BlockRoleSignals();
  ro.network = true;
  auto rt = Runtime::Create(std::move(registry), ro);
  if (!rt.ok()) {
    LogError("head", std::string(rt.status().message()));
    return 2;
  }
  std::shared_ptr<HeadStore> store;
  if (int rc = OpenStore(flags, &store); rc != 0) return rc;
  const std::string& host = flags.host;
  caf::actor head = SpawnHead((*rt)->system(), co, co.EffectiveBuildId(), store);
  // A head that cannot serve stops its actor and exits at once: returning would wait for that
  // actor forever (the actor system's destructor), holding its store and its other port.
  auto fail = [&head](const absl::Status& s) {
    LogError("head", std::string(s.message()));
    caf::anon_send_exit(head, caf::exit_reason::user_shutdown);
    std::fflush(nullptr);
    _exit(1);
  };
  auto bound = Publish(**rt, head, static_cast<uint16_t>(flags.port), host);
  if (!bound.ok()) fail(bound.status());
  PrintLine(absl::StrCat(
      "troupe head: listening on ", host, ":", *bound,
      ro.tls() ? " (mutual TLS)"
               : " (plain TCP without TLS: for loopback and trusted local networks only)",
      " build_id=", co.EffectiveBuildId()));
  std::unique_ptr<OpsHttp> http;
  if (flags.http_port >= 0) {
    auto started =
        OpsHttp::Start((*rt)->system(), head, host, static_cast<int>(flags.http_port), ro);
    if (!started.ok()) fail(started.status());
    http = std::move(*started);
    PrintLine(absl::StrCat("troupe head: dashboard, JSON API and /metrics at ",
                           ro.tls() ? "https" : "http", "://", host, ":", http->port(), "/"));
  }
  if (http) WritePortFile(flags.http_port_file, http->port());
  WritePortFile(flags.port_file, *bound);
  int sig = WaitForStopSignal();
  PrintLine(absl::StrCat("troupe head: stopping on signal ", sig));
  {  // the membership changes not yet written (group commit, head.cc) go to the store first
    caf::scoped_actor self{(*rt)->system()};
    self->request(head, std::chrono::seconds(5), store_flush_atom::value, true)
        .receive([](bool) {}, [](caf::error&) {});
  }
  caf::anon_send_exit(head, caf::exit_reason::user_shutdown);
  std::fflush(nullptr);
  _exit(0);  // workers and nodes notice the lost connection; nothing here must be awaited
}

int WorkerMain(const std::vector<std::string>& args, ActorRegistry registry) {
  RuntimeOptions ro;
  ClusterOptions co;
  std::string head_addr, node, id, address = "127.0.0.1";
  ConfigRegistry config;
  ro.Register(config);
  co.Register(config);
  config.AddString("head", &head_addr, "head address HOST:PORT");
  config.AddString("node", &node, "the node agent this worker belongs to");
  config.AddString("id", &id, "this worker's id");
  config.AddString("address", &address,
                   "where the cluster's other processes reach this worker (its node's address)");
  if (int rc = ParseCommandLine("worker", "usage: troupe worker (started by a node agent)", args,
                                config);
      rc >= 0)
    return rc;
  auto m = StartMember(head_addr, ro, std::move(registry), co.join_timeout);
  if (!m.ok()) ExitRole("worker", id, m.status());
  auto& sys = m->runtime->system();
  caf::actor worker = sys.spawn(WorkerBehavior, m->runtime->internal_context());
  // The cluster's other processes connect here directly (internal/mesh.h).
  absl::StatusOr<uint16_t> port = Publish(*m->runtime, worker, 0, address);
  if (!port.ok()) ExitRole("worker", id, port.status());
  // Runtime::Call reaches this worker's actors here (ActorRef::direct), over mutual TLS when the
  // cluster has it.
  DirectServerOptions direct_options;
  direct_options.host = address;
  auto direct = DirectServer::Start(*m->runtime, direct_options);
  if (!direct.ok()) ExitRole("worker", id, direct.status());
  const caf::message registration =
      caf::make_message(reg_worker_atom::value, id, node, static_cast<int64_t>(getpid()), worker,
                        static_cast<int32_t>(*port), static_cast<int32_t>((*direct)->port()));
  auto joined = JoinCluster(sys, m->head, co, "worker", id, registration);
  if (!joined.ok()) ExitRole("worker", id, joined.status());
  LogInfo(absl::StrCat("worker ", id), absl::StrCat("joined, pid ", getpid()));
  StartMesh(*m->runtime, m->head, id);  // connects on use only (Actor::ConnectTo)
  HeartbeatSender heartbeats(*m->runtime, m->head, id, co.heartbeat_interval);
  caf::scoped_actor self{sys};
  caf::actor head = m->head;
  while (true) {
    self->monitor(head);
    self->receive([](caf::down_msg&) {});
    // The head is gone: this worker's actors go on while it joins the head that takes over.
    LogWarn(absl::StrCat("worker ", id),
            absl::StrCat("lost the head; rejoining within ", FormatDuration(co.head_grace)));
    absl::StatusOr<caf::actor> again =
        RejoinHead(*m->runtime, head_addr, co, "worker", id, registration);
    if (!again.ok()) ExitRole("worker", id, again.status());
    head = *again;
    heartbeats.SetHead(head);
    StartMesh(*m->runtime, head, id);
    for (const ActorRef& r : m->runtime->internal_context()->Directory()) {
      caf::anon_send(head, reg_actor_atom::value, id, r.name, r.generation, r.handle);
    }
    LogInfo(absl::StrCat("worker ", id), "rejoined the head");
  }
}

int UpMain(const std::vector<std::string>& args) {
  RuntimeOptions ro;
  ClusterOptions co;
  int64_t workers = 2;
  ConfigRegistry config;
  ro.Register(config);
  co.Register(config);
  config.AddInt("workers", &workers, "worker processes on this machine", InRange(0, 256));
  if (int rc = ParseCommandLine("up",
                                "usage: troupe up [--workers N]\n"
                                "Starts a head, a node agent and N worker processes on this "
                                "machine; Ctrl-C (or SIGTERM) tears them down.",
                                args, config);
      rc >= 0)
    return rc;
  BlockRoleSignals();
  LocalCluster::Options o;
  o.workers = static_cast<int>(workers);
  o.cluster = co;
  o.extra_args = ro.TlsArgs();  // every member presents the same certificate
  auto cluster = LocalCluster::Start(o);
  if (!cluster.ok()) {
    LogError("up", std::string(cluster.status().message()));
    return 1;
  }
  PrintLine(absl::StrCat("troupe up: head at 127.0.0.1:", (*cluster)->port(), " (pid ",
                         (*cluster)->head_pid(), ", ", ro.tls() ? "mutual TLS" : "plain TCP",
                         "), node 'local' with ", workers, " workers; logs in ", co.log_dir,
                         "; dashboard at ", ro.tls() ? "https" : "http",
                         "://127.0.0.1:", (*cluster)->http_port(), "/; Ctrl-C to stop"));
  WaitForStopSignal();
  PrintLine("troupe up: tearing down");
  cluster->reset();
  return 0;
}

namespace {

// `troupe status`: a line per node, worker, placement group and job, each `kind name state`
// then key=value fields (a value with spaces quoted), for people and for grep alike.
std::string FormatStatus(const nlohmann::json& cluster, const nlohmann::json& jobs) {
  auto quote = [](const std::string& v) {
    return v.empty()                          ? std::string("-")
           : v.find(' ') == std::string::npos ? v
                                              : absl::StrCat("\"", v, "\"");
  };
  auto join = [](const nlohmann::json& list) {
    std::vector<std::string> items;
    for (const auto& i : list) items.push_back(i.get<std::string>());
    return items.empty() ? std::string("-") : absl::StrJoin(items, ",");
  };
  std::string out;
  for (const auto& n : cluster["nodes"]) {
    absl::StrAppend(&out, "node ", n["name"].get<std::string>(), " ", n["state"].get<std::string>(),
                    " address=", quote(n["address"]), " host=", quote(n["host"]));
    for (const auto& [r, total] : n["resources"].items()) {
      absl::StrAppend(&out, " ", r, "=", n["used"].value(r, 0.0), "/", total.get<double>());
    }
    std::vector<std::string> labels;
    for (const auto& [k, v] : n["labels"].items()) labels.push_back(k + "=" + v.get<std::string>());
    absl::StrAppend(&out, " labels=", labels.empty() ? "-" : absl::StrJoin(labels, ","),
                    " spot=", n["spot"].get<bool>() ? "true" : "false", "\n");
    for (const auto& w : n["workers"]) {
      absl::StrAppend(&out, "  worker ", w["id"].get<std::string>(), " ",
                      w["state"].get<std::string>(), " pid=", w["pid"].get<int64_t>(),
                      " actors=", join(w["actors"]), "\n");
    }
  }
  for (const auto& g : cluster["placement_groups"]) {
    absl::StrAppend(&out, "placement_group ", g["name"].get<std::string>(),
                    " nodes=", join(g["bundles"]), "\n");
  }
  for (const auto& j : jobs["jobs"]) {
    absl::StrAppend(&out, "job ", j["id"].get<std::string>(), " ", j["state"].get<std::string>(),
                    " name=", quote(j["name"]), " step=", j["step"].get<int64_t>(), "/",
                    j["steps"].get<int64_t>(),
                    absl::StrFormat(" loss=%.4f tokens_per_s=%.0f", j["loss"].get<double>(),
                                    j["tokens_per_s"].get<double>()),
                    " world=", j["world"].get<int64_t>(),
                    " generation=", j["generation"].get<int64_t>(),
                    " steps_lost=", j["steps_lost"].get<int64_t>(), " node=", quote(j["node"]),
                    " last_event=", quote(j["last_event"]), "\n");
  }
  return out;
}

}  // namespace

int StatusMain(const std::vector<std::string>& args) {
  RuntimeOptions ro;
  std::string head_addr;
  int64_t wait_workers = 0;
  Duration timeout = std::chrono::seconds(60);
  ConfigRegistry config;
  ro.Register(config);
  config.AddString("head", &head_addr, "head address HOST:PORT");
  config.AddInt("wait_workers", &wait_workers, "first wait until this many workers are alive",
                InRange(0, 1 << 20));
  config.AddDuration("timeout", &timeout, "how long --wait_workers waits", Positive());
  if (int rc = ParseCommandLine("status",
                                "usage: troupe status --head HOST:P [--wait_workers N]\n"
                                "Prints the cluster: a line per node (state, address, resources "
                                "used/total, labels, spot), worker (pid, actors), placement group "
                                "and job (state, step, loss, tokens/s, world, generation, last "
                                "event).",
                                args, config);
      rc >= 0)
    return rc;
  auto hp = ParseHostPort(head_addr);
  if (!hp.ok()) {
    LogError("status", std::string(hp.status().message()));
    return 2;
  }
  ro.network = true;
  auto rt = Runtime::Create(ActorRegistry{}, ro);
  if (!rt.ok()) {
    LogError("status", std::string(rt.status().message()));
    return 2;
  }
  auto client = ClusterClient::Connect(**rt, hp->first, hp->second, std::chrono::seconds(10),
                                       wait_workers > 0 ? timeout : Duration{});
  if (!client.ok()) {
    LogError("status", std::string(client.status().message()));
    return 1;
  }
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto members = client->Members();
    if (!members.ok()) {
      LogError("status", std::string(members.status().message()));
      return 1;
    }
    int64_t alive = 0;
    for (const MemberInfo& m : *members) {
      alive += m.kind == MemberKind::kWorker && m.state == MemberState::kAlive;
    }
    if (alive >= wait_workers) {
      auto cluster = client->View("cluster");
      auto jobs = cluster.ok() ? client->View("jobs") : cluster;
      if (!jobs.ok()) {
        LogError("status", std::string(jobs.status().message()));
        return 1;
      }
      std::cout << FormatStatus(nlohmann::json::parse(*cluster), nlohmann::json::parse(*jobs))
                << std::flush;
      return 0;
    }
    if (std::chrono::steady_clock::now() > until) {
      LogError("status", absl::StrCat(alive, " of ", wait_workers, " workers alive after ",
                                      FormatDuration(timeout)));
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

int CertsMain(const std::vector<std::string>& args) {
  std::string dir, members = "head,node", ca_dir;
  ConfigRegistry config;
  config.AddString("dir", &dir, "where to write ca.pem, ca.key and <member>.{pem,key}");
  config.AddString("ca", &ca_dir,
                   "issue the certificates with the CA in this directory (ca.pem, ca.key) "
                   "instead of a new one; its key is not copied");
  config.AddString("members", &members,
                   "comma-separated members, NAME or NAME=ADDR[+ADDR...] (the addresses others "
                   "dial it at; none: loopback)");
  if (int rc = ParseCommandLine(
          "certs",
          "usage: troupe certs --dir DIR [--members head=10.0.0.1,node-a=10.0.0.2,...]\n"
          "Creates a cluster CA and a certificate per member, for "
          "--tls_ca/--tls_cert/--tls_key.",
          args, config);
      rc >= 0)
    return rc;
  if (dir.empty()) {
    LogError("certs", "--dir is required");
    return 2;
  }
  std::vector<std::string> names = absl::StrSplit(members, ',', absl::SkipEmpty());
  if (absl::Status s = GenerateClusterCertificates(dir, names, ca_dir); !s.ok()) {
    LogError("certs", std::string(s.message()));
    return 1;
  }
  PrintLine(absl::StrCat("troupe certs: wrote ", dir, "/ca.pem and certificates for ", members,
                         ca_dir.empty() ? "" : " issued by the CA in " + ca_dir));
  return 0;
}

}  // namespace internal

int RunMain(int argc, char** argv, ActorRegistry registry) {
  if (argc < 2) return -1;
  std::string role = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (role == "head") return internal::HeadMain(args, std::move(registry));
  if (role == "node") return internal::NodeMain(args, std::move(registry));
  if (role == "worker") return internal::WorkerMain(args, std::move(registry));
  if (role == "up") return internal::UpMain(args);
  if (role == "certs") return internal::CertsMain(args);
  if (role == "status") return internal::StatusMain(args);
  if (role == "relay") return internal::RelayMain(args);
  return -1;
}

}  // namespace troupe::runtime
