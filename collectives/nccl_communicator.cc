// The NCCL backend (device buffers). See nccl_communicator.h for the failure model.
#include "troupe/collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"

namespace troupe::collectives {
namespace {

// NCCL / CUDA return codes become a Status with file:line at the edge.
#define NCCL_STATUS(expr) NcclStatus((expr), #expr, __FILE__, __LINE__)
#define CUDA_STATUS(expr) CudaStatus((expr), #expr, __FILE__, __LINE__)

absl::Status NcclStatus(ncclResult_t r, const char* what, const char* file, int line) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(file, ":", line, ": ", what, " failed: ", ncclGetErrorString(r)));
}

absl::Status CudaStatus(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(file, ":", line, ": ", what, " failed: ", cudaGetErrorString(e)));
}

ncclDataType_t NcclType(DType t) { return t == DType::kF32 ? ncclFloat32 : ncclBfloat16; }
ncclRedOp_t NcclOp(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kAvg ? ncclAvg : ncclMax;
}

class NcclComm : public Communicator,
                 public Work::Helper,
                 public std::enable_shared_from_this<NcclComm> {
 public:
  NcclComm(const NcclOptions& o) : o_(o) {}
  ~NcclComm() override {
    Abort(absl::CancelledError("collectives: communicator destroyed"));
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  absl::Status Init(Bootstrap* boot) {
    const absl::Time deadline = absl::Now() + o_.connect_timeout;
    if (auto st = CUDA_STATUS(cudaSetDevice(o_.device)); !st.ok()) return st;
    if (auto st = CUDA_STATUS(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        !st.ok()) {
      return st;
    }
    if (auto st = CUDA_STATUS(cudaMalloc(&scratch_, sizeof(float))); !st.ok()) return st;
    const std::string key = absl::StrCat(o_.key_prefix, "/g", o_.generation, "/nccl-id");
    ncclUniqueId id;
    if (o_.rank == 0) {
      if (auto st = NCCL_STATUS(ncclGetUniqueId(&id)); !st.ok()) return st;
      auto pub = boot->Publish(key, std::string(id.internal, sizeof(id.internal)));
      if (!pub.ok()) return pub;
    } else {
      auto v = boot->Lookup(key, deadline);
      if (!v.ok()) return v.status();
      if (v->size() != sizeof(id.internal)) {
        return absl::DataLossError(
            absl::StrCat("nccl-id: expected ", sizeof(id.internal), " bytes, got ", v->size()));
      }
      std::memcpy(id.internal, v->data(), v->size());
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // non-blocking init: poll it against our deadline
    if (auto st = NCCL_STATUS(ncclCommInitRankConfig(&comm_, o_.size, id, o_.rank, &config));
        !st.ok()) {
      return st;
    }
    return Settle(deadline, "init");
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  uint64_t generation() const override { return o_.generation; }

  Work AllReduce(Buffer in, Buffer out, ReduceOp op, const CollectiveOptions& opts) override {
    if (auto st = HostOnly(opts); !st.ok()) return Work::Done(st);
    return Enqueue(opts, in.bytes(), [&] {
      return ncclAllReduce(in.data, out.data, in.count, NcclType(in.dtype), NcclOp(op), comm_,
                           stream_);
    });
  }
  Work ReduceScatter(Buffer in, Buffer out, ReduceOp op, const CollectiveOptions& opts) override {
    if (auto st = HostOnly(opts); !st.ok()) return Work::Done(st);
    return Enqueue(opts, in.bytes(), [&] {
      return ncclReduceScatter(in.data, out.data, out.count, NcclType(in.dtype), NcclOp(op), comm_,
                               stream_);
    });
  }
  Work AllGather(Buffer in, Buffer out, const CollectiveOptions& opts) override {
    return Enqueue(opts, in.bytes(), [&] {
      return ncclAllGather(in.data, out.data, in.count, NcclType(in.dtype), comm_, stream_);
    });
  }
  Work Broadcast(Buffer buf, int root, const CollectiveOptions& opts) override {
    return Enqueue(opts, buf.bytes(), [&] {
      return ncclBroadcast(buf.data, buf.data, buf.count, NcclType(buf.dtype), root, comm_,
                           stream_);
    });
  }
  Work Send(Buffer buf, int peer, uint32_t, const CollectiveOptions& opts) override {
    return Enqueue(opts, buf.bytes(), [&] {
      return ncclSend(buf.data, buf.count, NcclType(buf.dtype), peer, comm_, stream_);
    });
  }
  Work Recv(Buffer buf, int peer, uint32_t, const CollectiveOptions& opts) override {
    return Enqueue(opts, 0, [&] {
      return ncclRecv(buf.data, buf.count, NcclType(buf.dtype), peer, comm_, stream_);
    });
  }
  Work Barrier(const CollectiveOptions& opts) override {
    return Enqueue(opts, 4, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

  void Abort(absl::Status status) override {
    std::lock_guard<std::mutex> l(mu_);
    if (failed_.ok()) failed_ = status;
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);  // unblocks every kernel of this communicator
      comm_ = nullptr;
    }
  }

  CommStats stats() const override {
    std::lock_guard<std::mutex> l(mu_);
    return stats_;
  }
  std::string DebugString() const override {
    std::lock_guard<std::mutex> l(mu_);
    return absl::StrCat("nccl communicator rank ", o_.rank, "/", o_.size, " generation ",
                        o_.generation, " device ", o_.device, " status ",
                        failed_.ok() ? "healthy" : failed_.ToString());
  }

  // Work::Helper: polls one operation to completion (event, async error, deadline).
  void Help(const void* state) override {
    auto* s = const_cast<Op*>(static_cast<const Op*>(state));
    for (;;) {
      if (s->done.HasBeenNotified()) return;
      absl::Status st = Poll(s);
      if (!st.ok() || s->finished) {
        s->status = st;
        cudaEventDestroy(s->event);
        s->done.Notify();
        return;
      }
      std::this_thread::yield();
    }
  }

 private:
  struct Op : Work::State {
    cudaEvent_t event = nullptr;
    absl::Time deadline;
    bool finished = false;
  };

  static absl::Status HostOnly(const CollectiveOptions& o) {
    if (o.algorithm == Algorithm::kOrdered || o.compression != Compression::kNone) {
      return absl::InvalidArgumentError(
          "NCCL communicator: algorithm kOrdered and compression expected off (host backends "
          "only), got on");
    }
    return absl::OkStatus();
  }

  // Waits until a non-blocking NCCL call has settled; aborts on error or deadline.
  absl::Status Settle(absl::Time deadline, const char* what) {
    for (;;) {
      ncclResult_t r = ncclInProgress;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (!failed_.ok()) return failed_;
        ncclCommGetAsyncError(comm_, &r);
      }
      if (r == ncclSuccess) return absl::OkStatus();
      if (r != ncclInProgress) {
        absl::Status st = NcclStatus(r, what, __FILE__, __LINE__);
        Abort(st);
        return st;
      }
      if (absl::Now() > deadline) {
        absl::Status st = absl::DeadlineExceededError(absl::StrCat("NCCL ", what, " deadline"));
        Abort(st);
        return st;
      }
      std::this_thread::yield();
    }
  }

  template <class F>
  Work Enqueue(const CollectiveOptions& opts, size_t bytes, F call) {
    auto op = std::make_shared<Op>();
    op->deadline = absl::Now() + opts.timeout;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!failed_.ok()) return Work::Done(failed_);
      ncclResult_t r = call();
      // Non-blocking mode: the enqueue itself may still be in progress; it must settle before
      // the completion event is recorded behind it.
      while (r == ncclInProgress) {
        if (absl::Now() > op->deadline) break;
        std::this_thread::yield();
        ncclCommGetAsyncError(comm_, &r);
      }
      absl::Status st = r == ncclInProgress
                            ? absl::DeadlineExceededError("NCCL enqueue did not settle in time")
                            : NCCL_STATUS(r);
      if (st.ok()) st = CUDA_STATUS(cudaEventCreateWithFlags(&op->event, cudaEventDisableTiming));
      if (st.ok()) st = CUDA_STATUS(cudaEventRecord(op->event, stream_));
      if (!st.ok()) {
        if (failed_.ok()) failed_ = st;  // the communicator is unusable: abort it
        if (comm_ != nullptr) ncclCommAbort(comm_), comm_ = nullptr;
        return Work::Done(st);
      }
      stats_.bytes_sent += bytes;
      ++stats_.messages_sent;
    }
    op->helper = shared_from_this();
    return Work(op);
  }

  absl::Status Poll(Op* op) {
    std::lock_guard<std::mutex> l(mu_);
    if (!failed_.ok()) return failed_;
    ncclResult_t r = ncclSuccess;
    ncclCommGetAsyncError(comm_, &r);
    if (r != ncclSuccess && r != ncclInProgress) {
      absl::Status st = NcclStatus(r, "ncclCommGetAsyncError", __FILE__, __LINE__);
      failed_ = st;
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return st;
    }
    cudaError_t e = cudaEventQuery(op->event);
    if (e == cudaSuccess) {
      op->finished = true;
      ++stats_.ops_completed;
      return absl::OkStatus();
    }
    if (e != cudaErrorNotReady) return CUDA_STATUS(e);
    if (absl::Now() > op->deadline) {
      failed_ = absl::DeadlineExceededError("collectives: NCCL operation deadline passed");
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return failed_;
    }
    return absl::OkStatus();
  }

  const NcclOptions o_;
  mutable std::mutex mu_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  absl::Status failed_;
  CommStats stats_;
};

}  // namespace

