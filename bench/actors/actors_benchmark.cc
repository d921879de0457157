// bench/actors — local request/response throughput and spawn cost through troupe's API, next
// to raw CAF 0.17 doing the same work, in one run (interleaved repetitions, medians), pinned to
// one vCPU unless --unpinned.
// Ends with: summary: troupe_rr_per_s=… caf_rr_per_s=… ratio_rr=… troupe_spawn_per_s=…
//                     caf_spawn_per_s=… ratio_spawn=…
#include <benchmark/benchmark.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "caf/all.hpp"
#include "troupe/runtime/runtime.h"

namespace {

namespace rt = troupe::runtime;
using echo_atom = caf::atom_constant<caf::atom("echo")>;

caf::behavior RawEcho(caf::event_based_actor*) {
  return {[](echo_atom, int64_t x) { return x; }};
}

rt::ActorRegistry Registry() {
  rt::ActorRegistry r;
  (void)r.Register<>(
      "echo", [](rt::Actor*) { return caf::behavior{[](echo_atom, int64_t x) { return x; }}; });
  return r;
}

// One runtime (and one raw CAF system, same thread count) for the whole process.
struct Systems {
  std::unique_ptr<rt::Runtime> troupe;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> raw;
  Systems() {
    rt::RuntimeOptions o;
    o.threads = 2;
    o.log_events = false;
    troupe = std::move(*rt::Runtime::Create(Registry(), o));
    cfg.set("scheduler.max-threads", size_t{2});
    cfg.set("logger.verbosity", caf::atom("quiet"));
    raw = std::make_unique<caf::actor_system>(cfg);
  }
};

Systems& S() {
  static Systems s;
  return s;
}

void RequestResponse(benchmark::State& state, caf::actor_system& sys, const caf::actor& echo) {
  caf::scoped_actor self{sys};
  int64_t i = 0;
  for (auto _ : state) {
    self->request(echo, caf::infinite, echo_atom::value, i++)
        .receive([](int64_t) {}, [&](caf::error&) { state.SkipWithError("request failed"); });
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_RequestResponse_Troupe(benchmark::State& state) {
  auto echo = S().troupe->Spawn("echo");
  RequestResponse(state, S().troupe->system(), *echo);
  caf::anon_send_exit(*echo, caf::exit_reason::user_shutdown);
}

void BM_RequestResponse_RawCaf(benchmark::State& state) {
  auto echo = S().raw->spawn(RawEcho);
  RequestResponse(state, *S().raw, echo);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

// Spawn cost: spawn, then one request to prove it runs, then stop it.
template <class SpawnFn>
void SpawnLoop(benchmark::State& state, caf::actor_system& sys, SpawnFn spawn) {
  caf::scoped_actor self{sys};
  for (auto _ : state) {
    caf::actor a = spawn();
    self->request(a, caf::infinite, echo_atom::value, int64_t{1})
        .receive([](int64_t) {}, [&](caf::error&) { state.SkipWithError("request failed"); });
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Spawn_Troupe(benchmark::State& state) {
  SpawnLoop(state, S().troupe->system(), [] { return *S().troupe->Spawn("echo"); });
}

void BM_Spawn_RawCaf(benchmark::State& state) {
  SpawnLoop(state, *S().raw, [] { return S().raw->spawn(RawEcho); });
}

BENCHMARK(BM_RequestResponse_Troupe)->UseRealTime();
BENCHMARK(BM_RequestResponse_RawCaf)->UseRealTime();
BENCHMARK(BM_Spawn_Troupe)->UseRealTime();
BENCHMARK(BM_Spawn_RawCaf)->UseRealTime();

// Records the median items/s of each benchmark for the summary line.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> median_per_s;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.aggregate_name == "median") {
        auto it = r.counters.find("items_per_second");
        if (it != r.counters.end()) median_per_s[r.run_name.function_name] = it->second.value;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace

// Pins this process (and so every thread both actor systems start) to the first vCPU it may use.
// Each request/response is a few thread wake-ups; across vCPUs their cost swings 2x from run to
// run with where the scheduler puts the threads (docs/BENCHMARKS.md), which swamps the per-message
// difference being measured. On one vCPU both sides pay the same context switches.
int PinToOneCpu() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof(one), &one) == 0 ? cpu : -1;
  }
  return -1;
}

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  auto unpinned = std::find_if(args.begin(), args.end(),
                               [](const char* a) { return std::string(a) == "--unpinned"; });
  if (unpinned != args.end()) {
    args.erase(unpinned);
    std::printf("placement: unpinned (threads float over every vCPU)\n");
  } else {
    std::printf("placement: pinned to vCPU %d (--unpinned to let threads float)\n", PinToOneCpu());
  }
  std::string reps = "--benchmark_repetitions=9",
              inter = "--benchmark_enable_random_interleaving=true",
              agg = "--benchmark_report_aggregates_only=true",
              min_time = "--benchmark_min_time=0.3";
  for (std::string* a : {&reps, &inter, &agg, &min_time}) args.insert(args.begin() + 1, a->data());
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  auto& m = reporter.median_per_s;
  auto get = [&](const char* k) { return m.count(k) ? m[k] : 0.0; };
  double t_rr = get("BM_RequestResponse_Troupe"), c_rr = get("BM_RequestResponse_RawCaf");
  double t_sp = get("BM_Spawn_Troupe"), c_sp = get("BM_Spawn_RawCaf");
  bool complete = t_rr > 0 && c_rr > 0 && t_sp > 0 && c_sp > 0;
  std::printf("\n%-28s %14s %14s %8s\n", "metric (median)", "troupe", "raw CAF", "ratio");
  std::printf("%-28s %14.0f %14.0f %8.3f\n", "request/response per s", t_rr, c_rr,
              c_rr > 0 ? t_rr / c_rr : 0);
  std::printf("%-28s %14.0f %14.0f %8.3f\n", "spawn+request+stop per s", t_sp, c_sp,
              c_sp > 0 ? t_sp / c_sp : 0);
  std::printf(
      "summary: troupe_rr_per_s=%.0f caf_rr_per_s=%.0f ratio_rr=%.3f troupe_spawn_per_s=%.0f "
      "caf_spawn_per_s=%.0f ratio_spawn=%.3f\n",
      t_rr, c_rr, c_rr > 0 ? t_rr / c_rr : 0, t_sp, c_sp, c_sp > 0 ? t_sp / c_sp : 0);
  S().troupe.reset();
  return complete ? 0 : 1;
}
