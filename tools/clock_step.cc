// libtroupe_clock_step.so — chaos's clock-step, preloaded into a worker (LD_PRELOAD, set by its
// node agent when TROUPE_CLOCK_STEP_DIR is set): the process's wall clock (CLOCK_REALTIME and
// its coarse variant, gettimeofday, time) runs offset by the signed nanoseconds written in
// $TROUPE_CLOCK_STEP_FILE, re-read at most every 50 ms of monotonic time; every other clock is
// the machine's. A write of "3600000000000" to that file (whole: temp file and rename) is an NTP
// step of +1 h for this process alone: the machine's clock is never touched. Offsets are absolute
// (a second step replaces the first). CLOCK_TAI is left alone (troupe never reads it).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace {

using ClockGettime = int (*)(clockid_t, struct timespec*);

int Syscall(clockid_t id, struct timespec* t) {
  return static_cast<int>(syscall(SYS_clock_gettime, id, t));
}

// libc's clock_gettime (the vDSO's fast path), or the system call if it cannot be found.
ClockGettime Real() {
  static const ClockGettime real = [] {
    auto f = reinterpret_cast<ClockGettime>(dlsym(RTLD_NEXT, "clock_gettime"));
    return f != nullptr ? f : &Syscall;
  }();
  return real;
}

std::atomic<int64_t> g_offset_ns{0};
std::atomic<int64_t> g_read_at_ns{-1};  // never

int64_t Nanos(const struct timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; }

// The offset, from the file when the last read is 50 ms old (a racing reader reads it too).
int64_t Offset() {
  struct timespec now;
  if (Real()(CLOCK_MONOTONIC_COARSE, &now) != 0) return 0;
  const int64_t t = Nanos(now);
  const int64_t last = g_read_at_ns.load(std::memory_order_relaxed);
  if (last >= 0 && t - last < 50000000) {
    return g_offset_ns.load(std::memory_order_relaxed);
  }
  g_read_at_ns.store(t, std::memory_order_relaxed);
  const char* path = getenv("TROUPE_CLOCK_STEP_FILE");
  if (path == nullptr) return 0;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return g_offset_ns.load(std::memory_order_relaxed);
  char buf[32] = {};
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n > 0) g_offset_ns.store(strtoll(buf, nullptr, 10), std::memory_order_relaxed);
  return g_offset_ns.load(std::memory_order_relaxed);
}

void Shift(struct timespec* t, int64_t ns) {
  const int64_t v = Nanos(*t) + ns;
  t->tv_sec = static_cast<time_t>(v / 1000000000);
  t->tv_nsec = static_cast<long>(v % 1000000000);
  if (t->tv_nsec < 0) {
    t->tv_nsec += 1000000000;
    --t->tv_sec;
  }
}

}  // namespace

extern "C" {

int clock_gettime(clockid_t id, struct timespec* t) {
  const int r = Real()(id, t);
  if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) Shift(t, Offset());
  return r;
}

int gettimeofday(struct timeval* tv, void* /*tz*/) {
  struct timespec t;
  const int r = clock_gettime(CLOCK_REALTIME, &t);
  if (r == 0) {  // glibc declares tv non-null
    tv->tv_sec = t.tv_sec;
    tv->tv_usec = t.tv_nsec / 1000;
  }
  return r;
}

time_t time(time_t* out) {
  struct timespec t;
  if (clock_gettime(CLOCK_REALTIME, &t) != 0) return static_cast<time_t>(-1);
  if (out != nullptr) *out = t.tv_sec;
  return t.tv_sec;
}

}  // extern "C"
