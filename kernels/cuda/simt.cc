#include "simt.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TROUPE_SIMT_ASAN 1
#else
#define TROUPE_SIMT_ASAN 0
#endif

namespace troupe::kernels::simt {
namespace detail {
thread_local const Fiber* current_fiber = nullptr;
thread_local uint3 current_block;
thread_local dim3 current_block_dim;
thread_local dim3 current_grid_dim;
thread_local unsigned char* current_dynamic_shared = nullptr;
}  // namespace detail

namespace {

// Kernel frames are small; sanitizer builds need more room for their redzones. Under ASan the
// stack's shadow (1/8 of it) stays below ASan's clear_shadow_mmap_threshold (64 KiB): its
// swapcontext interceptor clears the shadow of the stack switched to, and above the threshold it
// does so by remapping pages, a system call and page faults on every switch.
constexpr size_t kStackBytes = TROUPE_SIMT_ASAN ? (256u << 10) : (128u << 10);
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxDynamicShared = 227u << 10;  // sm_90's opt-in maximum per block

thread_local Schedule g_schedule = Schedule::kForward;
thread_local uint64_t g_seed = 1;

enum class State { kRunnable, kAtBlockBarrier, kAtWarpOp, kDone };

struct FiberSlot : detail::Fiber {
  ucontext_t ctx;
  State state = State::kDone;
  int linear = 0;
  const char* file = nullptr;
  int line = 0;
  detail::WarpOp op = detail::WarpOp::kSync;
  unsigned mask = 0;
  uint64_t value = 0;
  int src = 0;
  uint64_t result = 0;
  void* fake_stack = nullptr;
};

// Stacks with a guard page below each, kept per OS thread and reused across launches.
class StackPool {
 public:
  ~StackPool() {
    for (void* s : stacks_) munmap(s, kStackBytes + page_);
  }
  // The usable range of stack i (above its guard page).
  char* Get(size_t i) {
    while (stacks_.size() <= i) {
      void* p = mmap(nullptr, kStackBytes + page_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
      if (p == MAP_FAILED) std::abort();
      mprotect(p, page_, PROT_NONE);
      stacks_.push_back(p);
    }
    return static_cast<char*>(stacks_[i]) + page_;
  }

 private:
  size_t page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<void*> stacks_;
};

struct Run {
  const char* kernel = nullptr;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  std::vector<FiberSlot> fibers;
  ucontext_t scheduler;
  FiberSlot* running = nullptr;
  std::string error;
  int live = 0;
  int at_block_barrier = 0;
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
  void* scheduler_fake_stack = nullptr;
};

thread_local Run* g_run = nullptr;
std::mutex g_launch_mutex;  // static __shared__ arrays are process-wide: one launch at a time
thread_local StackPool g_stacks;
thread_local std::vector<unsigned char> g_dynamic_shared;

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void Arrange(std::vector<int>& order, uint64_t& rng) {
  std::iota(order.begin(), order.end(), 0);
  if (g_schedule == Schedule::kReverse) {
    std::reverse(order.begin(), order.end());
  } else if (g_schedule == Schedule::kShuffled) {
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[SplitMix(rng) % i]);
  }
}

void StartSwitch([[maybe_unused]] void** fake_stack_save, [[maybe_unused]] const void* bottom,
                 [[maybe_unused]] size_t size) {
#if TROUPE_SIMT_ASAN
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#endif
}

void FinishSwitch([[maybe_unused]] void* fake_stack_save, [[maybe_unused]] const void** bottom_old,
                  [[maybe_unused]] size_t* size_old) {
#if TROUPE_SIMT_ASAN
  __sanitizer_finish_switch_fiber(fake_stack_save, bottom_old, size_old);
#endif
}

// Runs on the fiber: parks it and resumes the scheduler; returns when the fiber is resumed.
void Park(FiberSlot* f) {
  Run* r = g_run;
  StartSwitch(f->state == State::kDone ? nullptr : &f->fake_stack, r->scheduler_stack_bottom,
              r->scheduler_stack_size);
  swapcontext(&f->ctx, &r->scheduler);
  FinishSwitch(f->fake_stack, nullptr, nullptr);
}

void FiberEntry() {
  Run* r = g_run;
  FiberSlot* f = r->running;
  FinishSwitch(nullptr, &r->scheduler_stack_bottom, &r->scheduler_stack_size);
  r->body(r->arg);
  f->state = State::kDone;
  --r->live;
  Park(f);
  std::abort();  // a finished fiber is never resumed
}

std::string Describe(const FiberSlot& f) {
  return absl::StrCat("thread (", f.thread_idx.x, ",", f.thread_idx.y, ",", f.thread_idx.z, ")");
}

std::string Site(const FiberSlot& f) { return absl::StrCat(f.file, ":", f.line); }

bool SameSite(const FiberSlot& a, const FiberSlot& b) {
  return a.line == b.line && (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

const char* OpName(detail::WarpOp op) {
  switch (op) {
    case detail::WarpOp::kSync:
      return "__syncwarp";
    case detail::WarpOp::kShfl:
      return "a shuffle";
    case detail::WarpOp::kBallot:
      return "a vote";
  }
  return "?";
}

void Fail(Run& r, std::string message) {
  if (r.error.empty()) r.error = std::move(message);
}

// Releases the block barrier if every live thread waits at it.
void TryReleaseBlockBarrier(Run& r) {
  if (r.live == 0 || r.at_block_barrier != r.live) return;
  const FiberSlot* first = nullptr;
  for (FiberSlot& f : r.fibers) {
    if (f.state != State::kAtBlockBarrier) continue;
    if (first == nullptr) {
      first = &f;
    } else if (!SameSite(*first, f)) {
      return Fail(r, absl::StrCat("divergent __syncthreads: ", Describe(*first), " waits at ",
                                  Site(*first), ", ", Describe(f), " at ", Site(f)));
    }
  }
  for (FiberSlot& f : r.fibers) {
    if (f.state == State::kAtBlockBarrier) f.state = State::kRunnable;
  }
  r.at_block_barrier = 0;
}

// Releases the warp operation that lane `lane` of warp `warp` waits at, if complete.
void TryReleaseWarp(Run& r, int warp) {
  const int begin = warp * 32;
  const int end = std::min<int>(begin + 32, static_cast<int>(r.fibers.size()));
  for (int i = begin; i < end; ++i) {
    const FiberSlot& lead = r.fibers[i];
    if (lead.state != State::kAtWarpOp) continue;
    const unsigned mask = lead.mask;
    bool complete = true;
    for (int j = begin; j < end && complete; ++j) {
      const FiberSlot& g = r.fibers[j];
      if (!(mask >> (j - begin) & 1u) || g.state == State::kDone) continue;
      if (g.state != State::kAtWarpOp || g.mask != mask) complete = false;
    }
    if (!complete) continue;
    unsigned ballot = 0;
    for (int j = begin; j < end; ++j) {
      const FiberSlot& g = r.fibers[j];
      if (!(mask >> (j - begin) & 1u) || g.state == State::kDone) continue;
      if (g.op != lead.op || !SameSite(g, lead)) {
        return Fail(r, absl::StrCat("warp ", warp, " mask 0x", absl::Hex(mask), ": ",
                                    Describe(lead), " is at ", OpName(lead.op), " at ", Site(lead),
                                    ", ", Describe(g), " at ", OpName(g.op), " at ", Site(g)));
      }
      if (g.value != 0) ballot |= 1u << (j - begin);
    }
    for (int j = begin; j < end; ++j) {
      FiberSlot& g = r.fibers[j];
      if (!(mask >> (j - begin) & 1u) || g.state == State::kDone) continue;
      if (lead.op == detail::WarpOp::kShfl) {
        const int src = begin + g.src;
        const bool taking_part =
            src < end && (mask >> g.src & 1u) && r.fibers[src].state == State::kAtWarpOp;
        if (!taking_part) {
          return Fail(r, absl::StrCat(Describe(g), " shuffles from lane ", g.src,
                                      ", which is not taking part (outside mask 0x",
                                      absl::Hex(mask), ", exited or absent) at ", Site(g)));
        }
        g.result = r.fibers[src].value;
      } else {
        g.result = ballot;
      }
    }
    for (int j = begin; j < end; ++j) {
      FiberSlot& g = r.fibers[j];
      if ((mask >> (j - begin) & 1u) && g.state == State::kAtWarpOp) g.state = State::kRunnable;
    }
    return;
  }
}

std::string DescribeDeadlock(const Run& r) {
  std::string waits;
  int shown = 0;
  bool divergent = false;
  const FiberSlot* first_block = nullptr;
  for (const FiberSlot& f : r.fibers) {
    if (f.state == State::kDone) continue;
    if (f.state == State::kAtBlockBarrier) {
      if (first_block == nullptr) {
        first_block = &f;
      } else if (!SameSite(*first_block, f)) {
        divergent = true;
      }
    }
    if (shown < 4) {
      absl::StrAppend(
          &waits, shown ? "; " : "", Describe(f), " at ",
          f.state == State::kAtBlockBarrier ? "__syncthreads" : OpName(f.op),
          f.state == State::kAtWarpOp ? absl::StrCat(" mask 0x", absl::Hex(f.mask)) : std::string(),
          " ", Site(f));
      ++shown;
    }
  }
  return absl::StrCat(divergent || r.at_block_barrier > 0 ? "divergent barrier" : "deadlock",
                      ": no thread can run (", r.live, " live, ", r.at_block_barrier,
                      " at __syncthreads): ", waits);
}

// Points the fiber at the start of the kernel on `stack`. Out of line: getcontext returns twice,
// which would make GCC treat the caller's loop variables as clobbered.
__attribute__((noinline)) void StartFiber(FiberSlot& f, char* stack) {
#if TROUPE_SIMT_ASAN
  ASAN_UNPOISON_MEMORY_REGION(stack, kStackBytes);  // an abandoned fiber may leave poison
#endif
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack;
  f.ctx.uc_stack.ss_size = kStackBytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, FiberEntry, 0);
}

// The static __shared__ arrays of every kernel linked into this binary (see simt.h). Written
// byte by byte, uninstrumented: under ASan the section also holds the globals' redzones.
extern "C" unsigned char __start_troupe_simt_shared[] __attribute__((weak));
extern "C" unsigned char __stop_troupe_simt_shared[] __attribute__((weak));

__attribute__((no_sanitize_address)) void PoisonStaticShared() {
  volatile unsigned char* p = __start_troupe_simt_shared;
  volatile unsigned char* end = __stop_troupe_simt_shared;
  if (p == nullptr) return;
  for (; p < end; ++p) *p = 0xFF;
}

absl::Status RunBlock(Run& r, uint64_t& rng) {
  const dim3 bd = detail::current_block_dim;
  const int n = static_cast<int>(r.fibers.size());
  for (int i = 0; i < n; ++i) {
    FiberSlot& f = r.fibers[i];
    f.linear = i;
    f.thread_idx = uint3{static_cast<unsigned>(i) % bd.x, (static_cast<unsigned>(i) / bd.x) % bd.y,
                         static_cast<unsigned>(i) / (bd.x * bd.y)};
    f.state = State::kRunnable;
    f.fake_stack = nullptr;
    StartFiber(f, g_stacks.Get(i));
  }
  std::fill(g_dynamic_shared.begin(), g_dynamic_shared.end(), 0xFF);
  PoisonStaticShared();
  r.live = n;
  r.at_block_barrier = 0;
  std::vector<int> order(n);
  while (r.live > 0) {
    Arrange(order, rng);
    bool ran = false;
    for (int i : order) {
      FiberSlot& f = r.fibers[i];
      if (f.state != State::kRunnable) continue;
      ran = true;
      r.running = &f;
      detail::current_fiber = &f;
      StartSwitch(&r.scheduler_fake_stack, g_stacks.Get(i), kStackBytes);
      swapcontext(&r.scheduler, &f.ctx);
      FinishSwitch(r.scheduler_fake_stack, nullptr, nullptr);
      r.running = nullptr;
      TryReleaseBlockBarrier(r);
      TryReleaseWarp(r, i / 32);
      if (!r.error.empty()) return absl::InternalError(r.error);
    }
    if (!ran && r.live > 0) return absl::InternalError(DescribeDeadlock(r));
  }
  return absl::OkStatus();
}

FiberSlot* CurrentSlot(const char* what) {
  if (g_run == nullptr || g_run->running == nullptr) {
    std::fprintf(stderr, "simt: %s called outside a kernel launch\n", what);
    std::abort();
  }
  return g_run->running;
}

}  // namespace

const char* ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kForward:
      return "forward";
    case Schedule::kReverse:
      return "reverse";
    case Schedule::kShuffled:
      return "shuffled";
  }
  return "?";
}

