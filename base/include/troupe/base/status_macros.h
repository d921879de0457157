// troupe/base/status_macros.h — the early returns Debian's Abseil does not ship, for every module
// (host code of .cu files included: nvcc's front end accepts both).
//
//   TROUPE_RETURN_IF_ERROR(store.Commit(manifest));          // an absl::Status or a StatusOr
//   TROUPE_ASSIGN_OR_RETURN(auto record, LoadRecord(fs, path));
//
// A foreign library's return code becomes a Status through that library's one adapter, and then
// goes through the same macro:
//   TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaMemsetAsync(p, 0, n, stream)));   // kernels/cuda
//   TROUPE_RETURN_IF_ERROR(TROUPE_CUBLAS_CALL(cublasLtMatmul(...)));             // kernels/cuda
//   TROUPE_RETURN_IF_ERROR(TROUPE_UCX_CALL(ucp_worker_create(...)));             // collectives
//   TROUPE_RETURN_IF_ERROR(TROUPE_NCCL_STATUS(backend, comm, "ncclSend", r));     // collectives
#ifndef TROUPE_BASE_STATUS_MACROS_H_
#define TROUPE_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::base::status_internal {
inline absl::Status AsStatus(absl::Status s) { return s; }
template <class T>
absl::Status AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace troupe::base::status_internal

#define TROUPE_STATUS_CONCAT_INNER_(a, b) a##b
#define TROUPE_STATUS_CONCAT_(a, b) TROUPE_STATUS_CONCAT_INNER_(a, b)

// Returns the Status (or a StatusOr's status) from the enclosing function unless it is OK. An
// initialization inside the `if`, not an assignment: nvcc's front end flags the discarded Status&
// of `s = expr`.
#define TROUPE_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                   \
    if (::absl::Status troupe_status_ = ::troupe::base::status_internal::AsStatus(expr); \
        !troupe_status_.ok()) {                                                          \
      return troupe_status_;                                                             \
    }                                                                                    \
  } while (false)

// `lhs` = the value of the StatusOr `rexpr`, or return its status from the enclosing function.
#define TROUPE_ASSIGN_OR_RETURN(lhs, rexpr) \
  TROUPE_ASSIGN_OR_RETURN_IMPL_(TROUPE_STATUS_CONCAT_(troupe_statusor_, __LINE__), lhs, rexpr)
#define TROUPE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

#endif  // TROUPE_BASE_STATUS_MACROS_H_
