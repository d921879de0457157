// bench_cluster_spawn: named actors created through the cluster's own API — ClusterClient::Spawn
// on a LocalCluster whose head, node agent and W workers are this program (RunMain) — one spawn
// at a time, as the blocking call gives a user. For each W: spawns/s, the median spawn latency,
// and the CPU each process spent per spawn (head, node agent, the workers together, this client;
// utime + stime from /proc, minus what the same processes spend over as long a pause without
// spawns: heartbeats), so a cost that grows with the cluster shows where it is.
//
//   bench_cluster_spawn [--workers 4,32] [--spawns 2000]
//
// Last line: summary: spawn_per_s_w<W>=… … head_us_per_spawn_w<W>=… …
// Run by hand after building (build/bench/remote/bench_cluster_spawn); never in CI.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "caf/all.hpp"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/runtime.h"

namespace rt = troupe::runtime;
using Clock = std::chrono::steady_clock;

namespace {

// utime + stime of every thread of `pid`, seconds (0 for a process that is gone).
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(text.substr(paren + 2), ' ');
  // After the command: state is field 3, utime 14 and stime 15 (1-based over the whole line).
  long utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime)) {
    return 0;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos) continue;
    std::vector<std::string> f = absl::StrSplit(text.substr(paren + 2), ' ');
    pid_t ppid = 0;
    if (f.size() > 1 && absl::SimpleAtoi(f[1], &ppid) && ppid == parent) out.push_back(pid);
  }
  closedir(d);
  return out;
}

struct Cpu {
  double head = 0, node = 0, workers = 0, client = 0;
};

Cpu Sample(const rt::LocalCluster& c, const std::vector<pid_t>& workers) {
  Cpu s;
  s.head = CpuSeconds(c.head_pid());
  s.node = CpuSeconds(c.nodes().at("local"));
  for (pid_t w : workers) s.workers += CpuSeconds(w);
  s.client = CpuSeconds(getpid());
  return s;
}

Cpu Minus(const Cpu& a, const Cpu& b) {
  return {a.head - b.head, a.node - b.node, a.workers - b.workers, a.client - b.client};
}

struct Result {
  double per_s = 0, p50_us = 0;
  Cpu us_per_spawn;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_cluster_spawn: %s\n", what.c_str());
  std::exit(1);
}

Result Run(int workers, int spawns) {
  rt::LocalCluster::Options o;
  o.workers = workers;
  auto cluster = rt::LocalCluster::Start(o);
  if (!cluster.ok()) Die(absl::StrCat("LocalCluster: ", cluster.status().ToString()));
  rt::RuntimeOptions ro;
  ro.network = true;
  ro.log_events = false;
  auto runtime = rt::Runtime::Create(rt::ActorRegistry{}, ro);
  if (!runtime.ok()) Die(runtime.status().ToString());
  auto client = rt::ClusterClient::Connect(**runtime, "127.0.0.1", (*cluster)->port());
  if (!client.ok()) Die(absl::StrCat("connect: ", client.status().ToString()));
  // Every worker registered before timing starts.
  for (auto deadline = Clock::now() + std::chrono::seconds(120);;) {
    auto members = client->Members();
    int up = 0;
    if (members.ok()) {
      for (const rt::MemberInfo& m : *members) {
        up += m.kind == rt::MemberKind::kWorker && m.state == rt::MemberState::kAlive;
      }
    }
    if (up >= workers) break;
    if (Clock::now() > deadline) Die(absl::StrCat(up, " of ", workers, " workers registered"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::vector<pid_t> worker_pids = ChildrenOf((*cluster)->nodes().at("local"));
  // Warm-up: one spawn per worker (first contact with each).
  for (int i = 0; i < workers; ++i) {
    if (auto r = client->Spawn("echo", caf::make_message(), absl::StrCat("warm-", i)); !r.ok()) {
      Die(absl::StrCat("spawn: ", r.status().ToString()));
    }
  }
  std::vector<double> latency;
  latency.reserve(spawns);
  const Cpu before = Sample(**cluster, worker_pids);
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < spawns; ++i) {
    const Clock::time_point t = Clock::now();
    auto r = client->Spawn("echo", caf::make_message(), absl::StrCat("echo-", i));
    if (!r.ok()) Die(absl::StrCat("spawn ", i, ": ", r.status().ToString()));
    latency.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const Cpu spent = Minus(Sample(**cluster, worker_pids), before);
  // The same processes idle for as long (heartbeats, timers), with the actors now hosted.
  const Cpu idle_before = Sample(**cluster, worker_pids);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const Cpu idle = Minus(Sample(**cluster, worker_pids), idle_before);
  std::sort(latency.begin(), latency.end());
  Result out;
  out.per_s = spawns / seconds;
  out.p50_us = latency[latency.size() / 2];
  const Cpu net = Minus(spent, idle);
  const double k = 1e6 / spawns;
  out.us_per_spawn = {net.head * k, net.node * k, net.workers * k, net.client * k};
  std::printf(
      "W=%-3d %6d spawns in %6.2f s: %7.0f/s, p50 %7.0f us; CPU per spawn (us, idle "
      "subtracted): head %6.1f node %5.1f workers %6.1f client %6.1f; idle CPU/s: head %.3f "
      "workers %.3f\n",
      workers, spawns, seconds, out.per_s, out.p50_us, out.us_per_spawn.head, out.us_per_spawn.node,
      out.us_per_spawn.workers, out.us_per_spawn.client, idle.head / seconds,
      idle.workers / seconds);
  std::fflush(stdout);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  rt::ActorRegistry registry;
  (void)registry.Register<>("echo",
                            [](rt::Actor*) { return caf::behavior{[](int64_t x) { return x; }}; });
  if (int rc = rt::RunMain(argc, argv, registry); rc >= 0) return rc;
  std::vector<int> worlds = {4, 32};
  int spawns = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--workers") == 0) {
      worlds.clear();
      for (absl::string_view w : absl::StrSplit(argv[i + 1], ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(w, &n) || n < 1) Die(absl::StrCat("--workers: bad count '", w, "'"));
        worlds.push_back(n);
      }
    } else if (std::strcmp(argv[i], "--spawns") == 0) {
      if (!absl::SimpleAtoi(argv[i + 1], &spawns) || spawns < 1) Die("--spawns: expected >= 1");
    } else {
      Die(absl::StrCat("unknown argument ", argv[i],
                       " (usage: bench_cluster_spawn [--workers 4,32] [--spawns N])"));
    }
  }
  std::string summary = "summary:";
  std::string head;
  for (int w : worlds) {
    const Result r = Run(w, spawns);
    absl::StrAppend(&summary, " spawn_per_s_w", w, "=", static_cast<int64_t>(r.per_s));
    absl::StrAppend(&head, " head_us_per_spawn_w", w, "=",
                    absl::StrFormat("%.1f", r.us_per_spawn.head));
  }
  std::printf("%s%s\n", summary.c_str(), head.c_str());
  std::fflush(nullptr);
  _exit(0);
}
