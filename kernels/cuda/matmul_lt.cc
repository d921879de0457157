#include "matmul_lt.h"

#include <cuda_bf16.h>

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "check.h"
#include "troupe/base/status_macros.h"

namespace troupe::kernels::cuda {
namespace {

constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();  // what cuBLASLt supports

cudaDataType LtType(MatmulDtype t) { return t == MatmulDtype::kBf16 ? CUDA_R_16BF : CUDA_R_32F; }
size_t ElementBytes(MatmulDtype t) { return t == MatmulDtype::kBf16 ? 2 : 4; }

const char* KindName(MatmulKind k) {
  switch (k) {
    case MatmulKind::kForward:
      return "forward";
    case MatmulKind::kBackwardInput:
      return "backward-input";
    case MatmulKind::kBackwardWeight:
      return "backward-weight";
    case MatmulKind::kBackwardBias:
      return "backward-bias";
  }
  return "?";
}

template <typename T>
absl::Status SetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, T value) {
  TROUPE_RETURN_IF_ERROR(
      TROUPE_CUBLAS_CALL(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value))));
  return absl::OkStatus();
}

template <typename T>
absl::Status GetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, T& value) {
  size_t written = 0;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(
      cublasLtMatmulDescGetAttribute(desc, attr, &value, sizeof(value), &written)));
  return absl::OkStatus();
}

template <typename T>
absl::Status GetLayout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, T& value) {
  size_t written = 0;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(
      cublasLtMatrixLayoutGetAttribute(l, attr, &value, sizeof(value), &written)));
  return absl::OkStatus();
}

template <typename T>
absl::Status GetPreference(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                           T& value) {
  size_t written = 0;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(
      cublasLtMatmulPreferenceGetAttribute(p, attr, &value, sizeof(value), &written)));
  return absl::OkStatus();
}

// A column-major layout; the order is set explicitly although COL is the default, so that a
// reader of the descriptor (and ReferenceLtMatmul) never depends on a default.
absl::StatusOr<LtLayout> ColumnMajor(cudaDataType type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(cublasLtMatrixLayoutCreate(
      &raw, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld)));
  LtLayout layout(raw);
  const int32_t order = CUBLASLT_ORDER_COL;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(
      cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order))));
  return layout;
}

absl::Status CheckPointer(const MatmulShape& s, const void* p, const char* name) {
  if (p == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul ", s.ToString(), ": buffers.", name, " is null"));
  }
  if (reinterpret_cast<uintptr_t>(p) % s.alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("matmul ", s.ToString(), ": buffers.", name,
                                                   " is not aligned to ", s.alignment, " bytes"));
  }
  return absl::OkStatus();
}

// --- Plan helpers ---

absl::Status InvalidShape(const MatmulShape& s, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("matmul ", s.ToString(), ": ", why));
}

// What PlanMatmul refuses before it makes any descriptor.
absl::Status CheckShape(const MatmulShape& s) {
  auto invalid = [&](const std::string& why) { return InvalidShape(s, why); };
  const bool uses_c = s.kind != MatmulKind::kBackwardBias;
  if (s.n < 1 || s.oc < 1 || (uses_c && s.c < 1)) return invalid("dimensions must be positive");
  if (s.n > kMaxDim || s.oc > kMaxDim || s.c > kMaxDim) return invalid("dimension beyond int32");
  if (s.alignment == 0 || (s.alignment & (s.alignment - 1)) != 0 ||
      s.alignment < ElementBytes(s.dtype)) {
    return invalid("alignment must be a power of two no smaller than an element");
  }
  if (s.bias && s.kind != MatmulKind::kForward) return invalid("bias is a forward epilogue");
  if (s.gelu && s.kind != MatmulKind::kForward && s.kind != MatmulKind::kBackwardInput) {
    return invalid("gelu applies to forward (GELU) and backward input (DGELU) only");
  }
  // Where beta·C would enter relative to the (D)GELU is not documented: refuse to guess.
  if (s.gelu && s.accumulate) return invalid("gelu with accumulate (beta = 1) is not supported");
  return absl::OkStatus();
}

// The stored (column-major) A and B, [rows, cols, ld = rows], and the operations; see the header.
struct Operands {
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
};

