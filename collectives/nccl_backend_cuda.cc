// NcclBackend over libnccl and libcudart: each method is the one call it names, nothing more
// (AddF32: the kernel in nccl_kernels.cu). Built only when TROUPE_HAVE_CUDA and NCCL were found
// (nccl_stub.cc otherwise).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "nccl_backend.h"
#include "nccl_kernels.h"

namespace troupe::collectives {
namespace {

static_assert(static_cast<int>(NcclResult::kSuccess) == ncclSuccess);
static_assert(static_cast<int>(NcclResult::kUnhandledCudaError) == ncclUnhandledCudaError);
static_assert(static_cast<int>(NcclResult::kSystemError) == ncclSystemError);
static_assert(static_cast<int>(NcclResult::kInternalError) == ncclInternalError);
static_assert(static_cast<int>(NcclResult::kInvalidArgument) == ncclInvalidArgument);
static_assert(static_cast<int>(NcclResult::kInvalidUsage) == ncclInvalidUsage);
static_assert(static_cast<int>(NcclResult::kRemoteError) == ncclRemoteError);
static_assert(static_cast<int>(NcclResult::kInProgress) == ncclInProgress);
static_assert(kCudaSuccess == cudaSuccess && kCudaErrorNotReady == cudaErrorNotReady);
static_assert(sizeof(NcclUniqueId::internal) == sizeof(ncclUniqueId::internal));

NcclResult R(ncclResult_t r) { return static_cast<NcclResult>(r); }
ncclComm_t C(NcclCommHandle c) { return reinterpret_cast<ncclComm_t>(c); }
cudaStream_t S(StreamHandle s) { return reinterpret_cast<cudaStream_t>(s); }
cudaEvent_t E(EventHandle e) { return reinterpret_cast<cudaEvent_t>(e); }
ncclDataType_t T(DType t) { return t == DType::kF32 ? ncclFloat32 : ncclBfloat16; }
ncclRedOp_t Op(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kAvg ? ncclAvg : ncclMax;
}

class CudaNcclBackend final : public NcclBackend {
 public:
  NcclResult GetVersion(int* version) override { return R(ncclGetVersion(version)); }
  NcclResult GetUniqueId(NcclUniqueId* id) override {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    std::memcpy(id->internal, u.internal, sizeof(u.internal));
    return R(r);
  }
  NcclResult CommInitRankNonBlocking(NcclCommHandle* comm, int nranks, const NcclUniqueId& id,
                                     int rank) override {
    ncclUniqueId u;
    std::memcpy(u.internal, id.internal, sizeof(u.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&c, nranks, u, rank, &config);
    *comm = reinterpret_cast<NcclCommHandle>(c);
    return R(r);
  }
  NcclResult CommGetAsyncError(NcclCommHandle comm, NcclResult* async_error) override {
    ncclResult_t e = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(C(comm), &e);
    *async_error = R(e);
    return R(r);
  }
  NcclResult CommAbort(NcclCommHandle comm) override { return R(ncclCommAbort(C(comm))); }
  std::string LastError(NcclCommHandle comm) override {
    const char* s = ncclGetLastError(C(comm));
    return s != nullptr ? s : "";
  }
  const char* ErrorString(NcclResult r) override {
    return ncclGetErrorString(static_cast<ncclResult_t>(r));
  }

  NcclResult AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                       NcclCommHandle comm, StreamHandle stream) override {
    return R(ncclAllReduce(send, recv, count, T(dtype), Op(op), C(comm), S(stream)));
  }
  NcclResult ReduceScatter(const void* send, void* recv, size_t recv_count, DType dtype,
                           ReduceOp op, NcclCommHandle comm, StreamHandle stream) override {
    return R(ncclReduceScatter(send, recv, recv_count, T(dtype), Op(op), C(comm), S(stream)));
  }
  NcclResult AllGather(const void* send, void* recv, size_t send_count, DType dtype,
                       NcclCommHandle comm, StreamHandle stream) override {
    return R(ncclAllGather(send, recv, send_count, T(dtype), C(comm), S(stream)));
  }
  NcclResult Broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                       NcclCommHandle comm, StreamHandle stream) override {
    return R(ncclBroadcast(send, recv, count, T(dtype), root, C(comm), S(stream)));
  }
  NcclResult Send(const void* buf, size_t count, DType dtype, int peer, NcclCommHandle comm,
                  StreamHandle stream) override {
    return R(ncclSend(buf, count, T(dtype), peer, C(comm), S(stream)));
  }
  NcclResult Recv(void* buf, size_t count, DType dtype, int peer, NcclCommHandle comm,
                  StreamHandle stream) override {
    return R(ncclRecv(buf, count, T(dtype), peer, C(comm), S(stream)));
  }
  NcclResult GroupStart() override { return R(ncclGroupStart()); }
  NcclResult GroupEnd() override { return R(ncclGroupEnd()); }

  CudaError GetDeviceCount(int* count) override { return cudaGetDeviceCount(count); }
  CudaError SetDevice(int device) override { return cudaSetDevice(device); }
  CudaError StreamCreateNonBlocking(StreamHandle* stream) override {
    cudaStream_t s = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    *stream = reinterpret_cast<StreamHandle>(s);
    return e;
  }
  CudaError StreamDestroy(StreamHandle stream) override { return cudaStreamDestroy(S(stream)); }
  CudaError EventCreateDisableTiming(EventHandle* event) override {
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    *event = reinterpret_cast<EventHandle>(ev);
    return e;
  }
  CudaError EventRecord(EventHandle event, StreamHandle stream) override {
    return cudaEventRecord(E(event), S(stream));
  }
  CudaError EventQuery(EventHandle event) override { return cudaEventQuery(E(event)); }
  CudaError EventDestroy(EventHandle event) override { return cudaEventDestroy(E(event)); }
  CudaError Malloc(void** ptr, size_t bytes) override { return cudaMalloc(ptr, bytes); }
  CudaError Free(void* ptr) override { return cudaFree(ptr); }
  CudaError MallocHost(void** ptr, size_t bytes) override { return cudaMallocHost(ptr, bytes); }
  CudaError FreeHost(void* ptr) override { return cudaFreeHost(ptr); }
  CudaError MemcpyAsync(void* dst, const void* src, size_t bytes, StreamHandle stream) override {
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(stream));
  }
  CudaError AddF32(float* dst, const float* a, const float* b, size_t n,
                   StreamHandle stream) override {
    return LaunchAddF32(dst, a, b, n, stream);
  }
  const char* CudaErrorName(CudaError e) override {
    return cudaGetErrorName(static_cast<cudaError_t>(e));
  }
  const char* CudaErrorString(CudaError e) override {
    return cudaGetErrorString(static_cast<cudaError_t>(e));
  }
};

}  // namespace

absl::StatusOr<std::shared_ptr<NcclBackend>> RealNcclBackend() {
  static const auto* backend = new std::shared_ptr<NcclBackend>(new CudaNcclBackend());
  return *backend;
}

}  // namespace troupe::collectives
