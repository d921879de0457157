// Process-level crash points (troupe/base/crash_point.h).
#include "troupe/base/crash_point.h"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <mutex>

namespace troupe::base {

namespace {

std::mutex crash_mu;
std::string crash_point;  // guarded by crash_mu
uint64_t crash_hit = 0, crash_seen = 0;
std::atomic<bool> crash_armed{false};

}  // namespace

void ArmCrashPoint(const std::string& point, uint64_t hit) {
  std::lock_guard<std::mutex> lock(crash_mu);
  crash_point = point;
  crash_hit = hit;
  crash_seen = 0;
  crash_armed = !point.empty();
}

void CrashPoint(const char* point) {
  if (!crash_armed.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(crash_mu);
  if (crash_point != point || ++crash_seen != crash_hit) return;
  std::fprintf(stderr, "troupe: crash point '%s' reached (hit %llu); killing this process\n", point,
               static_cast<unsigned long long>(crash_seen));
  std::fflush(stderr);
  raise(SIGKILL);
}

}  // namespace troupe::base
