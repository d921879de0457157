// Thread pool for the CPU kernels, with an explicit thread count.
//
// Kernels split their work into blocks whose boundaries depend only on the problem size, never on
// the number of threads, and every block writes its own outputs. Which thread runs a block then
// cannot change a single bit of the result, so outputs are identical at 1, 2 or 3 threads.
//
// Example:
//   troupe::kernels::SetNumThreads(2);
//   troupe::kernels::ParallelForRange(n, 4096, [&](int64_t lo, int64_t hi) {
//     for (int64_t i = lo; i < hi; ++i) y[i] = 2 * x[i];
//   });
#ifndef TROUPE_KERNELS_PARALLEL_H_
#define TROUPE_KERNELS_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <functional>

namespace troupe::kernels {

// Sets the number of threads (>= 1; the caller counts as one) used by all kernels. Not to be
// called while a kernel runs. The default is 1.
void SetNumThreads(int num_threads);
int NumThreads();

// Runs fn(block) for every block in [0, num_blocks). Blocks run concurrently in any order; a call
// made from inside a block runs serially. Returns when all blocks are done.
void ParallelFor(int64_t num_blocks, const std::function<void(int64_t)>& fn);

// Splits [0, n) into consecutive blocks of `block_size` (the last may be shorter) and runs
// fn(begin, end) for each.
template <typename F>
void ParallelForRange(int64_t n, int64_t block_size, F&& fn) {
  if (n <= 0) return;
  const int64_t num_blocks = (n + block_size - 1) / block_size;
  ParallelFor(num_blocks, [&](int64_t b) {
    const int64_t lo = b * block_size;
    fn(lo, std::min(n, lo + block_size));
  });
}

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_PARALLEL_H_