void SetSchedule(Schedule schedule, uint64_t seed) {
  g_schedule = schedule;
  g_seed = seed;
}

Schedule CurrentSchedule() { return g_schedule; }

ScopedSchedule::ScopedSchedule(Schedule schedule, uint64_t seed)
    : previous_(g_schedule), previous_seed_(g_seed) {
  SetSchedule(schedule, seed);
}

ScopedSchedule::~ScopedSchedule() { SetSchedule(previous_, previous_seed_); }

namespace detail {

void SyncThreads(const char* file, int line) {
  FiberSlot* f = CurrentSlot("__syncthreads");
  f->file = file;
  f->line = line;
  f->state = State::kAtBlockBarrier;
  ++g_run->at_block_barrier;
  Park(f);
}

uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int src_lane, const char* file,
                        int line) {
  FiberSlot* f = CurrentSlot(OpName(op));
  const int lane = f->linear % 32;
  if (!(mask >> lane & 1u)) {
    Fail(*g_run,
         absl::StrCat(Describe(*f), " calls ", OpName(op), " with mask 0x", absl::Hex(mask),
                      ", which does not name its own lane ", lane, " at ", file, ":", line));
  }
  f->op = op;
  f->mask = mask;
  f->value = value;
  f->src = src_lane;
  f->file = file;
  f->line = line;
  f->state = State::kAtWarpOp;
  Park(f);
  return f->result;
}

