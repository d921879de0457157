// CreateCudaArrayOps (array_ops_cuda.h): model::ArrayOps over a caching allocator on one device,
// its operations the kernels of array_ops.cuh plus cudaMemcpyAsync, each waiting for its stream.
#include "array_ops_cuda.h"

// clang-format off
#include "array_ops.cuh"  // first of the CUDA headers (device.cuh)
// clang-format on

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "allocator.h"
#include "check.h"
#include "troupe/base/status_macros.h"

namespace troupe::model::cuda {
namespace {

// Any failure to reach the device means "no usable GPU here": FailedPrecondition whatever code the
// runtime's error maps to, with its name and file:line kept in the message.
absl::Status Unusable(int ordinal, const absl::Status& cause) {
  return absl::FailedPreconditionError(absl::StrCat(
      "CreateCudaArrayOps: no usable CUDA device cuda:", ordinal, ": ", cause.message()));
}

class CudaArrayOps final : public model::ArrayOps {
 public:
  CudaArrayOps(int ordinal, cudaStream_t stream, bool owns_stream,
               std::unique_ptr<CachingAllocator> alloc)
      : ordinal_(ordinal), stream_(stream), owns_stream_(owns_stream), alloc_(std::move(alloc)) {}
  ~CudaArrayOps() override {
    // The memory first (cudaFree waits for the device), then an owned stream; on our device.
    (void)cudaSetDevice(ordinal_);
    alloc_.reset();
    if (owns_stream_ && stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }
  CudaArrayOps(const CudaArrayOps&) = delete;
  CudaArrayOps& operator=(const CudaArrayOps&) = delete;

  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  bool host_accessible() const override { return false; }

  absl::Status Copy(float* dst, const float* src, int64_t n) override {
    if (n <= 0 || dst == src) return absl::OkStatus();
    TROUPE_RETURN_IF_ERROR(MakeCurrent());
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    if (dst < src + n && src < dst + n) {
      // Overlapping (memmove's case, which cudaMemcpy leaves undefined): through a scratch copy.
      TROUPE_ASSIGN_OR_RETURN(Scratch tmp, Scratch::Make(*alloc_, bytes));
      TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(
          cudaMemcpyAsync(tmp.get(), src, bytes, cudaMemcpyDeviceToDevice, stream_)));
      TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(
          cudaMemcpyAsync(dst, tmp.get(), bytes, cudaMemcpyDeviceToDevice, stream_)));
      return Wait();  // before the scratch block goes back to the cache
    }
    TROUPE_RETURN_IF_ERROR(
        TROUPE_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_)));
    return Wait();
  }

  absl::Status Fill(float* dst, int64_t n, float value) override {
    if (n <= 0) return absl::OkStatus();
    TROUPE_RETURN_IF_ERROR(MakeCurrent());
    TROUPE_RETURN_IF_ERROR(fill<float>(dst, n, value, stream_));
    return Wait();
  }

  absl::Status CopyToHost(float* host_dst, const float* src, int64_t n) override {
    if (n <= 0) return absl::OkStatus();
    TROUPE_RETURN_IF_ERROR(MakeCurrent());
    TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaMemcpyAsync(
        host_dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost, stream_)));
    return Wait();
  }

  absl::Status CopyFromHost(float* dst, const float* host_src, int64_t n) override {
    if (n <= 0) return absl::OkStatus();
    TROUPE_RETURN_IF_ERROR(MakeCurrent());
    TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaMemcpyAsync(
        dst, host_src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice, stream_)));
    return Wait();  // the host buffer may be reused on return
  }

  absl::Status Add(float* out, const float* x, const float* y, int64_t n) override {
    if (n <= 0) return absl::OkStatus();
    TROUPE_RETURN_IF_ERROR(MakeCurrent());
    TROUPE_RETURN_IF_ERROR(add<float>(out, x, y, n, stream_));
    return Wait();
  }

  absl::StatusOr<std::vector<double>> RangeChunkSquareSums(const float* x, int64_t begin,
                                                           int64_t end, int64_t total) override {
    absl::StatusOr<int64_t> chunks = RangeChunkCount(begin, end, total);  // the model's checks
    if (!chunks.ok()) return chunks.status();
    std::vector<double> sums(static_cast<size_t>(*chunks));
    if (sums.empty()) return sums;
    TROUPE_RETURN_IF_ERROR(MakeCurrent());
    const size_t bytes = sums.size() * sizeof(double);
    TROUPE_ASSIGN_OR_RETURN(Scratch out, Scratch::Make(*alloc_, bytes));
    TROUPE_RETURN_IF_ERROR(
        range_chunk_square_sums(static_cast<double*>(out.get()), x, begin, end, total, stream_));
    TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(
        cudaMemcpyAsync(sums.data(), out.get(), bytes, cudaMemcpyDeviceToHost, stream_)));
    TROUPE_RETURN_IF_ERROR(Wait());
    return sums;
  }

  absl::Status AdamWUpdateRange(const std::vector<model::ParamTensor>& tensors, int64_t begin,
                                int64_t end, float* params, const float* grads, float* m, float* v,
                                const model::AdamWConfig& /*config*/, const AdamWScalars& scalars,
                                const AdamWSources* from) override {
    if (end <= begin) return absl::OkStatus();
    TROUPE_RETURN_IF_ERROR(MakeCurrent());
    TROUPE_RETURN_IF_ERROR(adamw_update_range(tensors, begin, end, params, grads, m, v, scalars,
                                              stream_, kAdamWBlock, from));
    return Wait();
  }

 protected:
  absl::StatusOr<float*> Allocate(int64_t n) override {
    TROUPE_RETURN_IF_ERROR(MakeCurrent());
    TROUPE_ASSIGN_OR_RETURN(void* p, alloc_->Allocate(static_cast<size_t>(n) * sizeof(float)));
    return static_cast<float*>(p);
  }
  // Only bookkeeping (the block goes to the cache); it fails only for a pointer the allocator did
  // not hand out, which FloatArray never passes.
  void Free(float* p, int64_t /*n*/) override { (void)alloc_->Free(p); }

 private:
  // An allocator block for one call, returned to the cache when the call ends.
  class Scratch {
   public:
    static absl::StatusOr<Scratch> Make(CachingAllocator& alloc, size_t bytes) {
      TROUPE_ASSIGN_OR_RETURN(void* p, alloc.Allocate(bytes));
      return Scratch(alloc, p);
    }
    Scratch(Scratch&& other) noexcept : alloc_(other.alloc_), p_(other.p_) { other.p_ = nullptr; }
    Scratch& operator=(Scratch&&) = delete;
    ~Scratch() {
      if (p_ != nullptr) (void)alloc_->Free(p_);
    }
    void* get() const { return p_; }

   private:
    Scratch(CachingAllocator& alloc, void* p) : alloc_(&alloc), p_(p) {}
    CachingAllocator* alloc_;
    void* p_;
  };

  absl::Status MakeCurrent() const {
    TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaSetDevice(ordinal_)));
    return absl::OkStatus();
  }
  absl::Status Wait() const {
    TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaStreamSynchronize(stream_)));
    return absl::OkStatus();
  }

  int ordinal_;
  cudaStream_t stream_;
  bool owns_stream_;
  std::unique_ptr<CachingAllocator> alloc_;
};

