// A caching allocator for device memory: freed blocks go to a free list per size class and are
// handed out again, so a training step's steady state calls cudaMalloc/cudaFree (which synchronise
// the device) not at all. The backing store is pluggable: cudaMalloc for the GPU, aligned host
// memory for the CPU tests and the SIMT-on-CPU runs of the GPU code.
//
// Conventions: sizes are rounded up to a size class: multiples of 512 B up to 1 MiB, above that
// four classes per power of two (1, 1.25, 1.5, 1.75 × 2^k), so rounding wastes under 25%. A block
// is reused only for the same size class. Allocate(0) returns a distinct 512 B block. Free(null)
// does nothing; freeing a pointer twice or one this allocator did not return is an
// InvalidArgument error, never a crash. When the backend is out of memory, the cache is emptied
// and the allocation retried once. Blocks are reused in the order work is issued, which is safe
// for one stream (a freed block's old readers precede its new writers in that stream); work on
// several streams must synchronise before freeing. Thread-safe. The destructor returns every
// block, cached or still in use, to the backend.
//
// Example:
//   auto backend = CudaMemoryBackend();               // or HostMemoryBackend() on the CPU
//   if (!backend.ok()) return backend.status();       // e.g. no driver: FailedPrecondition
//   CachingAllocator alloc(std::move(*backend));
//   absl::StatusOr<void*> acts = alloc.Allocate(n * sizeof(float));
//   ...
//   absl::Status st = alloc.Free(*acts);
//   printf("peak %zu bytes\n", alloc.stats().peak_in_use);
#ifndef TROUPE_KERNELS_CUDA_ALLOCATOR_H_
#define TROUPE_KERNELS_CUDA_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::kernels::cuda {

// Where blocks come from. Allocate fails with ResourceExhausted when out of memory.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual absl::Status Free(void* p, size_t bytes) = 0;  // p from Allocate(bytes)
  virtual std::string Name() const = 0;
};

struct HostBackendOptions {
  size_t alignment = 256;  // as cudaMalloc's (a power of two)
  // Fails allocations beyond this many bytes outstanding, to test running out of memory.
  size_t capacity = std::numeric_limits<size_t>::max();
};
std::unique_ptr<MemoryBackend> HostMemoryBackend(const HostBackendOptions& options = {});

// cudaMalloc / cudaFree on `device` (-1: the current device). FailedPrecondition naming the cause
// (e.g. cudaErrorInsufficientDriver) where no GPU can be used, Unimplemented in a build without
// CUDA.
absl::StatusOr<std::unique_ptr<MemoryBackend>> CudaMemoryBackend(int device = -1);

struct AllocatorStats {
  size_t bytes_in_use = 0;     // live blocks, rounded sizes
  size_t bytes_requested = 0;  // live blocks, as requested
  size_t bytes_reserved = 0;   // held from the backend: live and cached blocks
  size_t peak_in_use = 0;
  size_t peak_reserved = 0;
  int64_t num_allocs = 0;  // successful Allocate calls
  int64_t num_frees = 0;   // successful Free calls (non-null)
  int64_t num_cache_hits = 0;
  int64_t num_backend_allocs = 0;
  int64_t num_backend_frees = 0;
};

class CachingAllocator {
 public:
  static constexpr size_t kMinBlock = 512;
  static constexpr size_t kSmallLimit = size_t{1} << 20;
  static constexpr size_t kMaxBytes = size_t{1} << 48;  // larger requests are refused

  explicit CachingAllocator(std::unique_ptr<MemoryBackend> backend);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  absl::StatusOr<void*> Allocate(size_t bytes);
  absl::Status Free(void* p);
  // Returns the cached (free) blocks to the backend; the first backend error, after trying all.
  absl::Status EmptyCache();

  AllocatorStats stats() const;
  void ResetPeakStats();  // peaks := current values
  const MemoryBackend& backend() const { return *backend_; }

  // The size class of a request of `bytes` (bytes ≤ kMaxBytes).
  static size_t RoundSize(size_t bytes);

 private:
  struct Block {
    size_t size;       // rounded
    size_t requested;  // as asked
  };
  absl::Status EmptyCacheLocked();

  std::unique_ptr<MemoryBackend> backend_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::unordered_map<void*, size_t> cached_;   // free block -> size class
  std::map<size_t, std::vector<void*>> free_;  // size class -> free blocks
  AllocatorStats stats_;
};

}  // namespace troupe::kernels::cuda

#endif  // TROUPE_KERNELS_CUDA_ALLOCATOR_H_
