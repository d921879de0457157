// bench_scale: the control plane at a size this machine cannot hold as processes (bench/scale).
//
//   bench_scale plan [RANKS]     CoordinatorCore planning a generation of RANKS ranks, and the
//                                generation after 1, 8 or 64 of them die at once (state from
//                                the survivors' mirrors); the ordered reduce-scatter's combine
//                                plan; a 1B-parameter model's checkpoint manifest over RANKS:
//                                plan_generation_ms=… plan_restore_ms=… (the most of the three)
//   bench_scale cluster TROUPE sqlite|etcd NODES WORKERS_PER_NODE PROCS
//                                a real head (TROUPE head on a SQLite store, or on etcd with a
//                                standby head; 1 s heartbeats, 3 s timeout) and NODES node agents
//                                with WORKERS_PER_NODE workers each, simulated in PROCS processes
//                                (sim_cluster.h): join time, the head's CPU at steady state,
//                                death → every process knowing it (exit and silence), spawns/s,
//                                the head's memory, a head failover (SQLite: restarted; etcd: the
//                                standby leads) with every member back.
//   bench_scale sim PORT FIRST NODES WORKERS_PER_NODE   (a child of `cluster`, driven on stdin)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "troupe/collectives/canonical_combine.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/local_etcd.h"
#include "troupe/runtime/runtime.h"
#include "troupe/runtime/sim_cluster.h"
#include "troupe/train/coordinator_core.h"
#include "troupe/train/file_system.h"
#include "troupe/train/manifest.h"
#include "troupe/train/shard_layout.h"

