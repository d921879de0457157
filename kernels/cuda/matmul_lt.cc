#include "matmul_lt.h"

#include <cuda_bf16.h>

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "check.h"

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
  TROUPE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
  return absl::OkStatus();
}

template <typename T>
absl::Status GetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, T& value) {
  size_t written = 0;
  TROUPE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescGetAttribute(desc, attr, &value, sizeof(value), &written));
  return absl::OkStatus();
}

template <typename T>
absl::Status GetLayout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, T& value) {
  size_t written = 0;
  TROUPE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutGetAttribute(l, attr, &value, sizeof(value), &written));
  return absl::OkStatus();
}

template <typename T>
absl::Status GetPreference(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                           T& value) {
  size_t written = 0;
  TROUPE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulPreferenceGetAttribute(p, attr, &value, sizeof(value), &written));
  return absl::OkStatus();
}

// A column-major layout; the order is set explicitly although COL is the default, so that a
// reader of the descriptor (and ReferenceLtMatmul) never depends on a default.
absl::StatusOr<LtLayout> ColumnMajor(cudaDataType type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  TROUPE_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(rows),
                                                           static_cast<uint64_t>(cols), ld));
  LtLayout layout(raw);
  const int32_t order = CUBLASLT_ORDER_COL;
  TROUPE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)));
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

// --- CPU interpretation helpers ---

