#include "troupe/model/array_ops.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "troupe/base/big_buffer.h"
#include "troupe/base/status_macros.h"
#include "troupe/kernels/parallel.h"

namespace troupe::model {

FloatArray::~FloatArray() {
  if (data_ != nullptr) ops_->Free(data_, size_);
}

absl::Status ArrayOps::Resize(FloatArray* a, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("array size: expected >= 0, got ", n));
  if (a->ops_ == this && a->size_ == n) return absl::OkStatus();
  FloatArray fresh;
  if (n > 0) {
    TROUPE_ASSIGN_OR_RETURN(float* p, Allocate(n));
    fresh.data_ = p;
  }
  fresh.ops_ = this;
  fresh.size_ = n;
  a->swap(fresh);  // the old array is freed with `fresh`
  return absl::OkStatus();
}

absl::Status ArrayOps::Assign(FloatArray* a, int64_t n, float value) {
  TROUPE_RETURN_IF_ERROR(Resize(a, n));
  return Fill(a->data(), n, value);
}

absl::Status ArrayOps::Discard(float* dst, int64_t n) { return Fill(dst, n, 0.0f); }

namespace {

class Host final : public ArrayOps {
 public:
  std::string name() const override { return "cpu"; }
  bool host_accessible() const override { return true; }

  absl::Status Copy(float* dst, const float* src, int64_t n) override {
    if (n > 0 && dst != src) std::memmove(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Fill(float* dst, int64_t n, float value) override {
    std::fill(dst, dst + n, value);
    return absl::OkStatus();
  }
  // The whole pages inside go back to the kernel (they read as zeros when next touched); the
  // partial pages at the ends are zeroed. On huge-page memory MADV_DONTNEED splits a huge page
  // the range covers only in part, and khugepaged would fold the kept 4 KiB pages of that 2 MiB
  // back into a whole one (it collapses a region with a single page present: max_ptes_none is
  // 511 by default), so the range's pages in those two regions leave huge pages for good
  // (MADV_NOHUGEPAGE). A region the range covers whole is left empty, which khugepaged never
  // collapses, and keeps its huge pages for when a later generation holds it again.
  absl::Status Discard(float* dst, int64_t n) override {
    if (n <= 0) return absl::OkStatus();
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t b = reinterpret_cast<uintptr_t>(dst), e = b + n * sizeof(float);
    const uintptr_t pb = (b + page - 1) / page * page, pe = e / page * page;
    if (pb >= pe) return Fill(dst, n, 0.0f);
    constexpr uintptr_t kHuge = base::kHugePageBytes;
    const uintptr_t head_end = std::min(pe, (b + kHuge - 1) / kHuge * kHuge);
    const uintptr_t tail_begin = std::max({pb, head_end, e / kHuge * kHuge});
    // Advice only: EINVAL where the kernel has no transparent huge pages.
    if (head_end > pb) (void)madvise(reinterpret_cast<void*>(pb), head_end - pb, MADV_NOHUGEPAGE);
    if (pe > tail_begin) {
      (void)madvise(reinterpret_cast<void*>(tail_begin), pe - tail_begin, MADV_NOHUGEPAGE);
    }
    if (madvise(reinterpret_cast<void*>(pb), pe - pb, MADV_DONTNEED) != 0) {
      return absl::InternalError(
          absl::StrCat("madvise(MADV_DONTNEED) of ", pe - pb, " bytes: ", std::strerror(errno)));
    }
    std::memset(dst, 0, pb - b);
    std::memset(reinterpret_cast<void*>(pe), 0, e - pe);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(float* host_dst, const float* src, int64_t n) override {
    return Copy(host_dst, src, n);
  }
  absl::Status CopyFromHost(float* dst, const float* host_src, int64_t n) override {
    return Copy(dst, host_src, n);
  }
  // Element-wise, so independent of the thread count.
  absl::Status Add(float* out, const float* x, const float* y, int64_t n) override {
    kernels::ParallelForRange(n, 65536, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = x[i] + y[i];
    });
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<double>> RangeChunkSquareSums(const float* x, int64_t begin,
                                                           int64_t end, int64_t total) override {
    return model::RangeChunkSquareSums(x, begin, end, total);
  }
  absl::Status AdamWUpdateRange(const std::vector<ParamTensor>& tensors, int64_t begin, int64_t end,
                                float* params, const float* grads, float* m, float* v,
                                const AdamWConfig& config, const kernels::AdamWScalars& scalars,
                                const kernels::AdamWSources* from) override {
    model::AdamWUpdateRange(tensors, begin, end, params, grads, m, v, config, scalars, from);
    return absl::OkStatus();
  }

 protected:
  // Huge-page backed from 2 MiB up (base::AllocateBig).
  absl::StatusOr<float*> Allocate(int64_t n) override {
    void* p = base::AllocateBig(static_cast<size_t>(n) * sizeof(float));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host memory: ", n, " floats"));
    }
    return static_cast<float*>(p);
  }
  void Free(float* p, int64_t n) override {
    base::FreeBig(p, static_cast<size_t>(n) * sizeof(float));
  }
};

}  // namespace

ArrayOps& HostArrayOps() {
  static Host* host = new Host();
  return *host;
}

}  // namespace troupe::model
