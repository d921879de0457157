#include "allocator.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"

#ifdef TROUPE_HAVE_CUDART
#include "check.h"
#endif

namespace troupe::kernels::cuda {
namespace {

class HostBackend : public MemoryBackend {
 public:
  explicit HostBackend(const HostBackendOptions& o) : o_(o) {}

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t size =
        (std::max<size_t>(bytes, 1) + o_.alignment - 1) / o_.alignment * o_.alignment;
    if (size > o_.capacity - std::min(used_, o_.capacity)) {
      return absl::ResourceExhaustedError(absl::StrCat("host backend: ", bytes, " bytes with ",
                                                       used_, " of ", o_.capacity, " in use"));
    }
    void* p = std::aligned_alloc(o_.alignment, size);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host backend: aligned_alloc(", size, ")"));
    }
    used_ += size;
    return p;
  }

  absl::Status Free(void* p, size_t bytes) override {
    used_ -= (std::max<size_t>(bytes, 1) + o_.alignment - 1) / o_.alignment * o_.alignment;
    std::free(p);
    return absl::OkStatus();
  }

  std::string Name() const override { return "host"; }

 private:
  HostBackendOptions o_;
  size_t used_ = 0;  // guarded by the allocator's mutex: backends are called under it
};

#ifdef TROUPE_HAVE_CUDART
class CudaBackend : public MemoryBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {}

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    // cudaMalloc allocates on the current device: switch to ours and back.
    int current = 0;
    TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaGetDevice(&current)));
    if (current != device_) TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaSetDevice(device_)));
    void* p = nullptr;
    absl::Status st = CudaErrorStatus(cudaMalloc(&p, bytes), "cudaMalloc", __FILE__, __LINE__);
    if (current != device_) TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaSetDevice(current)));
    if (!st.ok()) return st;
    return p;
  }

  absl::Status Free(void* p, size_t) override {
    TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaFree(p)));
    return absl::OkStatus();
  }

  std::string Name() const override { return absl::StrCat("cudaMalloc(device ", device_, ")"); }

 private:
  int device_;
};
#endif

}  // namespace

std::unique_ptr<MemoryBackend> HostMemoryBackend(const HostBackendOptions& options) {
  HostBackendOptions o = options;
  if (o.alignment < alignof(std::max_align_t) || (o.alignment & (o.alignment - 1)) != 0) {
    o.alignment = alignof(std::max_align_t);
  }
  return std::make_unique<HostBackend>(o);
}

absl::StatusOr<std::unique_ptr<MemoryBackend>> CudaMemoryBackend(int device) {
#ifdef TROUPE_HAVE_CUDART
  // Checked here, so that a machine without a driver fails at set-up with the cause named.
  int count = 0;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaGetDeviceCount(&count)));
  if (device < 0) TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaGetDevice(&device)));
  if (device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CudaMemoryBackend: device ", device, " of ", count));
  }
  return std::unique_ptr<MemoryBackend>(std::make_unique<CudaBackend>(device));
#else
  (void)device;
  return absl::UnimplementedError("CudaMemoryBackend: troupe was built without CUDA");
#endif
}

// ---------------------------------------------------------------------------------------------

CachingAllocator::CachingAllocator(std::unique_ptr<MemoryBackend> backend)
    : backend_(std::move(backend)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  (void)EmptyCacheLocked();
  for (const auto& [p, block] : live_) (void)backend_->Free(p, block.size);
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  if (bytes <= kSmallLimit)
    return std::max(kMinBlock, (bytes + kMinBlock - 1) / kMinBlock * kMinBlock);
  size_t pow2 = kSmallLimit;
  while (pow2 <= bytes / 2) pow2 *= 2;  // the largest power of two ≤ bytes
  const size_t step = pow2 / 4;
  return (bytes + step - 1) / step * step;
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  if (bytes > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat("CachingAllocator: ", bytes, " bytes"));
  }
  const size_t size = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    cached_.erase(p);
    ++stats_.num_cache_hits;
  } else {
    absl::StatusOr<void*> fresh = backend_->Allocate(size);
    if (!fresh.ok() && absl::IsResourceExhausted(fresh.status()) && !cached_.empty()) {
      // Cached blocks of other sizes may be what stands in the way.
      TROUPE_RETURN_IF_ERROR(EmptyCacheLocked());
      fresh = backend_->Allocate(size);
    }
    if (!fresh.ok()) {
      return absl::Status(
          fresh.status().code(),
          absl::StrCat("CachingAllocator (", backend_->Name(), "): ", bytes, " bytes with ",
                       stats_.bytes_in_use, " in use: ", fresh.status().message()));
    }
    p = *fresh;
    ++stats_.num_backend_allocs;
    stats_.bytes_reserved += size;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.bytes_reserved);
  }
  live_.emplace(p, Block{size, bytes});
  ++stats_.num_allocs;
  stats_.bytes_in_use += size;
  stats_.bytes_requested += bytes;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.bytes_in_use);
  return p;
}

absl::Status CachingAllocator::Free(void* p) {
  if (p == nullptr) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) {
    if (cached_.count(p) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("CachingAllocator::Free(0x",
                                                     absl::Hex(reinterpret_cast<uintptr_t>(p)),
                                                     "): double free (the block is already free)"));
    }
    return absl::InvalidArgumentError(absl::StrCat("CachingAllocator::Free(0x",
                                                   absl::Hex(reinterpret_cast<uintptr_t>(p)),
                                                   "): not a block from this allocator"));
  }
  const Block block = it->second;
  live_.erase(it);
  free_[block.size].push_back(p);
  cached_.emplace(p, block.size);
  ++stats_.num_frees;
  stats_.bytes_in_use -= block.size;
  stats_.bytes_requested -= block.requested;
  return absl::OkStatus();
}

absl::Status CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  return EmptyCacheLocked();
}

absl::Status CachingAllocator::EmptyCacheLocked() {
  absl::Status first;
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) {
      first.Update(backend_->Free(p, size));
      ++stats_.num_backend_frees;
      stats_.bytes_reserved -= size;
    }
  }
  free_.clear();
  cached_.clear();
  return first;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeakStats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use = stats_.bytes_in_use;
  stats_.peak_reserved = stats_.bytes_reserved;
}

}  // namespace troupe::kernels::cuda