bool NcclAvailable(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *why = absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorString(e));
    return false;
  }
  if (n == 0) {
    *why = "no CUDA device";
    return false;
  }
  int v = 0;
  ncclGetVersion(&v);
  *why = absl::StrCat(n, " CUDA device(s), NCCL ", v);
  return true;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Bootstrap* boot,
                                                                     const NcclOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclOptions: rank expected in [0, size), got ", o.rank, " size ", o.size));
  }
  std::string why;
  if (!NcclAvailable(&why)) return absl::FailedPreconditionError(why);
  auto comm = std::make_shared<NcclComm>(o);
  if (auto st = comm->Init(boot); !st.ok()) return st;
  // The helper link (Work -> communicator) needs shared ownership; the caller's unique_ptr holds
  // a thin owner that keeps it alive.
  struct Owner : Communicator {
    std::shared_ptr<NcclComm> c;
    int rank() const override { return c->rank(); }
    int size() const override { return c->size(); }
    uint64_t generation() const override { return c->generation(); }
    Work AllReduce(Buffer i, Buffer o, ReduceOp op, const CollectiveOptions& x) override {
      return c->AllReduce(i, o, op, x);
    }
    Work ReduceScatter(Buffer i, Buffer o, ReduceOp op, const CollectiveOptions& x) override {
      return c->ReduceScatter(i, o, op, x);
    }
    Work AllGather(Buffer i, Buffer o, const CollectiveOptions& x) override {
      return c->AllGather(i, o, x);
    }
    Work Broadcast(Buffer b, int root, const CollectiveOptions& x) override {
      return c->Broadcast(b, root, x);
    }
    Work Send(Buffer b, int p, uint32_t t, const CollectiveOptions& x) override {
      return c->Send(b, p, t, x);
    }
    Work Recv(Buffer b, int p, uint32_t t, const CollectiveOptions& x) override {
      return c->Recv(b, p, t, x);
    }
    Work Barrier(const CollectiveOptions& x) override { return c->Barrier(x); }
    void Abort(absl::Status s) override { c->Abort(std::move(s)); }
    CommStats stats() const override { return c->stats(); }
    std::string DebugString() const override { return c->DebugString(); }
    ~Owner() override { c->Abort(absl::CancelledError("collectives: communicator destroyed")); }
  };
  auto owner = std::make_unique<Owner>();
  owner->c = std::move(comm);
  return std::unique_ptr<Communicator>(std::move(owner));
}

}  // namespace troupe::collectives
