// The CPU interpretation of a cuBLASLt call (matmul_lt.h's ReferenceLtMatmul and
// ReferenceMatmul): the descriptors as read back, computed with the documented semantics.
#include <cuda_bf16.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "matmul_lt.h"
#include "troupe/base/status_macros.h"

namespace troupe::kernels::cuda {
namespace {

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

absl::Status RefInvalid(const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("ReferenceLtMatmul: ", why));
}
absl::Status RefUnimplemented(const std::string& why) {
  return absl::UnimplementedError(absl::StrCat("ReferenceLtMatmul: ", why));
}

// A call's descriptor and layouts, as read back.
struct LtCallInfo {
  LtDescInfo desc;
  LtLayoutInfo a, b, c, d;
};

// Reads the descriptor and the four layouts, then checks each layout.
absl::StatusOr<LtCallInfo> ReadCall(const LtCall& call) {
  TROUPE_ASSIGN_OR_RETURN(LtDescInfo desc, ReadDesc(call.desc));
  LtCallInfo in{desc, {}, {}, {}, {}};
  const cublasLtMatrixLayout_t raw[] = {call.a_layout, call.b_layout, call.c_layout, call.d_layout};
  LtLayoutInfo* const info[] = {&in.a, &in.b, &in.c, &in.d};
  const char* const name[] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    TROUPE_ASSIGN_OR_RETURN(LtLayoutInfo l, ReadLayout(raw[i]));
    *info[i] = l;
  }
  for (int i = 0; i < 4; ++i) {
    if (auto st = CheckLayout(*info[i], name[i]); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("ReferenceLtMatmul: ", st.message()));
    }
  }
  return in;
}

// The descriptor settings the reference computes: fp32 compute and scale, host scalars, C as
// stored, A and B as stored or transposed.
absl::Status CheckDescSettings(const LtDescInfo& desc) {
  if (desc.compute_type != CUBLAS_COMPUTE_32F) {
    return RefUnimplemented(absl::StrCat("compute type ", desc.compute_type));
  }
  if (desc.scale_type != CUDA_R_32F) {
    return RefUnimplemented(absl::StrCat("scale type ", desc.scale_type));
  }
  if (desc.pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
    return RefUnimplemented(absl::StrCat("pointer mode ", desc.pointer_mode));
  }
  if (desc.transc != CUBLAS_OP_N) return RefInvalid("TRANSC must be CUBLAS_OP_N");
  for (int32_t t : {desc.transa, desc.transb}) {
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T) {
      return RefUnimplemented(absl::StrCat("operation ", t));
    }
  }
  return absl::OkStatus();
}

// What the epilogue adds to alpha · op(A) · op(B) + beta · C (bias and aux types default to D's).
struct Epilogue {
  bool bias = false, gelu = false, aux_out = false, dgelu = false;
  int32_t bias_type = 0, aux_type = 0;
};

// The descriptor's epilogue, for a D of `m` rows laid out as `ld`.
absl::StatusOr<Epilogue> ReadEpilogue(const LtDescInfo& desc, const LtLayoutInfo& ld, int64_t m,
                                      float beta) {
  Epilogue e;
  switch (desc.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      break;
    case CUBLASLT_EPILOGUE_BIAS:
      e.bias = true;
      break;
    case CUBLASLT_EPILOGUE_GELU:
      e.gelu = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      e.gelu = e.bias = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_AUX:
      e.gelu = e.aux_out = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      e.gelu = e.aux_out = e.bias = true;
      break;
    case CUBLASLT_EPILOGUE_DGELU:
      e.dgelu = true;
      break;
    default:
      return RefUnimplemented(absl::StrCat("epilogue ", desc.epilogue));
  }
  e.bias_type = desc.bias_type == -1 ? ld.type : desc.bias_type;
  if (e.bias) {
    if (desc.bias_pointer == nullptr) return RefInvalid("BIAS epilogue with a null bias pointer");
    if (!SupportedType(e.bias_type)) {
      return RefUnimplemented(absl::StrCat("bias type ", e.bias_type));
    }
  }
  e.aux_type = desc.aux_type == -1 ? ld.type : desc.aux_type;
  if (e.aux_out || e.dgelu) {
    if (desc.aux_pointer == nullptr) return RefInvalid("GELU aux epilogue with a null aux pointer");
    if (desc.aux_ld < m || desc.aux_ld % 8 != 0) {
      return RefInvalid(absl::StrCat("aux leading dimension ", desc.aux_ld,
                                     " must be >= rows of D (", m, ") and a multiple of 8"));
    }
    if (ld.order != CUBLASLT_ORDER_COL) return RefUnimplemented("aux epilogue with D not COL");
    if (!SupportedType(e.aux_type)) return RefUnimplemented(absl::StrCat("aux type ", e.aux_type));
  }
  if (e.dgelu && beta != 0.0f) {
    return RefUnimplemented("DGELU with beta != 0: the documentation leaves the order open");
  }
  return e;
}