absl::Status LaunchImpl(const char* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                        void (*body)(void*), void* arg) {
  if (g_run != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("simt: launch of ", kernel, " from inside a kernel"));
  }
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || block.z > 64) {
    return absl::InvalidArgumentError(absl::StrCat("simt: ", kernel, ": block (", block.x, ",",
                                                   block.y, ",", block.z, ") must hold 1..",
                                                   kMaxThreadsPerBlock, " threads with z <= 64"));
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("simt: ", kernel, ": grid (", grid.x, ",",
                                                   grid.y, ",", grid.z, ") out of range"));
  }
  if (dynamic_shared_bytes > kMaxDynamicShared) {
    return absl::InvalidArgumentError(absl::StrCat("simt: ", kernel, ": ", dynamic_shared_bytes,
                                                   " bytes of dynamic shared memory, more than ",
                                                   kMaxDynamicShared));
  }
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  Run run;
  run.kernel = kernel;
  run.body = body;
  run.arg = arg;
  run.fibers.resize(threads);
  g_dynamic_shared.assign(dynamic_shared_bytes, 0xFF);
  g_run = &run;
  detail::current_grid_dim = grid;
  detail::current_block_dim = block;
  detail::current_dynamic_shared = g_dynamic_shared.empty() ? nullptr : g_dynamic_shared.data();
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  uint64_t rng = g_seed * 0x2545F4914F6CDD1Dull + 1;
  std::vector<uint64_t> block_order(blocks);
  std::iota(block_order.begin(), block_order.end(), 0);
  if (g_schedule == Schedule::kReverse) {
    std::reverse(block_order.begin(), block_order.end());
  } else if (g_schedule == Schedule::kShuffled) {
    for (size_t i = blocks; i > 1; --i) {
      std::swap(block_order[i - 1], block_order[SplitMix(rng) % i]);
    }
  }
  absl::Status status;
  for (uint64_t b : block_order) {
    detail::current_block =
        uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
              static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y))};
    status = RunBlock(run, rng);
    if (!status.ok()) {
      const uint3 bi = detail::current_block;
      status = absl::Status(
          status.code(),
          absl::StrCat("simt: ", kernel, " block (", bi.x, ",", bi.y, ",", bi.z, ") under the ",
                       ScheduleName(g_schedule), " schedule: ", status.message()));
      break;
    }
  }
  g_run = nullptr;
  detail::current_fiber = nullptr;
  detail::current_dynamic_shared = nullptr;
  return status;
}

}  // namespace detail
}  // namespace troupe::kernels::simt
