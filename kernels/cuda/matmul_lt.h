// The GPT's linear layers on cuBLASLt, in the CPU kernels' layout (troupe/kernels/matmul.h):
// activations row-major [n, c], weight [oc, c] (nn.Linear), out = inp · weightᵀ + bias; backward
// accumulates: dinp += dout · weight, dweight += doutᵀ · inp, dbias += column sums of dout.
// Storage is bf16 (or fp32), accumulation and alpha/beta fp32 (CUBLAS_COMPUTE_32F).
//
// Row-major to cuBLAS's column-major: a row-major [r, c] matrix with leading dimension c, read as
// column-major, is its transpose [c, r] with the same leading dimension. So each layer computes
// the transpose of its row-major product, D = op(A) · op(B), with these stored (column-major)
// operands, every layout CUBLASLT_ORDER_COL:
//   forward          outᵀ [oc, n]        = op_T(weightᵀ [c, oc]) · inpᵀ [c, n]    m=oc n=n  k=c
//   backward input   dinpᵀ [c, n]       += weightᵀ [c, oc] · doutᵀ [oc, n]        m=c  n=n  k=oc
//   backward weight  dweightᵀ [c, oc]   += inpᵀ [c, n] · op_T(doutᵀ [oc, n])      m=c  n=oc k=n
//   backward bias    dbias [oc, 1]      += doutᵀ [oc, n] · ones [n, 1]            m=oc n=1  k=n
// "+=" is beta = 1 with C = D (in place). Epilogues: BIAS (oc = m entries, broadcast over the
// columns), GELU_AUX[_BIAS] (forward: the pre-GELU values also go to the aux matrix, row-major
// [n, oc]), DGELU (backward input: reads the layer input's pre-GELU values [n, c] from the aux
// matrix and writes dpre = GELU'(pre) ∘ (dout · weight), overwriting). The aux leading dimension
// (m) must be a multiple of 8 (cuBLASLt's rule): GELU needs oc (forward) or c (backward) divisible
// by 8. The reference takes GELU as the tanh approximation (troupe/kernels/gelu.h); cuBLASLt
// documents its epilogue only as "GELU", so the GPU test is what confirms that.
//
// Pieces:
//   PlanMatmul(shape): the descriptors for one shape; needs no driver (cuBLASLt creates and sets
//     descriptors on the host), so tests read every attribute back on any machine.
//   MatmulRunner: owns the cuBLASLt handle and workspace; caches plan + heuristic per shape.
//   ReferenceLtMatmul: a CPU cublasLtMatmul that interprets the descriptors as read back (the
//     documented semantics), to check the plans here and to run the GPU path's GEMMs on the CPU.
//
// Example:
//   absl::StatusOr<std::unique_ptr<MatmulRunner>> runner = MatmulRunner::Create();
//   MatmulBuffers fc;  // the MLP's first layer: fch = ln2 · fcwᵀ + fcb, fch_gelu = GELU(fch)
//   fc.out = fch_gelu, fc.inp = ln2, fc.weight = fcw, fc.bias = fcb, fc.pre_gelu = fch;
//   absl::Status st = (*runner)->Run(MatmulShape::Forward(B * T, C, 4 * C, /*bias=*/true,
//                                                         /*gelu=*/true), fc, stream);
//   // On the CPU, the same shapes and roles on host buffers:
//   st = ReferenceMatmul(MatmulShape::BackwardWeight(B * T, C, 4 * C), host_buffers);
#ifndef TROUPE_KERNELS_CUDA_MATMUL_LT_H_
#define TROUPE_KERNELS_CUDA_MATMUL_LT_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::kernels::cuda {

enum class MatmulKind { kForward, kBackwardInput, kBackwardWeight, kBackwardBias };
enum class MatmulDtype { kF32, kBf16 };  // of every matrix, the bias and the aux matrix

// 32 MiB: NVIDIA's recommended cuBLASLt workspace for Hopper (4 MiB suffices before it).
inline constexpr size_t kDefaultMatmulWorkspaceBytes = size_t{32} << 20;