// D = epilogue(alpha · op(A) · op(B) + beta · C) for a checked call, D m x n, op(A) m x k.
void ComputeReference(const LtCall& call, const LtCallInfo& in, const Epilogue& e, int64_t m,
                      int64_t n, int64_t k) {
  const LtLayoutInfo &la = in.a, &lb = in.b, &lc = in.c, &ld = in.d;
  const bool ta = in.desc.transa == CUBLAS_OP_T, tb = in.desc.transb == CUBLAS_OP_T;
  const float alpha = *call.alpha, beta = *call.beta;
  // op(A) as row-major [m, k] and op(B) transposed as row-major [n, k], in float, so that every
  // dot product runs over contiguous memory in the order p = 0 .. k-1.
  std::vector<float> opa(m * k), opbt(n * k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      opa[i * k + p] = Load(call.a, la.type, ta ? At(la, p, i) : At(la, i, p));
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) {
      opbt[j * k + p] = Load(call.b, lb.type, tb ? At(lb, j, p) : At(lb, p, j));
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      const float* arow = &opa[i * k];
      const float* brow = &opbt[j * k];
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p) acc += arow[p] * brow[p];
      float x = alpha * acc;
      if (beta != 0.0f) x += beta * Load(call.c, lc.type, At(lc, i, j));
      if (e.bias) x += Load(in.desc.bias_pointer, e.bias_type, i);
      const int64_t aux_at = i + j * in.desc.aux_ld;
      if (e.aux_out) Store(in.desc.aux_pointer, e.aux_type, aux_at, x);
      if (e.gelu) x = Gelu(x);
      if (e.dgelu) x *= GeluGrad(Load(in.desc.aux_pointer, e.aux_type, aux_at));
      Store(call.d, ld.type, At(ld, i, j), x);
    }
  }
}

}  // namespace

absl::Status ReferenceLtMatmul(const LtCall& call) {
  absl::StatusOr<LtCallInfo> in = ReadCall(call);
  if (!in.ok()) return in.status();
  TROUPE_RETURN_IF_ERROR(CheckDescSettings(in->desc));

  // Dimensions: D is m x n; op(A) m x k; op(B) k x n; C like D.
  const LtLayoutInfo &la = in->a, &lb = in->b, &lc = in->c, &ld = in->d;
  const bool ta = in->desc.transa == CUBLAS_OP_T, tb = in->desc.transb == CUBLAS_OP_T;
  const int64_t m = static_cast<int64_t>(ld.rows), n = static_cast<int64_t>(ld.cols);
  const int64_t a_m = static_cast<int64_t>(ta ? la.cols : la.rows);
  const int64_t k = static_cast<int64_t>(ta ? la.rows : la.cols);
  const int64_t b_k = static_cast<int64_t>(tb ? lb.cols : lb.rows);
  const int64_t b_n = static_cast<int64_t>(tb ? lb.rows : lb.cols);
  if (a_m != m || b_k != k || b_n != n || lc.rows != ld.rows || lc.cols != ld.cols) {
    return RefInvalid(absl::StrCat("op(A) ", a_m, "x", k, ", op(B) ", b_k, "x", b_n, ", C ",
                                   lc.rows, "x", lc.cols, ", D ", m, "x", n, " do not conform"));
  }
  if (call.alpha == nullptr || call.beta == nullptr) return RefInvalid("null alpha or beta");
  const float beta = *call.beta;
  if (call.a == nullptr || call.b == nullptr || call.d == nullptr) {
    return RefInvalid("null A, B or D");
  }
  if (beta != 0.0f && call.c == nullptr) return RefInvalid("null C with beta != 0");
  // In place (C = D) needs C and D described alike (cuBLASLt's rule).
  if (call.c == call.d && (lc.order != ld.order || lc.ld != ld.ld || lc.type != ld.type)) {
    return RefInvalid("C = D in place with different layouts");
  }
  TROUPE_ASSIGN_OR_RETURN(Epilogue epilogue, ReadEpilogue(in->desc, ld, m, beta));
  ComputeReference(call, *in, epilogue, m, n, k);
  return absl::OkStatus();
}

absl::Status ReferenceMatmul(const MatmulShape& shape, const MatmulBuffers& buffers) {
  TROUPE_ASSIGN_OR_RETURN(auto plan, PlanMatmul(shape));
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
  TROUPE_ASSIGN_OR_RETURN(auto call, BindMatmul(plan, b));
  return ReferenceLtMatmul(call);
}

}  // namespace troupe::kernels::cuda
