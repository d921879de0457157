// Turning CUDA runtime and cuBLAS(Lt) return codes into absl::Status, with file:line and the
// failing expression, for the host code around the kernels (allocator, cuBLASLt matmul).
//
// Conventions: each adapter evaluates `expr` once and gives its Status; TROUPE_RETURN_IF_ERROR
// returns it from the enclosing function. The message is
// "file:line: expr: <error name>: <error description>", so a missing driver reads
// "...: cudaGetDeviceCount(&n): cudaErrorInsufficientDriver: CUDA driver version is insufficient
// for CUDA runtime version". Codes map to absl codes by what the caller can do about them: out of
// memory -> ResourceExhausted, no driver / no device / library not initialised ->
// FailedPrecondition, bad arguments -> InvalidArgument, unsupported -> Unimplemented, anything
// else -> Internal. Host C++: compiles under g++ and nvcc. NCCL has its own (collectives/).
//
// Example:
//   absl::Status CopyIn(void* dst, const void* src, size_t n, cudaStream_t s) {
//     TROUPE_RETURN_IF_ERROR(
//         TROUPE_CUDA_CALL(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s)));
//     TROUPE_RETURN_IF_ERROR(
//         TROUPE_CUBLAS_CALL(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)));
//     return absl::OkStatus();
//   }
#ifndef TROUPE_KERNELS_CUDA_CHECK_H_
#define TROUPE_KERNELS_CUDA_CHECK_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"

namespace troupe::kernels::cuda {

inline absl::StatusCode CudaErrorCode(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorInvalidValue:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

inline absl::StatusCode CublasErrorCode(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::StatusCode::kResourceExhausted;
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::StatusCode::kFailedPrecondition;
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::StatusCode::kInvalidArgument;
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

// OK for cudaSuccess; otherwise the code above with "file:line: what: name: description". Also
// clears the runtime's last error (when not sticky), so that a later cudaGetLastError, such as
// TROUPE_LAUNCH's, does not report this failure a second time against an unrelated launch.
inline absl::Status CudaErrorStatus(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return absl::Status(CudaErrorCode(e),
                      absl::StrCat(file, ":", line, ": ", what, ": ", cudaGetErrorName(e), ": ",
                                   cudaGetErrorString(e)));
}

// The device `ordinal` exists, can run troupe_kernels_cuda (sm_80 / sm_90 SASS, compute_90 PTX:
// compute capability 8.0 or newer) and is made current; otherwise FailedPrecondition starting
// with `who` and naming the CUDA runtime's error (e.g. cudaErrorInsufficientDriver where the
// driver is missing) — whatever code the error maps to, it means "no usable GPU here".
inline absl::Status UseKernelDevice(const char* who, int ordinal) {
  auto unusable = [&](const absl::Status& cause) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": no usable CUDA device cuda:", ordinal, ": ", cause.message()));
  };
  int count = 0;
  if (absl::Status s = CudaErrorStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount(&count)",
                                       __FILE__, __LINE__);
      !s.ok()) {
    return unusable(s);
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": no CUDA device cuda:", ordinal, " (this process sees ", count, " device(s))"));
  }
  cudaDeviceProp prop = {};
  if (absl::Status s = CudaErrorStatus(cudaGetDeviceProperties(&prop, ordinal),
                                       "cudaGetDeviceProperties", __FILE__, __LINE__);
      !s.ok()) {
    return unusable(s);
  }
  if (prop.major < 8) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": cuda:", ordinal, " (", prop.name, ") has compute capability ",
                     prop.major, ".", prop.minor, "; the kernels need 8.0 or newer"));
  }
  if (absl::Status s = CudaErrorStatus(cudaSetDevice(ordinal), "cudaSetDevice", __FILE__, __LINE__);
      !s.ok()) {
    return unusable(s);
  }
  return absl::OkStatus();
}

// cuBLASLt's own name/string functions, so that callers need libcublasLt only (not libcublas).
inline absl::Status CublasErrorStatus(cublasStatus_t s, const char* what, const char* file,
                                      int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::Status(CublasErrorCode(s),
                      absl::StrCat(file, ":", line, ": ", what, ": ", cublasLtGetStatusName(s),
                                   ": ", cublasLtGetStatusString(s)));
}

}  // namespace troupe::kernels::cuda

// The Status of one CUDA runtime / cuBLAS(Lt) call (OK on success), naming the expression, for
// TROUPE_RETURN_IF_ERROR (troupe/base/status_macros.h).
#define TROUPE_CUDA_CALL(expr) \
  ::troupe::kernels::cuda::CudaErrorStatus((expr), #expr, __FILE__, __LINE__)
#define TROUPE_CUBLAS_CALL(expr) \
  ::troupe::kernels::cuda::CublasErrorStatus((expr), #expr, __FILE__, __LINE__)

#endif  // TROUPE_KERNELS_CUDA_CHECK_H_
