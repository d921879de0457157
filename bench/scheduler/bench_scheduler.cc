// bench_scheduler: the scheduler's decisions per second and decision latency, single-threaded,
// on a generated heterogeneous cluster (scheduler/sim), beside a brute-force placer (score
// every node) making the same decisions in the same run.
//
//   bench_scheduler [--nodes=10000] [--actors=100000] [--groups=100] [--bundles=64]
//                   [--rounds=3] [--brute_actors=100000] [--seed=42]
//
// Prints a table, then `summary: placements_per_s=... p99_decision_us=... pg1024_ms=...
// ratio_vs_bruteforce=...`: medians over rounds of the indexed placer alone (pg1024: over 11
// creations per round, with min-max and this thread's CPU time beside it); the ratio is
// indexed over brute-force placements/s on the same requests, fed to both alternately 1,000 at
// a time so both see the same machine load. Exits 1 if the two placers ever disagree.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sim/generators.h"
#include "sim/rng.h"
#include "troupe/scheduler/scheduler.h"

namespace troupe::scheduler {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int nodes = 10000, actors = 100000, groups = 100, bundles = 64, rounds = 3;
  int brute_actors = 100000;
  uint64_t seed = 42;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const char* s = argv[i];
    auto val = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return std::strncmp(s, name, n) == 0 && s[n] == '=' ? s + n + 1 : nullptr;
    };
    if (const char* v = val("--nodes"))
      a.nodes = std::atoi(v);
    else if (const char* v = val("--actors"))
      a.actors = std::atoi(v);
    else if (const char* v = val("--groups"))
      a.groups = std::atoi(v);
    else if (const char* v = val("--bundles"))
      a.bundles = std::atoi(v);
    else if (const char* v = val("--rounds"))
      a.rounds = std::atoi(v);
    else if (const char* v = val("--brute_actors"))
      a.brute_actors = std::atoi(v);
    else if (const char* v = val("--seed"))
      a.seed = std::strtoull(v, nullptr, 10);
    else {
      std::fprintf(stderr, "unknown flag %s\n", s);
      std::exit(2);
    }
  }
  return a;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// This thread's CPU time: unlike wall time, not inflated when a busy machine preempts us.
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

Scheduler MakeCluster(const std::vector<NodeSpec>& nodes, Scheduler::Placer placer) {
  Scheduler s(Scheduler::Options{placer});
  for (const NodeSpec& n : nodes) {
    if (!s.AddNode(n).ok()) std::abort();
  }
  return s;
}

struct PlaceResult {
  double seconds = 0;
  std::vector<double> latency_us;
  std::vector<std::string> nodes;  // "" when unschedulable
  int placed = 0;
};

// Places requests [begin, end) and appends to r (time, latencies, decisions).
void PlaceRange(Scheduler& s, const std::vector<ActorRequest>& requests, int begin, int end,
                PlaceResult& r) {
  const Clock::time_point start = Clock::now();
  for (int i = begin; i < end; ++i) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<ActorDecision> d = s.PlaceActor(requests[i]);
    r.latency_us.push_back(Seconds(Clock::now() - t0) * 1e6);
    if (!d.ok()) std::abort();
    r.placed += d->placed();
    r.nodes.push_back(d->placed() ? d->node : "");
  }
  r.seconds += Seconds(Clock::now() - start);
}

PlaceResult PlaceAll(Scheduler& s, const std::vector<ActorRequest>& requests, int count) {
  PlaceResult r;
  r.latency_us.reserve(count);
  r.nodes.reserve(count);
  PlaceRange(s, requests, 0, count, r);
  return r;
}

struct Timing {
  double wall_ms = 0, cpu_ms = 0;
};

// Time to create the groups (then removed, untimed); counts the ones that did not fit.
Timing CreateGroups(Scheduler& s, const std::vector<PlacementGroupRequest>& groups, int* unplaced) {
  const double cpu0 = ThreadCpuSeconds();
  const Clock::time_point start = Clock::now();
  for (const PlacementGroupRequest& g : groups) {
    absl::StatusOr<GroupDecision> d = s.CreatePlacementGroup(g);
    if (!d.ok()) std::abort();
    *unplaced += !d->placed();
  }
  const Timing t{Seconds(Clock::now() - start) * 1e3, (ThreadCpuSeconds() - cpu0) * 1e3};
  for (const PlacementGroupRequest& g : groups) (void)s.RemovePlacementGroup(g.group);
  return t;
}

// The requests every pass places: a generated cluster, its actors, the groups, and one
// 1,024-bundle STRICT_SPREAD group.
struct Workload {
  std::vector<NodeSpec> nodes;
  std::vector<ActorRequest> requests;
  std::vector<PlacementGroupRequest> groups;
  PlacementGroupRequest big;
};

