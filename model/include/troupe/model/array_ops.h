// troupe/model/array_ops.h — flat fp32 arrays in one memory (the host's, or one CUDA device's)
// and the few operations the elastic trainer runs on them: copies, the canonical gradient sum's
// additions, the gradient norm's chunk sums and the sharded AdamW update.
//
// The elastic trainer (train/elastic.h) never dereferences a parameter, gradient or moment
// pointer itself: it allocates through the Trainable's ArrayOps and hands pointers to these
// operations and to its communicator, so one code path trains on the host (HostArrayOps, what CI
// runs) and on a GPU (kernels/cuda: CreateCudaArrayOps). Each operation gives the same bits as
// the host one: Add is one float addition per element, RangeChunkSquareSums and
// AdamWUpdateRange are the model's (optimizer.h) — the CUDA kernels reproduce them bit for bit.
//
// Conventions: counts and offsets in elements; `float*` arguments point into arrays of this
// memory, `host_*` into host memory. Every operation has finished when it returns (a GPU
// implementation waits for its stream), so a communicator on another stream or thread may use
// the arrays next. Errors (a CUDA failure) are a Status naming the call, never a crash.
//
// Example:
//   model::ArrayOps& ops = trainable->array_ops();
//   model::FloatArray sum;
//   TROUPE_RETURN_IF_ERROR(ops.Resize(&sum, n));
//   TROUPE_RETURN_IF_ERROR(ops.Copy(sum.data(), trainable->grads(), n));
//   std::vector<float> host(n);
//   TROUPE_RETURN_IF_ERROR(ops.CopyToHost(host.data(), sum.data(), n));
#ifndef TROUPE_MODEL_ARRAY_OPS_H_
#define TROUPE_MODEL_ARRAY_OPS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/kernels/adamw.h"
#include "troupe/model/config.h"
#include "troupe/model/optimizer.h"

namespace troupe::model {

class ArrayOps;

// An owning array of floats in an ArrayOps' memory; empty by default, move-only. The ArrayOps
// must outlive it.
class FloatArray {
 public:
  FloatArray() = default;
  FloatArray(FloatArray&& other) noexcept { swap(other); }
  FloatArray& operator=(FloatArray&& other) noexcept {
    FloatArray(std::move(other)).swap(*this);
    return *this;
  }
  FloatArray(const FloatArray&) = delete;
  FloatArray& operator=(const FloatArray&) = delete;
  ~FloatArray();

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return size_; }
  void swap(FloatArray& other) noexcept {
    std::swap(ops_, other.ops_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }

 private:
  friend class ArrayOps;
  ArrayOps* ops_ = nullptr;
  float* data_ = nullptr;
  int64_t size_ = 0;
};

class ArrayOps {
 public:
  virtual ~ArrayOps() = default;

  // "cpu", "cuda:0".
  virtual std::string name() const = 0;
  // Whether the host may read and write the arrays directly (they are host memory).
  virtual bool host_accessible() const = 0;

  // Makes *a an array of n >= 0 floats of this memory. Contents are unspecified after a change of
  // size and kept otherwise; an array of another ArrayOps is replaced.
  [[nodiscard]] absl::Status Resize(FloatArray* a, int64_t n);
  // Resize(a, n), then n copies of `value`.
  [[nodiscard]] absl::Status Assign(FloatArray* a, int64_t n, float value);

  virtual absl::Status Copy(float* dst, const float* src, int64_t n) = 0;
  virtual absl::Status Fill(float* dst, int64_t n, float value) = 0;
  // Zeros n floats at dst, giving their memory back where this memory can (the host's: whole
  // pages, resident again only once written). Default: Fill with 0.
  virtual absl::Status Discard(float* dst, int64_t n);
  virtual absl::Status CopyToHost(float* host_dst, const float* src, int64_t n) = 0;
  virtual absl::Status CopyFromHost(float* dst, const float* host_src, int64_t n) = 0;
  // out[i] = x[i] + y[i]: one float addition per element (commutative, so the tree sum's bits do
  // not depend on which operand is kept). out may be x or y (an addition in place), or neither:
  // one pass where a copy and an addition in place took two.
  virtual absl::Status Add(float* out, const float* x, const float* y, int64_t n) = 0;
  // model::RangeChunkSquareSums over x = the gradient of elements [begin, end) of `total`; the
  // chunk sums come back to the host.
  virtual absl::StatusOr<std::vector<double>> RangeChunkSquareSums(const float* x, int64_t begin,
                                                                   int64_t end, int64_t total) = 0;
  // model::AdamWUpdateRange: params, grads, m and v hold elements [begin, end); in place where
  // `from` is null, else out of place from its sources (which stay as they were).
  virtual absl::Status AdamWUpdateRange(const std::vector<ParamTensor>& tensors, int64_t begin,
                                        int64_t end, float* params, const float* grads, float* m,
                                        float* v, const AdamWConfig& config,
                                        const kernels::AdamWScalars& scalars,
                                        const kernels::AdamWSources* from) = 0;

 protected:
  // n > 0 floats, or an error (ResourceExhausted when the memory is full); Free takes what
  // Allocate(n) returned, with its n.
  virtual absl::StatusOr<float*> Allocate(int64_t n) = 0;
  virtual void Free(float* p, int64_t n) = 0;

 private:
  friend class FloatArray;
};

// The host's memory and the model's CPU kernels. One instance, shared, thread-safe.
ArrayOps& HostArrayOps();

}  // namespace troupe::model

#endif  // TROUPE_MODEL_ARRAY_OPS_H_