absl::StatusOr<std::unique_ptr<model::ArrayOps>> Create(int ordinal, cudaStream_t stream,
                                                        bool own_stream) {
  TROUPE_RETURN_IF_ERROR(UseKernelDevice("CreateCudaArrayOps", ordinal));
  absl::StatusOr<std::unique_ptr<MemoryBackend>> backend = CudaMemoryBackend(ordinal);
  if (!backend.ok()) return Unusable(ordinal, backend.status());
  auto alloc = std::make_unique<CachingAllocator>(std::move(*backend));
  if (own_stream) {
    // Blocking (not cudaStreamNonBlocking): ordered with work a caller puts on the legacy default
    // stream, as GptDevice's stream is.
    TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaStreamCreate(&stream)));
  }
  return std::unique_ptr<model::ArrayOps>(
      std::make_unique<CudaArrayOps>(ordinal, stream, own_stream, std::move(alloc)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<model::ArrayOps>> CreateCudaArrayOps(int device_ordinal) {
  return Create(device_ordinal, nullptr, /*own_stream=*/true);
}

absl::StatusOr<std::unique_ptr<model::ArrayOps>> CreateCudaArrayOpsOnStream(int device_ordinal,
                                                                            void* stream) {
  return Create(device_ordinal, static_cast<cudaStream_t>(stream), /*own_stream=*/false);
}

}  // namespace troupe::model::cuda