Workload MakeWorkload(const Args& args) {
  Workload w;
  sim::ClusterShape shape;
  shape.nodes = args.nodes;
  w.nodes = sim::GenerateCluster(args.seed, shape);
  sim::SplitMix64 rng(args.seed + 1);
  for (int i = 0; i < args.actors; ++i) {
    w.requests.push_back(sim::RandomActor(rng, i, sim::WorkloadShape{}, shape.zones));
  }
  static constexpr Strategy kStrategies[] = {Strategy::kPack, Strategy::kSpread,
                                             Strategy::kStrictPack, Strategy::kStrictSpread};
  for (int i = 0; i < args.groups; ++i) {
    PlacementGroupRequest g;
    g.group = absl::StrCat("pg-", i);
    g.strategy = kStrategies[i % 4];
    g.bundles.assign(args.bundles, ResourceMap{{"cpu", 1}, {"memory", 1}});
    w.groups.push_back(std::move(g));
  }
  w.big.group = "pg-1024";
  w.big.strategy = Strategy::kStrictSpread;
  w.big.bundles.assign(1024, ResourceMap{{"cpu", 1}});
  return w;
}

// The side-by-side pass (empty brute-force figures when --brute_actors=0).
struct SideBySide {
  double fast_rate = 0, pg1024_ms = 0;
  std::vector<double> brute_rate, brute_pg1024_ms;
  int mismatches = 0;
  double BruteRate() const { return brute_rate.empty() ? 0 : brute_rate[0]; }
  double Ratio() const { return brute_rate.empty() ? 0 : fast_rate / brute_rate[0]; }
};

// The same requests go to both placers alternately, 1,000 at a time, so both see the same
// machine load; the ratios come from this pass.
SideBySide RunSideBySide(const Args& args, const Workload& w) {
  SideBySide r;
  const int brute_n = std::min(args.brute_actors, args.actors);
  if (brute_n <= 0) return r;
  Scheduler fast = MakeCluster(w.nodes, Scheduler::Placer::kIndexed);
  Scheduler brute = MakeCluster(w.nodes, Scheduler::Placer::kBruteForce);
  PlaceResult f, b;
  for (int begin = 0; begin < brute_n; begin += 1000) {
    const int end = std::min(begin + 1000, brute_n);
    PlaceRange(fast, w.requests, begin, end, f);
    PlaceRange(brute, w.requests, begin, end, b);
  }
  r.fast_rate = brute_n / f.seconds;
  r.brute_rate.push_back(brute_n / b.seconds);
  for (int i = 0; i < brute_n; ++i) r.mismatches += b.nodes[i] != f.nodes[i];
  int unplaced = 0;
  r.pg1024_ms = CreateGroups(fast, {w.big}, &unplaced).wall_ms;
  r.brute_pg1024_ms.push_back(CreateGroups(brute, {w.big}, &unplaced).wall_ms);
  std::printf(
      "side by side (%d placements, alternating by 1,000): indexed %.0f/s, brute force "
      "%.0f/s; pg1024 %.3f vs %.3f ms\n",
      brute_n, r.fast_rate, r.brute_rate.back(), r.pg1024_ms, r.brute_pg1024_ms.back());
  return r;
}

// The indexed placer alone, round after round, on a fresh cluster each time.
struct Rounds {
  std::vector<double> rate, p50, p99, groups_ms, pg1024_ms, pg1024_cpu_ms;
  int placed = 0, groups_unplaced = 0, big_unplaced = 0;
};

Rounds RunRounds(const Args& args, const Workload& w) {
  Rounds r;
  for (int round = 0; round < args.rounds; ++round) {
    Scheduler fast = MakeCluster(w.nodes, Scheduler::Placer::kIndexed);
    PlaceResult f = PlaceAll(fast, w.requests, args.actors);
    r.rate.push_back(args.actors / f.seconds);
    r.p50.push_back(Percentile(f.latency_us, 0.5));
    r.p99.push_back(Percentile(f.latency_us, 0.99));
    r.placed = f.placed;
    r.groups_ms.push_back(CreateGroups(fast, w.groups, &r.groups_unplaced).wall_ms);
    for (int rep = 0; rep < 11; ++rep) {  // short: repeat, so one preemption does not decide
      const Timing t = CreateGroups(fast, {w.big}, &r.big_unplaced);
      r.pg1024_ms.push_back(t.wall_ms);
      r.pg1024_cpu_ms.push_back(t.cpu_ms);
    }

    std::printf(
        "round %d: indexed %.0f placements/s (p50 %.2f us, p99 %.2f us), %d groups %.2f ms, "
        "pg1024 %.3f ms\n",
        round, r.rate.back(), r.p50.back(), r.p99.back(), args.groups, r.groups_ms.back(),
        r.pg1024_ms.back());
  }
  return r;
}

// The 1k-node point: 10k actors (what such a cluster holds), both placers every round.
struct SmallCluster {
  int nodes = 0, actors = 0, mismatches = 0;
  std::vector<double> rate, brute_rate, p99;
};