// The GEMM's m, n and k into `p`, and its operands.
Operands SetDimensions(const MatmulShape& s, MatmulPlan* p) {
  Operands o;
  switch (s.kind) {
    case MatmulKind::kForward:  // outᵀ = (weightᵀ)ᵀ · inpᵀ
      p->m = s.oc, p->n = s.n, p->k = s.c;
      o.transa = CUBLAS_OP_T, o.a_rows = s.c, o.a_cols = s.oc;
      o.b_rows = s.c, o.b_cols = s.n;
      break;
    case MatmulKind::kBackwardInput:  // dinpᵀ = weightᵀ · doutᵀ
      p->m = s.c, p->n = s.n, p->k = s.oc;
      o.a_rows = s.c, o.a_cols = s.oc;
      o.b_rows = s.oc, o.b_cols = s.n;
      break;
    case MatmulKind::kBackwardWeight:  // dweightᵀ = inpᵀ · (doutᵀ)ᵀ
      p->m = s.c, p->n = s.oc, p->k = s.n;
      o.a_rows = s.c, o.a_cols = s.n;
      o.transb = CUBLAS_OP_T, o.b_rows = s.oc, o.b_cols = s.n;
      break;
    case MatmulKind::kBackwardBias:  // dbias = doutᵀ · ones
      p->m = s.oc, p->n = 1, p->k = s.n;
      o.a_rows = s.oc, o.a_cols = s.n;
      o.b_rows = s.n, o.b_cols = 1;
      break;
  }
  return o;
}

uint32_t EpilogueOf(const MatmulShape& s) {
  if (s.kind == MatmulKind::kForward) {
    return s.bias && s.gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
           : s.gelu         ? CUBLASLT_EPILOGUE_GELU_AUX
           : s.bias         ? CUBLASLT_EPILOGUE_BIAS
                            : CUBLASLT_EPILOGUE_DEFAULT;
  }
  return s.gelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
}

// The descriptor: fp32 compute, host scalars, the operations and the epilogue.
absl::Status MakeDesc(const MatmulShape& s, const Operands& o, MatmulPlan* p) {
  cublasLtMatmulDesc_t raw_desc = nullptr;
  TROUPE_RETURN_IF_ERROR(
      TROUPE_CUBLAS_CALL(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)));
  p->desc.reset(raw_desc);
  TROUPE_RETURN_IF_ERROR(
      SetDesc<int32_t>(raw_desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST));
  TROUPE_RETURN_IF_ERROR(SetDesc<int32_t>(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, o.transa));
  TROUPE_RETURN_IF_ERROR(SetDesc<int32_t>(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, o.transb));
  const uint32_t epilogue = EpilogueOf(s);
  TROUPE_RETURN_IF_ERROR(SetDesc<uint32_t>(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
  if (s.bias) {
    TROUPE_RETURN_IF_ERROR(
        SetDesc<int32_t>(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, LtType(s.dtype)));
  }
  if (s.gelu) {
    TROUPE_RETURN_IF_ERROR(SetDesc<int64_t>(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p->m));
  }
  return absl::OkStatus();
}

// The four layouts; C = D: accumulation is in place.
absl::Status MakeLayouts(const Operands& o, MatmulPlan* p) {
  const cudaDataType type = LtType(p->shape.dtype);
  TROUPE_ASSIGN_OR_RETURN(auto a, ColumnMajor(type, o.a_rows, o.a_cols, o.a_rows));
  TROUPE_ASSIGN_OR_RETURN(auto b, ColumnMajor(type, o.b_rows, o.b_cols, o.b_rows));
  TROUPE_ASSIGN_OR_RETURN(auto c, ColumnMajor(type, p->m, p->n, p->m));
  TROUPE_ASSIGN_OR_RETURN(auto d, ColumnMajor(type, p->m, p->n, p->m));
  p->a = std::move(a), p->b = std::move(b), p->c = std::move(c), p->d = std::move(d);
  return absl::OkStatus();
}

// The algorithm preference: at most `workspace_bytes`, every matrix aligned as the shape promises.
absl::Status MakePreference(const MatmulShape& s, size_t workspace_bytes, MatmulPlan* p) {
  cublasLtMatmulPreference_t raw_pref = nullptr;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(cublasLtMatmulPreferenceCreate(&raw_pref)));
  p->preference.reset(raw_pref);
  const uint64_t ws = workspace_bytes;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(cublasLtMatmulPreferenceSetAttribute(
      raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws))));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    const uint32_t align = s.alignment;
    TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(
        cublasLtMatmulPreferenceSetAttribute(raw_pref, attr, &align, sizeof(align))));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Shapes and plans