// One linear layer's GEMM. Build it with the factories, which set the conventions above.
struct MatmulShape {
  MatmulKind kind = MatmulKind::kForward;
  int64_t n = 0;   // activation rows (B * T)
  int64_t c = 0;   // input features
  int64_t oc = 0;  // output features
  MatmulDtype dtype = MatmulDtype::kBf16;
  bool bias = false;        // forward: + bias[oc]
  bool gelu = false;        // forward: GELU and aux; backward input: DGELU (see the top)
  bool accumulate = false;  // beta = 1: D += …; otherwise beta = 0: D = …
  // Every pointer passed is a multiple of this many bytes (a power of two). Tells the heuristic
  // which kernels may run; Run() and ReferenceLtMatmul() reject pointers that break it.
  uint32_t alignment = 16;

  static MatmulShape Forward(int64_t n, int64_t c, int64_t oc, bool bias, bool gelu,
                             MatmulDtype dtype = MatmulDtype::kBf16);
  // dinp += dout · weight, or with dgelu: dinp = GELU'(pre) ∘ (dout · weight).
  static MatmulShape BackwardInput(int64_t n, int64_t c, int64_t oc, bool dgelu = false,
                                   MatmulDtype dtype = MatmulDtype::kBf16);
  static MatmulShape BackwardWeight(int64_t n, int64_t c, int64_t oc,
                                    MatmulDtype dtype = MatmulDtype::kBf16);
  static MatmulShape BackwardBias(int64_t n, int64_t oc, MatmulDtype dtype = MatmulDtype::kBf16);

  std::string ToString() const;
  auto Key() const { return std::tie(kind, n, c, oc, dtype, bias, gelu, accumulate, alignment); }
  friend bool operator<(const MatmulShape& x, const MatmulShape& y) { return x.Key() < y.Key(); }
  friend bool operator==(const MatmulShape& x, const MatmulShape& y) { return x.Key() == y.Key(); }
};

// Owning handles for cuBLASLt descriptors (their Destroy functions need no driver).
struct LtDescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LtLayoutDeleter {
  void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct LtPreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using LtDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, LtDescDeleter>;
using LtLayout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LtLayoutDeleter>;
using LtPreference =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, LtPreferenceDeleter>;

// Everything cublasLtMatmul needs for one shape, except the pointers. The epilogue pointers
// (bias, aux) live in `desc` and are set per call by BindMatmul. Not thread-safe: one plan is
// bound and run by one thread at a time.
struct MatmulPlan {
  MatmulShape shape;
  int64_t m = 0, n = 0, k = 0;  // the column-major GEMM: D [m, n] = op(A) [m, k] · op(B) [k, n]
  float alpha = 1.0f;
  float beta = 0.0f;
  LtDesc desc;
  LtLayout a, b, c, d;
  LtPreference preference;
};

// Builds the descriptors for `shape`, or InvalidArgument for a shape cuBLASLt cannot run as
// specified (GELU aux ld not a multiple of 8, DGELU with accumulate, dims beyond int32, …).
absl::StatusOr<MatmulPlan> PlanMatmul(const MatmulShape& shape,
                                      size_t workspace_bytes = kDefaultMatmulWorkspaceBytes);

// The buffers of one call, by their role in the layer; each kind uses some of them:
//   forward:         out [n, oc], inp [n, c], weight [oc, c], bias [oc] (bias), pre_gelu [n, oc]
//                    (gelu, written)
//   backward input:  out = dinp [n, c], dout [n, oc], weight, pre_gelu [n, c] (dgelu, read)
//   backward weight: out = dweight [oc, c], dout, inp
//   backward bias:   out = dbias [oc], dout, ones [n] (null: the runner / reference supplies it)
// All device memory for MatmulRunner, host memory for ReferenceLtMatmul; element type = dtype.
struct MatmulBuffers {
  void* out = nullptr;
  const void* inp = nullptr;
  const void* weight = nullptr;
  const void* dout = nullptr;
  const void* bias = nullptr;
  void* pre_gelu = nullptr;
  const void* ones = nullptr;
};

// The arguments of one cublasLtMatmul call, minus handle, algo, workspace and stream.
struct LtCall {
  cublasLtMatmulDesc_t desc = nullptr;
  const float* alpha = nullptr;
  const void* a = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr;
  const void* b = nullptr;
  cublasLtMatrixLayout_t b_layout = nullptr;
  const float* beta = nullptr;
  const void* c = nullptr;
  cublasLtMatrixLayout_t c_layout = nullptr;
  void* d = nullptr;
  cublasLtMatrixLayout_t d_layout = nullptr;
};

// Maps the buffers onto A, B, C = D per the table at the top, checks that the ones the kind
// needs are there and aligned, and sets the bias / aux pointers in plan.desc.
absl::StatusOr<LtCall> BindMatmul(MatmulPlan& plan, const MatmulBuffers& buffers);

// Runs the plans on the GPU. Not thread-safe, and one stream at a time: the workspace is shared
// by all calls. cuBLAS results are bitwise reproducible run to run on the same GPU model with one
// stream (cuBLAS documentation), and the algorithm is chosen once per shape.
class MatmulRunner {
 public:
  // Fails with FailedPrecondition naming the cause (e.g. cudaErrorInsufficientDriver) where no
  // GPU can be used. Uses the current device.
  static absl::StatusOr<std::unique_ptr<MatmulRunner>> Create(
      size_t workspace_bytes = kDefaultMatmulWorkspaceBytes);
  ~MatmulRunner();
  MatmulRunner(const MatmulRunner&) = delete;
  MatmulRunner& operator=(const MatmulRunner&) = delete;