bool SupportedType(int32_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

float Load(const void* p, int32_t type, int64_t i) {
  if (type == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

void Store(void* p, int32_t type, int64_t i, float v) {
  if (type == CUDA_R_16BF) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);  // round to nearest even
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// Offset of element (r, c) of a stored matrix.
int64_t At(const LtLayoutInfo& l, int64_t r, int64_t c) {
  return l.order == CUBLASLT_ORDER_ROW ? r * l.ld + c : r + c * l.ld;
}

// GELU, tanh approximation, and its derivative, in fp32 as an epilogue computes them.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
float Gelu(float x) {
  const float t = std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x));
  return 0.5f * x * (1.0f + t);
}
float GeluGrad(float x) {
  const float t = std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

absl::Status CheckLayout(const LtLayoutInfo& l, const char* name) {
  if (l.batch_count != 1) {
    return absl::UnimplementedError(absl::StrCat(name, ": batch count ", l.batch_count));
  }
  if (l.order != CUBLASLT_ORDER_COL && l.order != CUBLASLT_ORDER_ROW) {
    return absl::UnimplementedError(absl::StrCat(name, ": order ", l.order));
  }
  if (!SupportedType(l.type)) {
    return absl::UnimplementedError(absl::StrCat(name, ": data type ", l.type));
  }
  const uint64_t min_ld = l.order == CUBLASLT_ORDER_COL ? l.rows : l.cols;
  if (l.rows == 0 || l.cols == 0 || l.ld < 1 || static_cast<uint64_t>(l.ld) < min_ld) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", l.rows, " x ", l.cols, " with leading dimension ", l.ld));
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
  auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("matmul ", s.ToString(), ": ", why));
  };
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

  MatmulPlan p;
  p.shape = s;
  p.alpha = 1.0f;
  p.beta = s.accumulate ? 1.0f : 0.0f;
  const cudaDataType type = LtType(s.dtype);
  // The stored (column-major) A and B, [rows, cols, ld], and the operations; see the header.
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  switch (s.kind) {
    case MatmulKind::kForward:  // outᵀ = (weightᵀ)ᵀ · inpᵀ
      p.m = s.oc, p.n = s.n, p.k = s.c;
      transa = CUBLAS_OP_T, a_rows = s.c, a_cols = s.oc;
      b_rows = s.c, b_cols = s.n;
      break;
    case MatmulKind::kBackwardInput:  // dinpᵀ = weightᵀ · doutᵀ
      p.m = s.c, p.n = s.n, p.k = s.oc;
      a_rows = s.c, a_cols = s.oc;
      b_rows = s.oc, b_cols = s.n;
      break;
    case MatmulKind::kBackwardWeight:  // dweightᵀ = inpᵀ · (doutᵀ)ᵀ
      p.m = s.c, p.n = s.oc, p.k = s.n;
      a_rows = s.c, a_cols = s.n;
      transb = CUBLAS_OP_T, b_rows = s.oc, b_cols = s.n;
      break;
    case MatmulKind::kBackwardBias:  // dbias = doutᵀ · ones
      p.m = s.oc, p.n = 1, p.k = s.n;
      a_rows = s.oc, a_cols = s.n;
      b_rows = s.n, b_cols = 1;
      break;
  }
  // The aux matrix has D's shape, column-major with ld = m: the row-major [n, m] pre-GELU values.
  if (s.gelu && p.m % 8 != 0) {
    return invalid(absl::StrCat("the GELU aux leading dimension ", p.m,
                                " must be a multiple of 8 (cuBLASLt)"));
  }

  cublasLtMatmulDesc_t raw_desc = nullptr;
  TROUPE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  p.desc.reset(raw_desc);
  if (auto st =
          SetDesc<int32_t>(raw_desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST);
      !st.ok()) {
    return st;
  }
  if (auto st = SetDesc<int32_t>(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, transa); !st.ok())
    return st;
  if (auto st = SetDesc<int32_t>(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, transb); !st.ok())
    return st;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (s.kind == MatmulKind::kForward) {
    epilogue = s.bias && s.gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
               : s.gelu         ? CUBLASLT_EPILOGUE_GELU_AUX
               : s.bias         ? CUBLASLT_EPILOGUE_BIAS
                                : CUBLASLT_EPILOGUE_DEFAULT;
  } else if (s.gelu) {
    epilogue = CUBLASLT_EPILOGUE_DGELU;
  }
  if (auto st = SetDesc<uint32_t>(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue); !st.ok()) {
    return st;
  }
  if (s.bias) {
    if (auto st = SetDesc<int32_t>(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type); !st.ok()) {
      return st;
    }
  }
  if (s.gelu) {
    if (auto st = SetDesc<int64_t>(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.m); !st.ok()) {
      return st;
    }
  }

  auto a = ColumnMajor(type, a_rows, a_cols, a_rows);
  if (!a.ok()) return a.status();
  auto b = ColumnMajor(type, b_rows, b_cols, b_rows);
  if (!b.ok()) return b.status();
  auto c = ColumnMajor(type, p.m, p.n, p.m);  // C = D: accumulation is in place
  if (!c.ok()) return c.status();
  auto d = ColumnMajor(type, p.m, p.n, p.m);
  if (!d.ok()) return d.status();
  p.a = std::move(*a), p.b = std::move(*b), p.c = std::move(*c), p.d = std::move(*d);

  cublasLtMatmulPreference_t raw_pref = nullptr;
  TROUPE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_pref));
  p.preference.reset(raw_pref);
  const uint64_t ws = workspace_bytes;
  TROUPE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    const uint32_t align = s.alignment;
    TROUPE_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulPreferenceSetAttribute(raw_pref, attr, &align, sizeof(align)));
  }
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
    if (auto e = SetDesc<const void*>(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, buf.bias);
        !e.ok()) {
      return e;
    }
  }
  if (s.gelu) {
    if (auto e = SetDesc<void*>(plan.desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                buf.pre_gelu);
        !e.ok()) {
      return e;
    }
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
// CPU interpretation

absl::Status ReferenceLtMatmul(const LtCall& call) {
  auto invalid = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("ReferenceLtMatmul: ", why));
  };
  auto unimplemented = [](const std::string& why) {
    return absl::UnimplementedError(absl::StrCat("ReferenceLtMatmul: ", why));
  };
  auto desc = ReadDesc(call.desc);
  if (!desc.ok()) return desc.status();
  auto la = ReadLayout(call.a_layout);
  if (!la.ok()) return la.status();
  auto lb = ReadLayout(call.b_layout);
  if (!lb.ok()) return lb.status();
  auto lc = ReadLayout(call.c_layout);
  if (!lc.ok()) return lc.status();
  auto ld = ReadLayout(call.d_layout);
  if (!ld.ok()) return ld.status();
  const std::pair<const LtLayoutInfo*, const char*> layouts[] = {
      {&*la, "A"}, {&*lb, "B"}, {&*lc, "C"}, {&*ld, "D"}};
  for (const auto& [l, name] : layouts) {
    if (auto st = CheckLayout(*l, name); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("ReferenceLtMatmul: ", st.message()));
    }
  }

  if (desc->compute_type != CUBLAS_COMPUTE_32F) {
    return unimplemented(absl::StrCat("compute type ", desc->compute_type));
  }
  if (desc->scale_type != CUDA_R_32F) {
    return unimplemented(absl::StrCat("scale type ", desc->scale_type));
  }
  if (desc->pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
    return unimplemented(absl::StrCat("pointer mode ", desc->pointer_mode));
  }
  if (desc->transc != CUBLAS_OP_N) return invalid("TRANSC must be CUBLAS_OP_N");
  for (int32_t t : {desc->transa, desc->transb}) {
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T) return unimplemented(absl::StrCat("operation ", t));
  }

  // Dimensions: D is m x n; op(A) m x k; op(B) k x n; C like D.
  const bool ta = desc->transa == CUBLAS_OP_T, tb = desc->transb == CUBLAS_OP_T;
  const int64_t m = static_cast<int64_t>(ld->rows), n = static_cast<int64_t>(ld->cols);
  const int64_t a_m = static_cast<int64_t>(ta ? la->cols : la->rows);
  const int64_t k = static_cast<int64_t>(ta ? la->rows : la->cols);
  const int64_t b_k = static_cast<int64_t>(tb ? lb->cols : lb->rows);
  const int64_t b_n = static_cast<int64_t>(tb ? lb->rows : lb->cols);
  if (a_m != m || b_k != k || b_n != n || lc->rows != ld->rows || lc->cols != ld->cols) {
    return invalid(absl::StrCat("op(A) ", a_m, "x", k, ", op(B) ", b_k, "x", b_n, ", C ", lc->rows,
                                "x", lc->cols, ", D ", m, "x", n, " do not conform"));
  }
  if (call.alpha == nullptr || call.beta == nullptr) return invalid("null alpha or beta");
  const float alpha = *call.alpha, beta = *call.beta;
  if (call.a == nullptr || call.b == nullptr || call.d == nullptr) return invalid("null A, B or D");
  if (beta != 0.0f && call.c == nullptr) return invalid("null C with beta != 0");
  // In place (C = D) needs C and D described alike (cuBLASLt's rule).
  if (call.c == call.d && (lc->order != ld->order || lc->ld != ld->ld || lc->type != ld->type)) {
    return invalid("C = D in place with different layouts");
  }

  // Epilogue.
  const uint32_t epi = desc->epilogue;
  bool bias = false, gelu = false, aux_out = false, dgelu = false;
  switch (epi) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      break;
    case CUBLASLT_EPILOGUE_BIAS:
      bias = true;
      break;
    case CUBLASLT_EPILOGUE_GELU:
      gelu = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      gelu = bias = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_AUX:
      gelu = aux_out = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      gelu = aux_out = bias = true;
      break;
    case CUBLASLT_EPILOGUE_DGELU:
      dgelu = true;
      break;
    default:
      return unimplemented(absl::StrCat("epilogue ", epi));
  }
  const int32_t bias_type = desc->bias_type == -1 ? ld->type : desc->bias_type;
  if (bias) {
    if (desc->bias_pointer == nullptr) return invalid("BIAS epilogue with a null bias pointer");
    if (!SupportedType(bias_type)) return unimplemented(absl::StrCat("bias type ", bias_type));
  }
  const int32_t aux_type = desc->aux_type == -1 ? ld->type : desc->aux_type;
  if (aux_out || dgelu) {
    if (desc->aux_pointer == nullptr) return invalid("GELU aux epilogue with a null aux pointer");
    if (desc->aux_ld < m || desc->aux_ld % 8 != 0) {
      return invalid(absl::StrCat("aux leading dimension ", desc->aux_ld, " must be >= rows of D (",
                                  m, ") and a multiple of 8"));
    }
    if (ld->order != CUBLASLT_ORDER_COL) return unimplemented("aux epilogue with D not COL");
    if (!SupportedType(aux_type)) return unimplemented(absl::StrCat("aux type ", aux_type));
  }
  if (dgelu && beta != 0.0f) {
    return unimplemented("DGELU with beta != 0: the documentation leaves the order open");
  }

  // op(A) as row-major [m, k] and op(B) transposed as row-major [n, k], in float, so that every
  // dot product runs over contiguous memory in the order p = 0 .. k-1.
  std::vector<float> opa(m * k), opbt(n * k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      opa[i * k + p] = Load(call.a, la->type, ta ? At(*la, p, i) : At(*la, i, p));
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) {
      opbt[j * k + p] = Load(call.b, lb->type, tb ? At(*lb, j, p) : At(*lb, p, j));
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      const float* arow = &opa[i * k];
      const float* brow = &opbt[j * k];
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p) acc += arow[p] * brow[p];
      float x = alpha * acc;
      if (beta != 0.0f) x += beta * Load(call.c, lc->type, At(*lc, i, j));
      if (bias) x += Load(desc->bias_pointer, bias_type, i);
      const int64_t aux_at = i + j * desc->aux_ld;
      if (aux_out) Store(desc->aux_pointer, aux_type, aux_at, x);
      if (gelu) x = Gelu(x);
      if (dgelu) x *= GeluGrad(Load(desc->aux_pointer, aux_type, aux_at));
      Store(call.d, ld->type, At(*ld, i, j), x);
    }
  }
  return absl::OkStatus();
}