MatmulShape MatmulShape::Forward(int64_t n, int64_t c, int64_t oc, bool bias, bool gelu,
                                 MatmulDtype dtype) {
  MatmulShape s;
  s.kind = MatmulKind::kForward, s.n = n, s.c = c, s.oc = oc, s.dtype = dtype;
  s.bias = bias, s.gelu = gelu, s.accumulate = false;
  return s;
}

MatmulShape MatmulShape::BackwardInput(int64_t n, int64_t c, int64_t oc, bool dgelu,
                                       MatmulDtype dtype) {
  MatmulShape s;
  s.kind = MatmulKind::kBackwardInput, s.n = n, s.c = c, s.oc = oc, s.dtype = dtype;
  // DGELU writes the gradient of the pre-GELU values, which nothing else has touched yet.
  s.gelu = dgelu, s.accumulate = !dgelu;
  return s;
}

MatmulShape MatmulShape::BackwardWeight(int64_t n, int64_t c, int64_t oc, MatmulDtype dtype) {
  MatmulShape s;
  s.kind = MatmulKind::kBackwardWeight, s.n = n, s.c = c, s.oc = oc, s.dtype = dtype;
  s.accumulate = true;
  return s;
}

MatmulShape MatmulShape::BackwardBias(int64_t n, int64_t oc, MatmulDtype dtype) {
  MatmulShape s;
  s.kind = MatmulKind::kBackwardBias, s.n = n, s.c = 0, s.oc = oc, s.dtype = dtype;
  s.accumulate = true;
  return s;
}

std::string MatmulShape::ToString() const {
  return absl::StrCat(KindName(kind), " n=", n, " c=", c, " oc=", oc,
                      dtype == MatmulDtype::kBf16 ? " bf16" : " fp32", bias ? " +bias" : "",
                      gelu ? " +gelu" : "", accumulate ? " beta=1" : " beta=0",
                      " align=", alignment);
}

absl::StatusOr<MatmulPlan> PlanMatmul(const MatmulShape& s, size_t workspace_bytes) {
  TROUPE_RETURN_IF_ERROR(CheckShape(s));
  MatmulPlan p;
  p.shape = s;
  p.alpha = 1.0f;
  p.beta = s.accumulate ? 1.0f : 0.0f;
  const Operands o = SetDimensions(s, &p);
  // The aux matrix has D's shape, column-major with ld = m: the row-major [n, m] pre-GELU values.
  if (s.gelu && p.m % 8 != 0) {
    return InvalidShape(s, absl::StrCat("the GELU aux leading dimension ", p.m,
                                        " must be a multiple of 8 (cuBLASLt)"));
  }
  TROUPE_RETURN_IF_ERROR(MakeDesc(s, o, &p));
  TROUPE_RETURN_IF_ERROR(MakeLayouts(o, &p));
  TROUPE_RETURN_IF_ERROR(MakePreference(s, workspace_bytes, &p));
  return p;
}

