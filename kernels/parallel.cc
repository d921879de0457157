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

// Workers sleep on a generation counter; each ParallelFor bumps it and every worker takes blocks
// from a shared atomic cursor until none are left. The caller takes blocks too.
class Pool {
 public:
  explicit Pool(int num_threads) {
    for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  void Run(int64_t num_blocks, const std::function<void(int64_t)>& fn) {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one parallel region at a time
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      num_blocks_ = num_blocks;
      next_.store(0);
      active_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    work_cv_.notify_all();
    RunBlocks(fn, num_blocks);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return active_ == 0; });
    fn_ = nullptr;
  }

 private:
  void RunBlocks(const std::function<void(int64_t)>& fn, int64_t num_blocks) {
    in_pool_block = true;
    for (int64_t b = next_.fetch_add(1); b < num_blocks; b = next_.fetch_add(1)) fn(b);
    in_pool_block = false;
  }
  void WorkerLoop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const auto* fn = fn_;
      const int64_t num_blocks = num_blocks_;
      lock.unlock();
      RunBlocks(*fn, num_blocks);
      lock.lock();
      if (--active_ == 0) done_cv_.notify_one();
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
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
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