absl::Status ReferenceMatmul(const MatmulShape& shape, const MatmulBuffers& buffers) {
  auto plan = PlanMatmul(shape);
  if (!plan.ok()) return plan.status();
  MatmulBuffers b = buffers;
  std::vector<float> ones_f;
  std::vector<__nv_bfloat16> ones_bf;
  if (shape.kind == MatmulKind::kBackwardBias && b.ones == nullptr) {
    if (shape.dtype == MatmulDtype::kBf16) {
      ones_bf.assign(shape.n, __float2bfloat16(1.0f));
      b.ones = ones_bf.data();
    } else {
      ones_f.assign(shape.n, 1.0f);
      b.ones = ones_f.data();
    }
  }
  auto call = BindMatmul(*plan, b);
  if (!call.ok()) return call.status();
  return ReferenceLtMatmul(*call);
}

// ---------------------------------------------------------------------------------------------
// The GPU runner

absl::StatusOr<std::unique_ptr<MatmulRunner>> MatmulRunner::Create(size_t workspace_bytes) {
  // Ask the runtime first: without a driver it names the cause (cudaErrorInsufficientDriver),
  // where cublasLtCreate would only say CUBLAS_STATUS_NOT_INITIALIZED.
  int devices = 0;
  TROUPE_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&devices));
  if (devices == 0) return absl::FailedPreconditionError("MatmulRunner: no CUDA device");
  cublasLtHandle_t handle = nullptr;
  TROUPE_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
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
  if (ones_[t] != nullptr) TROUPE_CUDA_RETURN_IF_ERROR(cudaFree(ones_[t]));
  ones_[t] = nullptr, ones_n_[t] = 0;
  const size_t bytes = static_cast<size_t>(n) * ElementBytes(dtype);
  TROUPE_CUDA_RETURN_IF_ERROR(cudaMalloc(&ones_[t], bytes));
  if (dtype == MatmulDtype::kBf16) {
    const std::vector<__nv_bfloat16> host(n, __float2bfloat16(1.0f));
    TROUPE_CUDA_RETURN_IF_ERROR(cudaMemcpy(ones_[t], host.data(), bytes, cudaMemcpyHostToDevice));
  } else {
    const std::vector<float> host(n, 1.0f);
    TROUPE_CUDA_RETURN_IF_ERROR(cudaMemcpy(ones_[t], host.data(), bytes, cudaMemcpyHostToDevice));
  }
  ones_n_[t] = n;
  return ones_[t];
}

absl::Status MatmulRunner::Run(const MatmulShape& shape, const MatmulBuffers& buffers,
                               cudaStream_t stream) {
  MatmulBuffers b = buffers;
  if (shape.kind == MatmulKind::kBackwardBias && b.ones == nullptr) {
    auto ones = Ones(shape.n, shape.dtype);
    if (!ones.ok()) return ones.status();
    b.ones = *ones;
  }
  auto it = cache_.find(shape);
  const bool fresh = it == cache_.end();
  if (fresh) {
    auto plan = PlanMatmul(shape, workspace_bytes_);
    if (!plan.ok()) return plan.status();
    Entry entry;
    entry.plan = std::move(*plan);
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
  TROUPE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, call->desc, call->alpha, call->a,
                                               call->a_layout, call->b, call->b_layout, call->beta,
                                               call->c, call->c_layout, call->d, call->d_layout,
                                               &e.algo, workspace_, e.workspace_size, stream));
  return absl::OkStatus();
}

}  // namespace troupe::kernels::cuda