absl::StatusOr<LtCall> BindMatmul(MatmulPlan& plan, const MatmulBuffers& buf) {
  const MatmulShape& s = plan.shape;
  LtCall call;
  auto need = [&](const void* p, const char* name) { return CheckPointer(s, p, name); };
  absl::Status st;
  switch (s.kind) {
    case MatmulKind::kForward:
      st.Update(need(buf.weight, "weight")), st.Update(need(buf.inp, "inp"));
      call.a = buf.weight, call.b = buf.inp;
      break;
    case MatmulKind::kBackwardInput:
      st.Update(need(buf.weight, "weight")), st.Update(need(buf.dout, "dout"));
      call.a = buf.weight, call.b = buf.dout;
      break;
    case MatmulKind::kBackwardWeight:
      st.Update(need(buf.inp, "inp")), st.Update(need(buf.dout, "dout"));
      call.a = buf.inp, call.b = buf.dout;
      break;
    case MatmulKind::kBackwardBias:
      st.Update(need(buf.dout, "dout")), st.Update(need(buf.ones, "ones"));
      call.a = buf.dout, call.b = buf.ones;
      break;
  }
  st.Update(need(buf.out, "out"));
  if (s.bias) st.Update(need(buf.bias, "bias"));
  if (s.gelu) st.Update(need(buf.pre_gelu, "pre_gelu"));
  if (!st.ok()) return st;
  if (s.bias) {
    TROUPE_RETURN_IF_ERROR(
        SetDesc<const void*>(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, buf.bias));
  }
  if (s.gelu) {
    TROUPE_RETURN_IF_ERROR(
        SetDesc<void*>(plan.desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, buf.pre_gelu));
  }
  call.desc = plan.desc.get();
  call.alpha = &plan.alpha, call.beta = &plan.beta;
  call.a_layout = plan.a.get(), call.b_layout = plan.b.get();
  call.c = buf.out, call.c_layout = plan.c.get();
  call.d = buf.out, call.d_layout = plan.d.get();
  return call;
}

// ---------------------------------------------------------------------------------------------
// Reading back

absl::StatusOr<LtLayoutInfo> ReadLayout(cublasLtMatrixLayout_t l) {
  if (l == nullptr) return absl::InvalidArgumentError("ReadLayout: null layout");
  LtLayoutInfo info;
  uint32_t type = 0;
  absl::Status st = GetLayout(l, CUBLASLT_MATRIX_LAYOUT_TYPE, type);
  st.Update(GetLayout(l, CUBLASLT_MATRIX_LAYOUT_ORDER, info.order));
  st.Update(GetLayout(l, CUBLASLT_MATRIX_LAYOUT_ROWS, info.rows));
  st.Update(GetLayout(l, CUBLASLT_MATRIX_LAYOUT_COLS, info.cols));
  st.Update(GetLayout(l, CUBLASLT_MATRIX_LAYOUT_LD, info.ld));
  st.Update(GetLayout(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, info.batch_count));
  st.Update(GetLayout(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, info.batch_stride));
  if (!st.ok()) return st;
  info.type = static_cast<int32_t>(type);
  return info;
}

absl::StatusOr<LtDescInfo> ReadDesc(cublasLtMatmulDesc_t d) {
  if (d == nullptr) return absl::InvalidArgumentError("ReadDesc: null descriptor");
  LtDescInfo info;
  absl::Status st = GetDesc(d, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, info.compute_type);
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_SCALE_TYPE, info.scale_type));
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_POINTER_MODE, info.pointer_mode));
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_TRANSA, info.transa));
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_TRANSB, info.transb));
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_TRANSC, info.transc));
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_EPILOGUE, info.epilogue));
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, info.bias_pointer));
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, info.bias_type));
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, info.aux_pointer));
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, info.aux_ld));
  st.Update(GetDesc(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, info.aux_type));
  if (!st.ok()) return st;
  return info;
}

absl::StatusOr<LtPreferenceInfo> ReadPreference(cublasLtMatmulPreference_t p) {
  if (p == nullptr) return absl::InvalidArgumentError("ReadPreference: null preference");
  LtPreferenceInfo info;
  absl::Status st =
      GetPreference(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, info.max_workspace_bytes);
  st.Update(GetPreference(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, info.min_alignment_a));
  st.Update(GetPreference(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, info.min_alignment_b));
  st.Update(GetPreference(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, info.min_alignment_c));
  st.Update(GetPreference(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, info.min_alignment_d));
  if (!st.ok()) return st;
  return info;
}

// ---------------------------------------------------------------------------------------------
// The GPU runner

