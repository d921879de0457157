#include "troupe/kernels/parallel.h"

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::kernels {
namespace {

thread_local bool in_pool_block = false;

// Workers wait for a generation counter to move; each ParallelFor bumps it and every worker takes
// blocks from a shared atomic cursor until none are left. The caller takes blocks too. Between
// regions a worker spins for a while (~100 us) before it sleeps on a condition variable, and so
// does the caller waiting for the last block: a model step runs hundreds of short regions back to
// back, and waking a sleeping thread on another vCPU costs tens of microseconds each time (the
// way an OpenMP runtime spins between parallel regions).
class Pool {
 public:
  explicit Pool(int num_threads) {
    for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  void Run(int64_t num_blocks, const std::function<void(int64_t)>& fn) {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one parallel region at a time
    fn_ = &fn;
    num_blocks_ = num_blocks;
    next_.store(0, std::memory_order_relaxed);
    active_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu_);  // a worker about to sleep cannot miss the bump
      generation_.fetch_add(1, std::memory_order_release);
    }
    work_cv_.notify_all();
    RunBlocks(fn, num_blocks);
    if (!SpinUntil([this] { return active_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [this] { return active_.load(std::memory_order_acquire) == 0; });
    }
    fn_ = nullptr;
  }

 private:
  static constexpr int kSpins = 1000;  // pause instructions, ~100 us

  template <typename Pred>
  static bool SpinUntil(Pred pred) {
    for (int i = 0; i < kSpins; ++i) {
      if (pred()) return true;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    return pred();
  }

  void RunBlocks(const std::function<void(int64_t)>& fn, int64_t num_blocks) {
    in_pool_block = true;
    for (int64_t b = next_.fetch_add(1); b < num_blocks; b = next_.fetch_add(1)) fn(b);
    in_pool_block = false;
  }
  void WorkerLoop() {
    uint64_t seen = 0;
    for (;;) {
      auto moved = [&] {
        return stop_.load(std::memory_order_acquire) ||
               generation_.load(std::memory_order_acquire) != seen;
      };
      if (!SpinUntil(moved)) {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, moved);
      }
      if (stop_.load(std::memory_order_acquire)) return;
      seen = generation_.load(std::memory_order_acquire);
      RunBlocks(*fn_, num_blocks_);  // published before the generation moved (release/acquire)
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);
        done_cv_.notify_one();
      }
    }
  }

  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t num_blocks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int> active_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
};

std::unique_ptr<Pool>& GlobalPool() {
  static std::unique_ptr<Pool> pool = std::make_unique<Pool>(1);
  return pool;
}

}  // namespace

void SetNumThreads(int num_threads) {
  if (num_threads < 1) num_threads = 1;
  auto& pool = GlobalPool();
  if (pool->num_threads() == num_threads) return;
  pool.reset();
  pool = std::make_unique<Pool>(num_threads);
}

int NumThreads() { return GlobalPool()->num_threads(); }

void ParallelFor(int64_t num_blocks, const std::function<void(int64_t)>& fn) {
  if (num_blocks <= 0) return;
  Pool& pool = *GlobalPool();
  if (num_blocks == 1 || pool.num_threads() == 1 || in_pool_block) {
    for (int64_t b = 0; b < num_blocks; ++b) fn(b);
    return;
  }
  pool.Run(num_blocks, fn);
}

}  // namespace troupe::kernels