SmallCluster RunSmallCluster(const Args& args, const Workload& w) {
  SmallCluster r;
  sim::ClusterShape small_shape;
  small_shape.nodes = args.nodes / 10;
  r.nodes = small_shape.nodes;
  const std::vector<NodeSpec> small_nodes = sim::GenerateCluster(args.seed + 2, small_shape);
  r.actors = std::min(args.actors / 10, static_cast<int>(w.requests.size()));
  for (int round = 0; round < args.rounds; ++round) {
    Scheduler fast = MakeCluster(small_nodes, Scheduler::Placer::kIndexed);
    Scheduler brute = MakeCluster(small_nodes, Scheduler::Placer::kBruteForce);
    PlaceResult f = PlaceAll(fast, w.requests, r.actors);
    PlaceResult b = PlaceAll(brute, w.requests, r.actors);
    r.rate.push_back(r.actors / f.seconds);
    r.p99.push_back(Percentile(f.latency_us, 0.99));
    r.brute_rate.push_back(r.actors / b.seconds);
    for (int i = 0; i < r.actors; ++i) r.mismatches += b.nodes[i] != f.nodes[i];
  }
  return r;
}

// The table of medians, troupe beside brute force.
void PrintTable(const Args& args, const SideBySide& side, const Rounds& rounds,
                const SmallCluster& small) {
  std::printf("\n%-44s %14s %14s %8s\n", "metric", "troupe", "brute force", "ratio");
  std::printf(
      "%-44s %14.0f %14s %8s\n",
      absl::StrCat("placements/s (", args.actors, " actors, ", args.nodes, " nodes)").c_str(),
      Median(rounds.rate), "-", "-");
  std::printf("%-44s %14.0f %14.0f %8.1f\n", "  same, side by side (alternating by 1,000)",
              side.fast_rate, side.BruteRate(), side.Ratio());
  std::printf(
      "%-44s %14.0f %14.0f %8.1f\n",
      absl::StrCat("placements/s (", small.actors, " actors, ", small.nodes, " nodes)").c_str(),
      Median(small.rate), Median(small.brute_rate), Median(small.rate) / Median(small.brute_rate));
  std::printf("%-44s %14.2f %14s %8s\n",
              absl::StrCat("p99 decision at ", small.nodes, " nodes (us)").c_str(),
              Median(small.p99), "-", "-");
  std::printf("%-44s %14.2f %14s %8s\n", "p50 decision (us)", Median(rounds.p50), "-", "-");
  std::printf("%-44s %14.2f %14s %8s\n", "p99 decision (us)", Median(rounds.p99), "-", "-");
  std::printf("%-44s %14.2f %14s %8s\n",
              absl::StrCat(args.groups, " groups x ", args.bundles, " bundles (ms)").c_str(),
              Median(rounds.groups_ms), "-", "-");
  std::printf("%-44s %14.3f %14s %8s\n", "1,024-bundle STRICT_SPREAD group (ms)",
              Median(rounds.pg1024_ms), "-", "-");
  char range[64];
  std::snprintf(range, sizeof(range), "%.3f-%.3f", Percentile(rounds.pg1024_ms, 0),
                Percentile(rounds.pg1024_ms, 1));
  std::printf("%-44s %14s %14s %8s\n",
              absl::StrCat("  min-max of ", rounds.pg1024_ms.size(), " (ms)").c_str(), range, "-",
              "-");
  std::printf("%-44s %14.3f %14s %8s\n", "  thread CPU time (ms)", Median(rounds.pg1024_cpu_ms),
              "-", "-");
  std::printf("%-44s %14.3f %14.3f %8.1f\n", "  same, side by side", side.pg1024_ms,
              side.brute_pg1024_ms.empty() ? 0 : side.brute_pg1024_ms[0],
              side.brute_pg1024_ms.empty() ? 0 : side.brute_pg1024_ms[0] / side.pg1024_ms);
}

int Run(const Args& args) {
  const Workload w = MakeWorkload(args);
  std::printf(
      "bench_scheduler: %d nodes, %d actors, %d groups x %d bundles, %d rounds, "
      "single thread\n",
      args.nodes, args.actors, args.groups, args.bundles, args.rounds);
  const SideBySide side = RunSideBySide(args, w);
  const Rounds rounds = RunRounds(args, w);
  const SmallCluster small = RunSmallCluster(args, w);
  const int mismatches = side.mismatches + small.mismatches;
  PrintTable(args, side, rounds, small);
  std::printf(
      "placed %d of %d actors; groups unplaced %d, pg1024 unplaced %d; decisions that "
      "differ from brute force: %d\n",
      rounds.placed, args.actors, rounds.groups_unplaced, rounds.big_unplaced, mismatches);
  std::printf(
      "context (Ray release figures, end to end, not like for like): 10k actors created "
      "at 551/s; 1k placement groups at 18.9/s\n");
  std::printf(
      "summary: placements_per_s=%.0f p99_decision_us=%.2f pg1024_ms=%.3f "
      "ratio_vs_bruteforce=%.1f\n",
      Median(rounds.rate), Median(rounds.p99), Median(rounds.pg1024_ms), side.Ratio());
  return mismatches == 0 && rounds.big_unplaced == 0 && rounds.groups_unplaced == 0 ? 0 : 1;
}

}  // namespace
}  // namespace troupe::scheduler

int main(int argc, char** argv) {
  return troupe::scheduler::Run(troupe::scheduler::Parse(argc, argv));
}
