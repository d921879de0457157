// remote_common.h — the timing loop and output shared by the bench_remote_* drivers.
//
// Every driver has a `server` mode (prints `port=N` on stdout, then serves until killed; SIGUSR1
// prints `csw=N`, its context switches so far) and a
// `client PORT [SECONDS]` mode that makes synchronous 8-byte calls for SECONDS after a warm-up
// and prints one line: `result calls=N calls_per_s=X p50_us=Y p99_us=Z csw_per_call=C`
// (C: context switches of the calling process, all threads, per call).
//
//   auto stats = bench_remote::Measure([&](int64_t x) { return Echo(x) == x; }, 1.5);
//   bench_remote::Print(stats);
#ifndef TROUPE_BENCH_REMOTE_REMOTE_COMMON_H_
#define TROUPE_BENCH_REMOTE_REMOTE_COMMON_H_

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace bench_remote {

struct Stats {
  int64_t calls = 0;
  double calls_per_s = 0, p50_us = 0, p99_us = 0;
  double csw_per_call = 0;  // this process's context switches (all threads) per timed call
  bool ok = true;
};

// Calls `call(x)` (returns true when the echo came back right) for `seconds` after
// `warmup_calls` untimed calls.
inline int64_t ContextSwitches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_nvcsw + u.ru_nivcsw;
}

template <class F>
Stats Measure(F call, double seconds, int warmup_calls = 2000) {
  using Clock = std::chrono::steady_clock;
  Stats s;
  for (int i = 0; i < warmup_calls; ++i) {
    if (!call(int64_t{i})) {
      s.ok = false;
      return s;
    }
  }
  std::vector<double> lat;
  lat.reserve(1 << 20);
  int64_t csw0 = ContextSwitches();
  auto start = Clock::now();
  auto end =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  Clock::time_point now = start;
  for (int64_t i = 0; now < end; ++i) {
    auto t0 = Clock::now();
    if (!call(i * 7919)) {
      s.ok = false;
      return s;
    }
    now = Clock::now();
    lat.push_back(std::chrono::duration<double, std::micro>(now - t0).count());
  }
  double total = std::chrono::duration<double>(now - start).count();
  int64_t csw = ContextSwitches() - csw0;
  std::sort(lat.begin(), lat.end());
  s.calls = static_cast<int64_t>(lat.size());
  s.calls_per_s = s.calls / total;
  s.csw_per_call = static_cast<double>(csw) / static_cast<double>(s.calls);
  s.p50_us = lat[lat.size() / 2];
  s.p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  return s;
}

inline int Print(const Stats& s) {
  if (!s.ok) {
    std::printf("result error=wrong_or_failed_reply\n");
    return 1;
  }
  std::printf("result calls=%lld calls_per_s=%.1f p50_us=%.2f p99_us=%.2f csw_per_call=%.2f\n",
              static_cast<long long>(s.calls), s.calls_per_s, s.p50_us, s.p99_us, s.csw_per_call);
  std::fflush(stdout);
  return 0;
}

// Servers: from now on every SIGUSR1 prints `csw=N` (this process's context switches so far,
// every thread, exited ones included). Call first thing in main, before any thread starts, so
// that all threads inherit the blocked signal.
inline void StartContextSwitchReporter() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) {
        std::printf("csw=%lld\n", static_cast<long long>(ContextSwitches()));
        std::fflush(stdout);
      }
    }
  }).detach();
}

inline void PrintPort(unsigned port) {
  std::printf("port=%u\n", port);
  std::fflush(stdout);
}

inline int Usage(const char* prog) {
  std::fprintf(stderr, "usage: %s server | client PORT [SECONDS]\n", prog);
  return 2;
}

}  // namespace bench_remote

#endif  // TROUPE_BENCH_REMOTE_REMOTE_COMMON_H_