  // Plans `shape` and asks the heuristic for an algorithm the first time; then reuses both.
  absl::Status Run(const MatmulShape& shape, const MatmulBuffers& buffers, cudaStream_t stream);

  size_t cached_shapes() const { return cache_.size(); }

 private:
  struct Entry {
    MatmulPlan plan;
    cublasLtMatmulAlgo_t algo;
    size_t workspace_size = 0;  // what the chosen algorithm needs, ≤ workspace_bytes_
  };
  MatmulRunner(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}
  absl::StatusOr<const void*> Ones(int64_t n, MatmulDtype dtype);

  cublasLtHandle_t handle_;
  void* workspace_;
  size_t workspace_bytes_;
  void* ones_[2] = {nullptr, nullptr};  // per MatmulDtype, device vectors of ones
  int64_t ones_n_[2] = {0, 0};
  std::map<MatmulShape, Entry> cache_;
};

// ---------------------------------------------------------------------------------------------
// Reading descriptors back (no driver needed).

struct LtLayoutInfo {
  int32_t type = -1;   // cudaDataType
  int32_t order = -1;  // cublasLtOrder_t
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch_count = 0;
  int64_t batch_stride = 0;
};
absl::StatusOr<LtLayoutInfo> ReadLayout(cublasLtMatrixLayout_t layout);

struct LtDescInfo {
  int32_t compute_type = -1;                      // cublasComputeType_t
  int32_t scale_type = -1;                        // cudaDataType
  int32_t pointer_mode = -1;                      // cublasLtPointerMode_t
  int32_t transa = -1, transb = -1, transc = -1;  // cublasOperation_t
  uint32_t epilogue = 0;                          // cublasLtEpilogue_t
  const void* bias_pointer = nullptr;
  int32_t bias_type = -1;  // cudaDataType, -1: D's type
  void* aux_pointer = nullptr;
  int64_t aux_ld = 0;
  int32_t aux_type = -1;  // cudaDataType, -1: D's type
};
absl::StatusOr<LtDescInfo> ReadDesc(cublasLtMatmulDesc_t desc);

struct LtPreferenceInfo {
  uint64_t max_workspace_bytes = 0;
  uint32_t min_alignment_a = 0, min_alignment_b = 0, min_alignment_c = 0, min_alignment_d = 0;
};
absl::StatusOr<LtPreferenceInfo> ReadPreference(cublasLtMatmulPreference_t preference);

// ---------------------------------------------------------------------------------------------
// CPU interpretation

// What cublasLtMatmul computes for these arguments, per the cuBLAS documentation, on host
// memory: D = epilogue(alpha · op(A) · op(B) + beta · C + bias), each element accumulated in fp32
// over k in order, C not read when beta = 0, stored by a single rounding to D's type. Reads every
// descriptor attribute it depends on; InvalidArgument for arguments cublasLtMatmul would refuse
// (inconsistent dims, small ld, C = D with different layouts, misaligned aux ld, null pointers),
// Unimplemented for features outside what the plans use (batches, ordering other than row/col,
// types other than fp32/bf16, compute type other than 32F, other epilogues, device pointer mode).
absl::Status ReferenceLtMatmul(const LtCall& call);

// PlanMatmul + BindMatmul + ReferenceLtMatmul; supplies the ones for kBackwardBias.
absl::Status ReferenceMatmul(const MatmulShape& shape, const MatmulBuffers& buffers);

}  // namespace troupe::kernels::cuda

#endif  // TROUPE_KERNELS_CUDA_MATMUL_LT_H_