absl::StatusOr<std::unique_ptr<MatmulRunner>> MatmulRunner::Create(size_t workspace_bytes) {
  // Ask the runtime first: without a driver it names the cause (cudaErrorInsufficientDriver),
  // where cublasLtCreate would only say CUBLAS_STATUS_NOT_INITIALIZED.
  int devices = 0;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaGetDeviceCount(&devices)));
  if (devices == 0) return absl::FailedPreconditionError("MatmulRunner: no CUDA device");
  cublasLtHandle_t handle = nullptr;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(cublasLtCreate(&handle)));
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    if (absl::Status st = CudaErrorStatus(cudaMalloc(&workspace, workspace_bytes),
                                          "cudaMalloc(workspace)", __FILE__, __LINE__);
        !st.ok()) {
      cublasLtDestroy(handle);
      return st;
    }
  }
  return std::unique_ptr<MatmulRunner>(new MatmulRunner(handle, workspace, workspace_bytes));
}

MatmulRunner::~MatmulRunner() {
  cache_.clear();
  for (void* p : ones_) {
    if (p != nullptr) cudaFree(p);
  }
  if (workspace_ != nullptr) cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

absl::StatusOr<const void*> MatmulRunner::Ones(int64_t n, MatmulDtype dtype) {
  const int t = static_cast<int>(dtype);
  if (ones_n_[t] >= n) return ones_[t];
  // Grow; cudaFree waits for the device, so work still reading the old vector finishes first.
  if (ones_[t] != nullptr) TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaFree(ones_[t])));
  ones_[t] = nullptr, ones_n_[t] = 0;
  const size_t bytes = static_cast<size_t>(n) * ElementBytes(dtype);
  TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaMalloc(&ones_[t], bytes)));
  if (dtype == MatmulDtype::kBf16) {
    const std::vector<__nv_bfloat16> host(n, __float2bfloat16(1.0f));
    TROUPE_RETURN_IF_ERROR(
        TROUPE_CUDA_CALL(cudaMemcpy(ones_[t], host.data(), bytes, cudaMemcpyHostToDevice)));
  } else {
    const std::vector<float> host(n, 1.0f);
    TROUPE_RETURN_IF_ERROR(
        TROUPE_CUDA_CALL(cudaMemcpy(ones_[t], host.data(), bytes, cudaMemcpyHostToDevice)));
  }
  ones_n_[t] = n;
  return ones_[t];
}

absl::Status MatmulRunner::Run(const MatmulShape& shape, const MatmulBuffers& buffers,
                               cudaStream_t stream) {
  MatmulBuffers b = buffers;
  if (shape.kind == MatmulKind::kBackwardBias && b.ones == nullptr) {
    TROUPE_ASSIGN_OR_RETURN(auto ones, Ones(shape.n, shape.dtype));
    b.ones = ones;
  }
  auto it = cache_.find(shape);
  const bool fresh = it == cache_.end();
  if (fresh) {
    TROUPE_ASSIGN_OR_RETURN(auto plan, PlanMatmul(shape, workspace_bytes_));
    Entry entry;
    entry.plan = std::move(plan);
    it = cache_.emplace(shape, std::move(entry)).first;
  }
  Entry& e = it->second;
  auto call = BindMatmul(e.plan, b);
  if (!call.ok()) {
    if (fresh) cache_.erase(it);
    return call.status();
  }
  if (fresh) {
    // After binding: the heuristic reads the bias / aux pointers' alignment from the descriptor.
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    if (absl::Status st = CublasErrorStatus(
            cublasLtMatmulAlgoGetHeuristic(handle_, call->desc, call->a_layout, call->b_layout,
                                           call->c_layout, call->d_layout, e.plan.preference.get(),
                                           1, &result, &found),
            "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
        !st.ok() || found == 0) {
      cache_.erase(it);
      if (!st.ok()) return st;
      return absl::NotFoundError(
          absl::StrCat("cuBLASLt has no algorithm for matmul ", shape.ToString()));
    }
    e.algo = result.algo;
    e.workspace_size = result.workspaceSize;
  }
  TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(
      cublasLtMatmul(handle_, call->desc, call->alpha, call->a, call->a_layout, call->b,
                     call->b_layout, call->beta, call->c, call->c_layout, call->d, call->d_layout,
                     &e.algo, workspace_, e.workspace_size, stream)));
  return absl::OkStatus();
}

}  // namespace troupe::kernels::cuda