namespace {

using Clock = std::chrono::steady_clock;
int64_t NowNs() { return Clock::now().time_since_epoch().count(); }
double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// ---- plan ----------------------------------------------------------------------------------

// The checkpoint manifest of a 1B-parameter model sharded over `ranks`: its size, and the time
// to encode and write it atomically (temp + fsync + rename) and to read and decode it.
int Manifest(int ranks) {
  namespace tt = troupe::train;
  const int64_t n = 1'000'000'000;
  const tt::ShardLayout layout = tt::ShardLayout::Make(n, ranks);
  tt::CheckpointManifest m;
  m.num_params = n;
  m.step = 1000;
  m.world_size = ranks;
  for (int r = 0; r < ranks && layout.begin(r) < n; ++r) {
    m.shards.push_back({absl::StrFormat("shard-%05d.bin", r), layout.begin(r), layout.end(r),
                        tt::ShardByteSize(layout.begin(r), layout.end(r), true), 0x1234u + r});
  }
  const std::string dir =
      std::filesystem::temp_directory_path() / absl::StrCat("troupe-bench-manifest-", getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/manifest.bin";
  int64_t start = NowNs();
  const std::string bytes = tt::EncodeManifest(m);
  absl::Status w = tt::WriteFileAtomically(tt::PosixFileSystem(), path, bytes);
  const double write_ms = Ms(NowNs() - start);
  start = NowNs();
  auto read = tt::ReadSmallFile(tt::PosixFileSystem(), path, tt::kMaxManifestBytes);
  absl::StatusOr<tt::CheckpointManifest> back =
      read.ok() ? tt::DecodeManifest(*read, path) : read.status();
  const double read_ms = Ms(NowNs() - start);
  std::filesystem::remove_all(dir);
  if (!w.ok() || !back.ok() || !(*back == m)) {
    std::fprintf(stderr, "manifest: %s / %s\n", w.ToString().c_str(),
                 back.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "manifest of a 1B-parameter model over %d ranks: %zu shards, %zu B; encode + "
      "atomic write %.2f ms, read + decode %.2f ms\n",
      ranks, m.shards.size(), bytes.size(), write_ms, read_ms);
  return 0;
}

// A core whose generation of `ranks` ranks committed one step, its workers `per_node` to a node.
struct PlannedCore {
  std::unique_ptr<troupe::train::CoordinatorCore> core;
  double generation_ms = 0;
};

PlannedCore CommittedCore(int ranks, int per_node) {
  using troupe::train::CoordinatorCore;
  CoordinatorCore::Options o;
  o.steps = 10;
  o.max_world = ranks;
  o.microbatches = ranks;
  o.num_params = 19'900'000;  // the 20M GPT
  o.latest_checkpoint = [] { return std::optional<int64_t>(); };
  PlannedCore p{std::make_unique<CoordinatorCore>(o)};
  CoordinatorCore& core = *p.core;
  const auto t0 = Clock::now();
  core.OnMembershipKnown(static_cast<size_t>(ranks), {}, t0);
  auto node = [&](int i) { return absl::StrCat("n", i / per_node); };
  for (int i = 0; i + 1 < ranks; ++i) core.OnJoin(absl::StrCat("w", i), node(i), t0);
  const int64_t start = NowNs();
  core.OnJoin(absl::StrCat("w", ranks - 1), node(ranks - 1), t0);  // plans generation 1
  p.generation_ms = Ms(NowNs() - start);
  for (const std::string& w : core.group()) core.OnConfigured(core.generation(), w, {}, t0);
  for (const std::string& w : core.group()) {
    core.OnStepped(core.generation(), 0, w, {}, {{0, 1.0}}, t0);
  }
  return p;
}

// The coordinator's planning (a generation; a memory restore after 1, 8, 64 ranks die at once,
// a node of that many going down), the ordered reduce-scatter's combine plan, and the checkpoint
// manifest of a 1B-parameter model sharded over `ranks`.
int Plan(int ranks) {
  using troupe::train::CoordinatorAction;
  double generation_ms = 0, restore_max_ms = 0;
  for (int dead : {1, 8, 64}) {
    if (2 * dead > ranks) continue;  // a node of `dead` ranks must leave survivors to restore from
    PlannedCore p = CommittedCore(ranks, dead);
    generation_ms = std::max(generation_ms, p.generation_ms);
    const uint64_t before = p.core->generation();
    const int64_t start = NowNs();
    std::vector<CoordinatorAction> out =
        p.core->OnNodeDead(absl::StrCat("n", ranks / dead / 2), {});
    const double ms = Ms(NowNs() - start);
    std::string source = "?";
    size_t plan_bytes = 0;
    for (const CoordinatorAction& a : out) {
      if (a.kind == CoordinatorAction::Kind::kEvent && a.event.event == "generation") {
        source = a.event.Field("source");
      }
      if (a.kind == CoordinatorAction::Kind::kConfigure) {
        plan_bytes = std::max(plan_bytes, a.plan.gone.size() * sizeof(int) + sizeof(a.plan));
      }
    }
    if (p.core->generation() != before + 1 || source != "mirrors") {
      std::fprintf(stderr, "plan: %d dead of %d: generation %llu, source %s\n", dead, ranks,
                   static_cast<unsigned long long>(p.core->generation()), source.c_str());
      return 1;
    }
    std::printf(
        "plan: %d ranks, %d dead at once: restore from %s planned in %.2f ms (%zu B of "
        "plan per rank)\n",
        ranks, dead, source.c_str(), ms, plan_bytes);
    restore_max_ms = std::max(restore_max_ms, ms);
  }
  // The ordered reduce-scatter's combine plan: one microbatch per rank.
  auto blocks = troupe::train::MicrobatchBlocks(ranks, ranks);
  if (!blocks.ok()) return std::fprintf(stderr, "%s\n", blocks.status().ToString().c_str()), 1;
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  for (const auto& [lo, hi] : *blocks) intervals.emplace_back(lo, hi);
  int64_t start = NowNs();
  auto combine = troupe::collectives::PlanCanonicalCombine(intervals);
  const double combine_ms = Ms(NowNs() - start);
  if (!combine.ok()) return std::fprintf(stderr, "%s\n", combine.status().ToString().c_str()), 1;
  std::printf(
      "ordered reduce-scatter at %d ranks: %zu combine steps (%zu B), %d temporaries, "
      "planned in %.2f ms\n",
      ranks, combine->steps.size(), combine->steps.size() * sizeof(combine->steps[0]),
      combine->inner, combine_ms);
  return Manifest(ranks) != 0 ? 1
                              : (std::printf("plan_generation_ms=%.2f plan_restore_ms=%.2f\n",
                                             generation_ms, restore_max_ms),
                                 0);
}

// ---- sim (child) ---------------------------------------------------------------------------

int Sim(uint16_t port, int first, int nodes, int per_node) {
  troupe::runtime::testing::SimClusterOptions o;
  o.head_port = port;
  o.build_id = "sim";
  o.first_node = first;
  o.nodes = nodes;
  o.workers_per_node = per_node;
  auto c = troupe::runtime::testing::SimCluster::Start(o);
  if (!c.ok()) {
    std::printf("ERROR %s\n", std::string(c.status().message()).c_str());
    return 1;
  }
  std::printf("JOINED %lld %lld\n", static_cast<long long>((*c)->started_ns()),
              static_cast<long long>((*c)->joined_ns()));
  std::fflush(stdout);
  std::string cmd, id;
  while (std::cin >> cmd) {
    if (cmd == "quit") break;
    if (cmd == "exit" || cmd == "quiet" || cmd == "seen") {
      std::cin >> id;
      if (cmd == "exit") std::printf("T %lld\n", static_cast<long long>((*c)->Exit(id)));
      if (cmd == "quiet") std::printf("T %lld\n", static_cast<long long>((*c)->Silence(id)));
      if (cmd == "seen") {
        std::optional<int64_t> t = (*c)->DeathSeen(id);
        std::printf("T %lld\n", static_cast<long long>(t ? *t : -1));
      }
    } else if (cmd == "rejoin") {
      long long since = 0;
      std::cin >> since;
      auto t = (*c)->AwaitRejoined(since, std::chrono::seconds(180));
      if (t.ok()) {
        std::printf("T %lld\n", static_cast<long long>(*t));
      } else {
        std::printf("ERROR %s\n", std::string(t.status().message()).c_str());
      }
    }
    std::fflush(stdout);
  }
  return 0;
}

// ---- cluster (parent) ----------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  FILE* in = nullptr;   // its stdin
  FILE* out = nullptr;  // its stdout
  std::string Ask(const std::string& line) {
    std::fprintf(in, "%s\n", line.c_str());
    std::fflush(in);
    return Read();
  }
  std::string Read() {
    char buf[4096];
    if (std::fgets(buf, sizeof(buf), out) == nullptr) return "ERROR child gone";
    std::string s(buf);
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
};

Child Spawn(const std::vector<std::string>& args) {
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) std::abort();
  Child c;
  c.pid = fork();
  if (c.pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  c.in = fdopen(to[1], "w");
  c.out = fdopen(from[0], "r");
  return c;
}

// A head on `store` (a SQLite file, or etcd://… with a 1 s leader lease: a second one on the same
// port is the standby, and writes its port file only once it leads).
pid_t StartHead(const std::string& troupe, const std::string& dir, uint16_t port,
                const std::string& store) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string log = dir + "/head.log";
    FILE* f = std::fopen(log.c_str(), "a");
    dup2(fileno(f), 1);
    dup2(fileno(f), 2);
    execl(troupe.c_str(), troupe.c_str(), "head", "--port", std::to_string(port).c_str(),
          "--port_file", (dir + "/head.port").c_str(), "--store", store.c_str(),
          "--heartbeat_interval", "1s", "--heartbeat_timeout", "3s", "--leader_ttl", "1s",
          "--build_id", "sim", "--http_port", "-1", "--log_dir", dir.c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

uint16_t WaitPort(const std::string& file) {
  for (int i = 0; i < 3000; ++i) {
    std::ifstream in(file);
    int p = 0;
    if (in >> p && p > 0) return static_cast<uint16_t>(p);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  std::istringstream f(line.substr(line.rfind(')') + 2));
  std::string x;
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    f >> x;
    if (i == 14) utime = std::atoll(x.c_str());
    if (i == 15) stime = std::atoll(x.c_str());
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

long RssMb(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  long kb = 0;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> kb;
      break;
    }
  }
  return kb / 1024;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1,
                    static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

int64_t Field(const std::string& line) {  // "T <ns>"
  return line.rfind("T ", 0) == 0 ? std::atoll(line.c_str() + 2) : -1;
}

// Deaths of `count` workers spread over the children, by `how` ("exit" or "quiet"): for each,
// milliseconds from the death to the last child's subscriber hearing of it.
std::vector<double> Deaths(std::vector<Child>& kids, int per_child_nodes, int worker, int count,
                           const std::string& how, int first_victim, double wait_s) {
  std::vector<double> out;
  for (int k = 0; k < count; ++k) {
    Child& victim_kid = kids[k % kids.size()];
    const int node =
        static_cast<int>(k % kids.size()) * per_child_nodes + (first_victim + k) % per_child_nodes;
    const std::string id = absl::StrCat("s", node, "/w", worker);
    const int64_t t = Field(victim_kid.Ask(how + " " + id));
    int64_t last = -1;
    const auto deadline = Clock::now() + std::chrono::duration<double>(wait_s);
    for (Child& c : kids) {
      int64_t seen = -1;
      while (seen < 0 && Clock::now() < deadline) {
        seen = Field(c.Ask("seen " + id));
        if (seen < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (seen < 0) {
        last = -1;
        break;
      }
      last = std::max(last, seen);
    }
    out.push_back(last < 0 ? 1e9 : Ms(last - t));
    if (std::getenv("BENCH_SCALE_VERBOSE"))
      std::printf("%s %s: %.0f ms\n", how.c_str(), id.c_str(), out.back());
  }
  return out;
}

// Spawns through the README's ClusterClient, placed by the head over every worker: per second.
double SpawnRate(uint16_t port, int workers) {
  troupe::runtime::RuntimeOptions ro;
  ro.network = true;
  auto rt = troupe::runtime::Runtime::Create(troupe::runtime::ActorRegistry(), ro);
  if (!rt.ok()) return -1;
  auto client = troupe::runtime::ClusterClient::Connect(**rt, "127.0.0.1", port);
  if (!client.ok()) return -1;
  const int n = 500;
  const auto s0 = Clock::now();
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    ok += client->Spawn("sim", caf::make_message(), absl::StrCat("spawned-", i)).ok() ? 1 : 0;
  }
  const double per_s = ok / std::chrono::duration<double>(Clock::now() - s0).count();
  std::printf("spawns: %d of %d placed over %d workers, %.0f/s\n", ok, n, workers, per_s);
  return per_s;
}

// The head(s) of a run: on SQLite one; on etcd a leader and a standby on the same port.
struct Heads {
  std::unique_ptr<troupe::runtime::testing::LocalEtcd> etcd;
  std::string store;
  pid_t head = -1, standby = -1;
  uint16_t port = 0;
};

bool StartHeads(const std::string& troupe, const std::string& dir, bool etcd, Heads* h) {
  h->store = dir + "/head.db";
  if (etcd) {
    h->etcd = std::make_unique<troupe::runtime::testing::LocalEtcd>(dir);
    if (!h->etcd->ready()) return std::printf("etcd did not start\n"), false;
    h->store = h->etcd->store("/scale");
  }
  const int port = etcd ? troupe::runtime::testing::LocalEtcd::FreePort() : 0;
  h->head = StartHead(troupe, dir, static_cast<uint16_t>(port), h->store);
  h->port = WaitPort(dir + "/head.port");
  if (h->port == 0) return std::printf("the head did not listen\n"), false;
  if (etcd) {  // the standby: same store and port, its own log and port file
    std::filesystem::create_directories(dir + "/standby");
    h->standby = StartHead(troupe, dir + "/standby", h->port, h->store);
  }
  return true;
}

// Seconds from the first simulated member's hello to the last one's join; -1 if one failed.
double JoinSeconds(std::vector<Child>& kids) {
  int64_t first = INT64_MAX, last = 0;
  for (Child& c : kids) {
    std::istringstream f(c.Read());
    std::string tag;
    long long s = 0, j = 0;
    f >> tag >> s >> j;
    if (tag != "JOINED") {
      std::printf("a simulating process failed to join: %s\n", f.str().c_str());
      return -1;
    }
    first = std::min<int64_t>(first, s);
    last = std::max<int64_t>(last, j);
  }
  return static_cast<double>(last - first) / 1e9;
}

// The head's CPU (% of a vCPU) over 10 s of steady state, after 3 s to settle.
double SteadyCpuPct(pid_t head) {
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const double cpu0 = CpuSeconds(head);
  const auto w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(10));
  const double wall = std::chrono::duration<double>(Clock::now() - w0).count();
  return 100 * (CpuSeconds(head) - cpu0) / wall;
}

// Seconds from the head's kill (t_kill) until every simulated member is back; -1 if one is not.
double RejoinSeconds(std::vector<Child>& kids, int64_t t_kill) {
  int64_t back = 0;
  for (Child& c : kids) {
    const std::string r = c.Ask(absl::StrCat("rejoin ", t_kill));
    if (Field(r) < 0) return std::printf("rejoin failed: %s\n", r.c_str()), -1;
    back = std::max<int64_t>(back, Field(r));
  }
  return static_cast<double>(back - t_kill) / 1e9;
}

int Cluster(const std::string& troupe, const std::string& self, const std::string& store_kind,
            int nodes, int per_node, int procs) {
  char tmpl[] = "/tmp/troupe-bench-scale-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const bool etcd = store_kind == "etcd";
  Heads h;
  pid_t &head = h.head, &standby = h.standby;
  std::vector<Child> kids;
  // Every process this run started, and its directory, go when it ends (also early).
  auto stop_all = [&](int rc) {
    for (Child& k : kids) kill(k.pid, SIGKILL), waitpid(k.pid, nullptr, 0);
    for (pid_t p : {head, standby}) {
      if (p > 0) kill(p, SIGKILL), waitpid(p, nullptr, 0);
    }
    h.etcd.reset();
    std::filesystem::remove_all(dir);
    return rc;
  };
  if (!StartHeads(troupe, dir, etcd, &h)) return stop_all(1);
  const uint16_t port = h.port;
  const int per_child = nodes / procs;
  for (int p = 0; p < procs; ++p) {
    kids.push_back(Spawn({self, "sim", std::to_string(port), std::to_string(p * per_child),
                          std::to_string(per_child), std::to_string(per_node)}));
  }
  const double join_s = JoinSeconds(kids);
  if (join_s < 0) return stop_all(1);
  const int members = procs * per_child * (1 + per_node);
  std::printf("%d members (%d nodes, %d workers) in %d processes joined in %.2f s\n", members,
              procs * per_child, procs * per_child * per_node, procs, join_s);
  const double cpu_pct = SteadyCpuPct(head);
  std::printf(
      "steady state, 1 s heartbeats: the head's CPU %.1f%% of a vCPU (%.2f us per member "
      "per second), RSS %ld MB\n",
      cpu_pct, cpu_pct / 100 * 1e6 / members, RssMb(head));
  // Exits take each node's last worker, silences the one before: never the same member twice.
  const std::vector<double> exits = Deaths(kids, per_child, per_node - 1, 20, "exit", 0, 10);
  const std::vector<double> silent = Deaths(kids, per_child, per_node - 2, 6, "quiet", 30, 15);
  std::printf("death by exit → every process: p50 %.0f ms p99 %.0f ms (20)\n",
              Percentile(exits, 0.5), Percentile(exits, 0.99));
  std::printf("silence → every process: p50 %.0f ms p99 %.0f ms (6; heartbeat timeout 3 s)\n",
              Percentile(silent, 0.5), Percentile(silent, 0.99));
  const double spawn_per_s = SpawnRate(port, procs * per_child * per_node);
  const long rss = RssMb(head);
  kill(head, SIGKILL);
  const int64_t t_kill = NowNs();
  waitpid(head, nullptr, 0);
  if (etcd) {
    head = standby;  // it leads once the leader's 1 s lease runs out
    standby = -1;
  } else {
    head = StartHead(troupe, dir, port, h.store);
  }
  const double failover_s = RejoinSeconds(kids, t_kill);
  if (failover_s < 0) return stop_all(1);
  std::printf(
      etcd ? "leading head killed, the standby leads from etcd: every member back in %.2f s\n"
           : "head killed and restarted from its SQLite store: every member back in %.2f s\n",
      failover_s);
  for (Child& c : kids) {
    std::fprintf(c.in, "quit\n");
    std::fflush(c.in);
    waitpid(c.pid, nullptr, 0);
  }
  kids.clear();
  std::printf(
      "store=%s join_all_s=%.2f head_cpu_pct=%.1f death_to_all_p99_ms=%.0f "
      "silent_to_all_p99_ms=%.0f spawn_per_s=%.0f head_rss_mb=%ld failover_rejoin_s=%.2f\n",
      store_kind.c_str(), join_s, cpu_pct, Percentile(exits, 0.99), Percentile(silent, 0.99),
      spawn_per_s, rss, failover_s);
  return stop_all(0);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "plan") return Plan(argc > 2 ? std::atoi(argv[2]) : 8192);
  if (mode == "sim" && argc == 6) {
    return Sim(static_cast<uint16_t>(std::atoi(argv[2])), std::atoi(argv[3]), std::atoi(argv[4]),
               std::atoi(argv[5]));
  }
  if (mode == "cluster" && argc == 7 &&
      (std::string(argv[3]) == "sqlite" || std::string(argv[3]) == "etcd")) {
    return Cluster(argv[2], argv[0], argv[3], std::atoi(argv[4]), std::atoi(argv[5]),
                   std::atoi(argv[6]));
  }
  std::fprintf(stderr,
               "usage: bench_scale plan [RANKS] | cluster TROUPE sqlite|etcd NODES "
               "WORKERS_PER_NODE PROCS\n");
  return 2;
}
