// Private: the NCCL and CUDA runtime calls the NCCL communicator makes, behind one interface, so
// its logic (deadlines, polling, sticky failure, abort, the unique id through the bootstrap,
// validation) is written once and tested without a GPU against an in-process fake (nccl_fake.h).
//
// Conventions: each method is one NCCL or CUDA runtime call (AddF32: one kernel launch of ours)
// with the library's own semantics and return code, nothing added — no retries, no Status. The
// codes are the libraries' numbers (`NcclResult` mirrors ncclResult_t; `CudaError` is
// cudaError_t's value), so the communicator decides what a code means (in progress, not ready, a
// peer's failure) and turns it into a Status with file:line in one place. Handles are opaque
// pointers (ncclComm_t, cudaStream_t, cudaEvent_t) so this header needs neither nccl.h nor
// cuda_runtime.h and the logic builds without CUDA.
// Thread safety as the libraries': calls on one communicator are serialised by the caller.
//
// Example (a test): a fake world whose ranks are threads of this process —
//   auto world = FakeNcclWorld::Create();
//   auto comm = CreateNcclCommunicator(bootstrap, options, world->Process(rank));
#ifndef TROUPE_COLLECTIVES_NCCL_BACKEND_H_
#define TROUPE_COLLECTIVES_NCCL_BACKEND_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "troupe/collectives/bootstrap.h"
#include "troupe/collectives/communicator.h"
#include "troupe/collectives/nccl_communicator.h"

namespace troupe::collectives {

// ncclResult_t's values (static_assert'ed against nccl.h by the real backend).
enum class NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,  // a peer failed or the network broke (NCCL cannot tell which)
  kInProgress = 7,   // non-blocking mode: poll CommGetAsyncError until it settles
};
// "ncclRemoteError" etc.; "ncclResult(<n>)" for a value outside the enum.
std::string NcclResultName(NcclResult r);

// cudaError_t's value. Only these two have a meaning the communicator relies on.
using CudaError = int;
inline constexpr CudaError kCudaSuccess = 0;
inline constexpr CudaError kCudaErrorNotReady = 600;  // cudaEventQuery: work still pending

struct NcclUniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};

using NcclCommHandle = struct NcclCommOpaque*;  // ncclComm_t
using StreamHandle = struct CudaStreamOpaque*;  // cudaStream_t
using EventHandle = struct CudaEventOpaque*;    // cudaEvent_t

class NcclBackend {
 public:
  virtual ~NcclBackend() = default;

  // --- NCCL ---
  virtual NcclResult GetVersion(int* version) = 0;
  virtual NcclResult GetUniqueId(NcclUniqueId* id) = 0;
  // ncclCommInitRankConfig with config.blocking = 0: returns at once (usually kInProgress); the
  // communicator is usable when CommGetAsyncError reports kSuccess.
  virtual NcclResult CommInitRankNonBlocking(NcclCommHandle* comm, int nranks,
                                             const NcclUniqueId& id, int rank) = 0;
  virtual NcclResult CommGetAsyncError(NcclCommHandle comm, NcclResult* async_error) = 0;
  // Ends every operation of `comm` on the device and frees it; never waits for peers.
  virtual NcclResult CommAbort(NcclCommHandle comm) = 0;
  // ncclGetLastError: the library's text about the last failure ("" when none).
  virtual std::string LastError(NcclCommHandle comm) = 0;
  virtual const char* ErrorString(NcclResult r) = 0;

  // Collectives and point-to-point operations, enqueued on `stream` (counts in elements).
  virtual NcclResult AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                               NcclCommHandle comm, StreamHandle stream) = 0;
  virtual NcclResult ReduceScatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                   ReduceOp op, NcclCommHandle comm, StreamHandle stream) = 0;
  virtual NcclResult AllGather(const void* send, void* recv, size_t send_count, DType dtype,
                               NcclCommHandle comm, StreamHandle stream) = 0;
  virtual NcclResult Broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                               NcclCommHandle comm, StreamHandle stream) = 0;
  virtual NcclResult Send(const void* buf, size_t count, DType dtype, int peer, NcclCommHandle comm,
                          StreamHandle stream) = 0;
  virtual NcclResult Recv(void* buf, size_t count, DType dtype, int peer, NcclCommHandle comm,
                          StreamHandle stream) = 0;
  // ncclGroupStart / ncclGroupEnd: the calls between them are issued as one, so sends and
  // receives between the same ranks cannot wait on each other's order. Non-blocking mode:
  // GroupEnd may return kInProgress (poll CommGetAsyncError).
  virtual NcclResult GroupStart() = 0;
  virtual NcclResult GroupEnd() = 0;

  // --- CUDA runtime ---
  virtual CudaError GetDeviceCount(int* count) = 0;
  virtual CudaError SetDevice(int device) = 0;
  virtual CudaError StreamCreateNonBlocking(StreamHandle* stream) = 0;
  virtual CudaError StreamDestroy(StreamHandle stream) = 0;
  virtual CudaError EventCreateDisableTiming(EventHandle* event) = 0;
  virtual CudaError EventRecord(EventHandle event, StreamHandle stream) = 0;
  // kCudaSuccess when the work recorded before the event has finished, kCudaErrorNotReady while
  // it is pending, another code on a device failure.
  virtual CudaError EventQuery(EventHandle event) = 0;
  virtual CudaError EventDestroy(EventHandle event) = 0;
  virtual CudaError Malloc(void** ptr, size_t bytes) = 0;
  virtual CudaError Free(void* ptr) = 0;
  // cudaMallocHost / cudaFreeHost: page-locked host memory, so copies to and from it are
  // asynchronous (a copy to pageable memory may block the calling thread until the stream
  // reaches it).
  virtual CudaError MallocHost(void** ptr, size_t bytes) = 0;
  virtual CudaError FreeHost(void* ptr) = 0;
  // cudaMemcpyAsync(..., cudaMemcpyDefault, stream): any direction, in stream order.
  virtual CudaError MemcpyAsync(void* dst, const void* src, size_t bytes, StreamHandle stream) = 0;
  // dst[i] = a[i] + b[i] for i < n in f32 (IEEE round-to-nearest, no fused operations), a kernel
  // in stream order; dst may be a or b. n == 0 launches nothing.
  virtual CudaError AddF32(float* dst, const float* a, const float* b, size_t n,
                           StreamHandle stream) = 0;
  virtual const char* CudaErrorName(CudaError e) = 0;    // "cudaErrorInsufficientDriver"
  virtual const char* CudaErrorString(CudaError e) = 0;  // "CUDA driver version is insufficient…"
};

// The backend over libnccl and libcudart; FailedPrecondition in a build without them.
[[nodiscard]] absl::StatusOr<std::shared_ptr<NcclBackend>> RealNcclBackend();

// NcclAvailable over `backend`: a device is there and NCCL answers; otherwise `why` names the
// failing call and its error code, e.g. "cudaGetDeviceCount failed: cudaErrorInsufficientDriver
// (35): CUDA driver version is insufficient for CUDA runtime version".
bool NcclAvailable(NcclBackend& backend, std::string* why);

// CreateNcclCommunicator over `backend` (the public overload passes RealNcclBackend()).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    Bootstrap* bootstrap, const NcclOptions& options, std::shared_ptr<NcclBackend> backend);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_NCCL_BACKEND_H_
