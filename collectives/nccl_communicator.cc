// The NCCL communicator's logic, written once against NcclBackend (nccl_backend.h): the real
// backend in nccl_backend_cuda.cc, an in-process fake for tests in nccl_fake.h. See
// nccl_communicator.h for the failure model.
#include "troupe/collectives/nccl_communicator.h"

#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "algorithms.h"
#include "nccl_backend.h"

namespace troupe::collectives {

std::string NcclResultName(NcclResult r) {
  switch (r) {
    case NcclResult::kSuccess:
      return "ncclSuccess";
    case NcclResult::kUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case NcclResult::kSystemError:
      return "ncclSystemError";
    case NcclResult::kInternalError:
      return "ncclInternalError";
    case NcclResult::kInvalidArgument:
      return "ncclInvalidArgument";
    case NcclResult::kInvalidUsage:
      return "ncclInvalidUsage";
    case NcclResult::kRemoteError:
      return "ncclRemoteError";
    case NcclResult::kInProgress:
      return "ncclInProgress";
  }
  return absl::StrCat("ncclResult(", static_cast<int>(r), ")");
}

namespace {

// NCCL / CUDA return codes become a Status with file:line here, at the edge of the backend.
#define TROUPE_NCCL_STATUS(backend, comm, call, result) \
  NcclStatus((backend), (comm), (call), (result), __FILE__, __LINE__)
#define TROUPE_CUDA_STATUS(backend, call, result) \
  CudaStatus((backend), (call), (result), __FILE__, __LINE__)

absl::StatusCode NcclCode(NcclResult r) {
  switch (r) {
    case NcclResult::kRemoteError:
    case NcclResult::kSystemError:
      return absl::StatusCode::kUnavailable;  // a peer or the network: rebuild without it
    case NcclResult::kInvalidArgument:
    case NcclResult::kInvalidUsage:
      return absl::StatusCode::kInvalidArgument;  // our bug: retrying cannot help
    default:
      return absl::StatusCode::kInternal;
  }
}

// kInProgress is not an error: the caller polls it.
absl::Status NcclStatus(NcclBackend& b, NcclCommHandle comm, const char* call, NcclResult r,
                        const char* file, int line) {
  if (r == NcclResult::kSuccess || r == NcclResult::kInProgress) return absl::OkStatus();
  std::string detail = comm != nullptr ? b.LastError(comm) : std::string();
  return absl::Status(
      NcclCode(r), absl::StrCat(file, ":", line, ": ", call, " failed: ", NcclResultName(r), " (",
                                static_cast<int>(r), "): ", b.ErrorString(r),
                                detail.empty() ? "" : "; ", detail));
}

std::string CudaErrorText(NcclBackend& b, CudaError e) {
  return absl::StrCat(b.CudaErrorName(e), " (", e, "): ", b.CudaErrorString(e));
}

absl::Status CudaStatus(NcclBackend& b, const char* call, CudaError e, const char* file, int line) {
  if (e == kCudaSuccess) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(file, ":", line, ": ", call, " failed: ", CudaErrorText(b, e)));
}

absl::StatusOr<int> DeviceCount(NcclBackend& b) {
  int n = 0;
  if (CudaError e = b.GetDeviceCount(&n); e != kCudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudaGetDeviceCount failed: ", CudaErrorText(b, e)));
  }
  if (n == 0) return absl::FailedPreconditionError("no CUDA device (cudaGetDeviceCount: 0)");
  return n;
}

absl::Status ValidateOptions(const Bootstrap* boot, const NcclOptions& o) {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("NcclOptions: ", parts...));
  };
  if (boot == nullptr) return bad("bootstrap expected non-null, got null");
  if (o.size < 1) return bad("size expected >= 1, got ", o.size);
  if (o.rank < 0 || o.rank >= o.size) {
    return bad("rank expected in [0, ", o.size, "), got ", o.rank);
  }
  if (o.device < 0) return bad("device expected >= 0, got ", o.device);
  if (o.key_prefix.empty()) return bad("key_prefix expected non-empty, got \"\"");
  if (o.connect_timeout <= absl::ZeroDuration()) {
    return bad("connect_timeout expected > 0, got ", absl::FormatDuration(o.connect_timeout));
  }
  return absl::OkStatus();
}

// `ordered_ok`: the operation implements Algorithm::kOrdered (ReduceScatter).
absl::Status CheckOp(const char* op, const CollectiveOptions& o, bool ordered_ok = false) {
  if (o.compression != Compression::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": compression expected kNone with NCCL (host backends only), got ",
                     static_cast<int>(o.compression)));
  }
  if (o.algorithm == Algorithm::kOrdered && !ordered_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(op,
                     ": algorithm kOrdered expected only with ReduceScatter on NCCL (else "
                     "kAuto; NCCL picks its own algorithm), got kOrdered"));
  }
  if (o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": timeout expected > 0 (absl::InfiniteDuration() for none), got ",
                     absl::FormatDuration(o.timeout)));
  }
  return absl::OkStatus();
}

absl::Status CheckBuffer(const char* op, const char* name, const Buffer& b) {
  if (b.count > 0 && b.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, ".data expected non-null with count ", b.count, ", got null"));
  }
  return absl::OkStatus();
}

absl::Status CheckPair(const char* op, const Buffer& in, const Buffer& out, size_t in_count,
                       size_t out_count, const char* rule) {
  if (auto st = CheckBuffer(op, "input", in); !st.ok()) return st;
  if (auto st = CheckBuffer(op, "output", out); !st.ok()) return st;
  if (in.dtype != out.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": output.dtype expected ", static_cast<int>(in.dtype),
                     " (input.dtype), got ", static_cast<int>(out.dtype)));
  }
  if (in_count != out_count) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", rule, " expected ", in_count, ", got ", out_count));
  }
  return absl::OkStatus();
}

// What ReduceScatter implements with Algorithm::kOrdered on the device: f32 sums.
absl::Status CheckOrdered(const Buffer& in, ReduceOp op) {
  if (in.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReduceScatter (kOrdered): input.dtype expected kF32 with NCCL, got ",
                     static_cast<int>(in.dtype)));
  }
  if (op != ReduceOp::kSum) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReduceScatter (kOrdered): op expected kSum with NCCL, got ", static_cast<int>(op)));
  }
  return absl::OkStatus();
}

absl::Status CheckRank(const char* op, const char* name, int value, int size, int self) {
  if (value < 0 || value >= size || value == self) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " expected in [0, ", size, ")",
                                                   self >= 0 ? " and not this rank" : "", ", got ",
                                                   value));
  }
  return absl::OkStatus();
}

// Polling: spin (lowest latency on a GPU) for a while, then sleep so waiting threads do not
// starve the ranks that still have to enqueue (the fake's ranks share the CPU).
void Backoff(int* spins) {
  if (++*spins < 1000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

class NcclComm final : public Communicator,
                       public Work::Helper,
                       public std::enable_shared_from_this<NcclComm> {
 public:
  NcclComm(const NcclOptions& o, std::shared_ptr<NcclBackend> backend)
      : o_(o),
        b_(std::move(backend)),
        key_(absl::StrCat(o.key_prefix, "/g", o.generation, "/nccl-id")) {}

  // Only the last reference (the owner and every Work gone) destroys: nobody else is inside.
  ~NcclComm() override {
    std::lock_guard<std::mutex> l(mu_);
    FailLocked(absl::CancelledError("collectives: communicator destroyed")).IgnoreError();
    for (EventHandle e : events_) b_->EventDestroy(e);
    if (intervals_event_ != nullptr) b_->EventDestroy(intervals_event_);
    if (stream_ != nullptr) b_->StreamDestroy(stream_);
    if (scratch_ != nullptr) b_->Free(scratch_);
    if (device_intervals_ != nullptr) b_->Free(device_intervals_);
    if (host_intervals_ != nullptr) b_->FreeHost(host_intervals_);
    for (float* p : retired_blocks_) b_->Free(p);
    if (blocks_ != nullptr) b_->Free(blocks_);
  }

  absl::Status Init(Bootstrap* boot) {
    const absl::Time deadline = absl::Now() + o_.connect_timeout;
    NcclBackend& b = *b_;
    if (auto st = TROUPE_CUDA_STATUS(b, "cudaSetDevice", b.SetDevice(o_.device)); !st.ok()) {
      return st;
    }
    if (auto st =
            TROUPE_CUDA_STATUS(b, "cudaStreamCreateWithFlags", b.StreamCreateNonBlocking(&stream_));
        !st.ok()) {
      return st;
    }
    if (auto st = TROUPE_CUDA_STATUS(b, "cudaMalloc", b.Malloc(&scratch_, sizeof(float)));
        !st.ok()) {
      return st;
    }
    absl::StatusOr<NcclUniqueId> id = ExchangeId(boot, deadline);
    if (!id.ok()) return id.status();
    {
      std::lock_guard<std::mutex> l(mu_);
      NcclResult r = b.CommInitRankNonBlocking(&comm_, o_.size, *id, o_.rank);
      if (auto st = TROUPE_NCCL_STATUS(b, comm_, "ncclCommInitRankConfig", r); !st.ok()) {
        return FailLocked(st);
      }
    }
    return Settle(deadline, "ncclCommInitRankConfig", "the connect timeout", o_.connect_timeout);
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  uint64_t generation() const override { return o_.generation; }

  Work AllReduce(Buffer in, Buffer out, ReduceOp op, const CollectiveOptions& opts) override {
    absl::Status st = CheckOp("AllReduce", opts);
    if (st.ok()) {
      st = CheckPair("AllReduce", in, out, in.count, out.count, "output.count (= input.count)");
    }
    if (!st.ok()) return Work::Done(st);
    return Enqueue("ncclAllReduce", opts, in.bytes(), [&](NcclCommHandle c) {
      return b_->AllReduce(in.data, out.data, in.count, in.dtype, op, c, stream_);
    });
  }
  Work ReduceScatter(Buffer in, Buffer out, ReduceOp op, const CollectiveOptions& opts) override {
    const bool ordered = opts.algorithm == Algorithm::kOrdered;
    absl::Status st = CheckOp("ReduceScatter", opts, /*ordered_ok=*/true);
    if (st.ok()) {
      st = CheckPair("ReduceScatter", in, out, out.count * o_.size, in.count,
                     "input.count (= size * output.count)");
    }
    if (st.ok() && ordered) st = CheckOrdered(in, op);
    if (!st.ok()) return Work::Done(st);
    if (ordered) {
      return OrderedReduceScatter(static_cast<const float*>(in.data), static_cast<float*>(out.data),
                                  out.count, opts);
    }
    return Enqueue("ncclReduceScatter", opts, in.bytes(), [&](NcclCommHandle c) {
      return b_->ReduceScatter(in.data, out.data, out.count, in.dtype, op, c, stream_);
    });
  }
  Work AllGather(Buffer in, Buffer out, const CollectiveOptions& opts) override {
    absl::Status st = CheckOp("AllGather", opts);
    if (st.ok()) {
      st = CheckPair("AllGather", in, out, in.count * o_.size, out.count,
                     "output.count (= size * input.count)");
    }
    if (!st.ok()) return Work::Done(st);
    return Enqueue("ncclAllGather", opts, in.bytes(), [&](NcclCommHandle c) {
      return b_->AllGather(in.data, out.data, in.count, in.dtype, c, stream_);
    });
  }
  Work Broadcast(Buffer buf, int root, const CollectiveOptions& opts) override {
    absl::Status st = CheckOp("Broadcast", opts);
    if (st.ok()) st = CheckBuffer("Broadcast", "buffer", buf);
    if (st.ok()) st = CheckRank("Broadcast", "root", root, o_.size, /*self=*/-1);
    if (!st.ok()) return Work::Done(st);
    return Enqueue("ncclBroadcast", opts, o_.rank == root ? buf.bytes() : 0, [&](NcclCommHandle c) {
      return b_->Broadcast(buf.data, buf.data, buf.count, buf.dtype, root, c, stream_);
    });
  }
  Work Send(Buffer buf, int peer, uint32_t, const CollectiveOptions& opts) override {
    absl::Status st = CheckOp("Send", opts);
    if (st.ok()) st = CheckBuffer("Send", "buffer", buf);
    if (st.ok()) st = CheckRank("Send", "peer", peer, o_.size, o_.rank);
    if (!st.ok()) return Work::Done(st);
    return Enqueue("ncclSend", opts, buf.bytes(), [&](NcclCommHandle c) {
      return b_->Send(buf.data, buf.count, buf.dtype, peer, c, stream_);
    });
  }
  Work Recv(Buffer buf, int peer, uint32_t, const CollectiveOptions& opts) override {
    absl::Status st = CheckOp("Recv", opts);
    if (st.ok()) st = CheckBuffer("Recv", "buffer", buf);
    if (st.ok()) st = CheckRank("Recv", "peer", peer, o_.size, o_.rank);
    if (!st.ok()) return Work::Done(st);
    return Enqueue("ncclRecv", opts, 0, [&](NcclCommHandle c) {
      return b_->Recv(buf.data, buf.count, buf.dtype, peer, c, stream_);
    });
  }
  // One NCCL group: the sends and receives start together (tags unmatched: between two ranks
  // they pair in issue order). Every op's Work is the group's.
  std::vector<Work> PostPointToPoint(const std::vector<PointToPoint>& ops,
                                     const CollectiveOptions& opts) override {
    absl::Status st = CheckOp("PostPointToPoint", opts);
    size_t bytes = 0;
    for (const PointToPoint& p : ops) {
      if (!st.ok()) break;
      st = CheckBuffer("PostPointToPoint", "buffer", p.buffer);
      if (st.ok()) st = CheckRank("PostPointToPoint", "peer", p.peer, o_.size, o_.rank);
      if (p.kind == PointToPoint::Kind::kSend) bytes += p.buffer.bytes();
    }
    if (!st.ok() || ops.empty()) return std::vector<Work>(ops.size(), Work::Done(st));
    Work group = Enqueue("ncclGroupEnd (point-to-point)", opts, bytes, [&](NcclCommHandle c) {
      NcclResult res = b_->GroupStart();
      if (res != NcclResult::kSuccess) return res;
      for (const PointToPoint& p : ops) {
        const Buffer& b = p.buffer;
        res = p.kind == PointToPoint::Kind::kSend
                  ? b_->Send(b.data, b.count, b.dtype, p.peer, c, stream_)
                  : b_->Recv(b.data, b.count, b.dtype, p.peer, c, stream_);
        if (res != NcclResult::kSuccess) break;
      }
      // Always ended: NCCL's group state is the thread's, and later calls would join it.
      const NcclResult end = b_->GroupEnd();
      return res != NcclResult::kSuccess ? res : end;
    });
    return std::vector<Work>(ops.size(), group);
  }
  Work Barrier(const CollectiveOptions& opts) override {
    if (auto st = CheckOp("Barrier", opts); !st.ok()) return Work::Done(st);
    return Enqueue("ncclAllReduce (barrier)", opts, sizeof(float), [&](NcclCommHandle c) {
      return b_->AllReduce(scratch_, scratch_, 1, DType::kF32, ReduceOp::kSum, c, stream_);
    });
  }

  void Abort(absl::Status status) override {
    if (status.ok()) status = absl::AbortedError("collectives: Abort() with an OK status");
    std::lock_guard<std::mutex> l(mu_);
    FailLocked(std::move(status)).IgnoreError();
  }

  CommStats stats() const override {
    std::lock_guard<std::mutex> l(mu_);
    return stats_;
  }
  std::string DebugString() const override {
    std::lock_guard<std::mutex> l(mu_);
    return absl::StrCat("nccl communicator rank ", o_.rank, "/", o_.size, " generation ",
                        o_.generation, " device ", o_.device, " id key ", key_, " pending ",
                        events_.size() + (pending_.op != nullptr ? 1 : 0), " status ",
                        failed_.ok() ? "healthy" : failed_.ToString());
  }

  // Work::Helper: polls one operation to completion (event, async error, deadline). Several
  // threads may wait on copies of one Work: the first to see the outcome completes it.
  // An ordered reduce-scatter whose combine is not enqueued yet gets it enqueued first.
  void Help(const void* state) override {
    auto* op = const_cast<Op*>(static_cast<const Op*>(state));
    bool planned;
    {
      std::lock_guard<std::mutex> l(mu_);
      planned = op->planned;
    }
    if (!planned) {
      std::lock_guard<std::mutex> serial(enqueue_mu_);
      FinishPendingCombine(op).IgnoreError();  // afterwards `op` is planned or done
    }
    for (int spins = 0;; Backoff(&spins)) {
      std::lock_guard<std::mutex> l(mu_);
      if (op->done.HasBeenNotified()) return;
      bool finished = false;
      absl::Status st = PollLocked(op, &finished);
      if (st.ok() && !finished) continue;
      if (st.ok()) st = op->on_finish;
      if (st.ok()) ++stats_.ops_completed;
      CompleteLocked(op, std::move(st));
      return;
    }
  }

 private:
  struct Op : Work::State {
    EventHandle event = nullptr;  // recorded behind the operation's last device work
    absl::Time deadline;
    // False while an ordered reduce-scatter waits for the intervals before it can enqueue its
    // combine (event still null); guarded by mu_.
    bool planned = true;
    // Its result once the event fired (an ordered reduce-scatter's rejected intervals: reported
    // only when its sends and receives, which read and write the caller's memory, are done).
    absl::Status on_finish;
  };

  // The ordered reduce-scatter whose combine is not enqueued yet (at most one: any later enqueue
  // finishes it first, so the device work stays in issue order on every rank).
  struct PendingCombine {
    std::shared_ptr<Op> op;  // null: none
    const float* in = nullptr;
    float* out = nullptr;
    size_t block = 0;
  };

  // Rank 0 makes the id and publishes it; the others wait for it until `deadline`.
  absl::StatusOr<NcclUniqueId> ExchangeId(Bootstrap* boot, absl::Time deadline) {
    NcclUniqueId id;
    if (o_.rank == 0) {
      NcclResult r = b_->GetUniqueId(&id);
      if (auto st = TROUPE_NCCL_STATUS(*b_, nullptr, "ncclGetUniqueId", r); !st.ok()) return st;
      if (auto st = boot->Publish(key_, std::string(id.internal, sizeof(id.internal))); !st.ok()) {
        return absl::Status(
            st.code(), absl::StrCat("NCCL unique id '", key_, "': publish failed: ", st.message()));
      }
      return id;
    }
    absl::StatusOr<std::string> v = boot->Lookup(key_, deadline);
    if (!v.ok()) {
      return absl::Status(v.status().code(),
                          absl::StrCat("NCCL unique id '", key_,
                                       "' (rank 0 publishes it): ", v.status().message()));
    }
    if (v->size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat("NCCL unique id '", key_, "': expected ",
                                              sizeof(id.internal), " bytes, got ", v->size()));
    }
    std::memcpy(id.internal, v->data(), v->size());
    return id;
  }

  // Polls a non-blocking call until it settles; the first failure (its own, an Abort, the
  // deadline) aborts the communicator and is returned. `mu_` is free between polls, so Abort()
  // from another thread gets in.
  absl::Status Settle(absl::Time deadline, const char* call, const char* limit_name,
                      absl::Duration limit) {
    for (int spins = 0;; Backoff(&spins)) {
      std::lock_guard<std::mutex> l(mu_);
      if (!failed_.ok()) return failed_;
      NcclResult r = NcclResult::kInProgress;
      NcclResult got = b_->CommGetAsyncError(comm_, &r);
      if (got != NcclResult::kSuccess) r = got;
      if (r == NcclResult::kSuccess) return absl::OkStatus();
      if (r != NcclResult::kInProgress) {
        return FailLocked(TROUPE_NCCL_STATUS(*b_, comm_, call, r));
      }
      if (absl::Now() > deadline) {
        return FailLocked(absl::DeadlineExceededError(
            absl::StrCat("collectives: ", call, " still in progress after ", limit_name, " (",
                         absl::FormatDuration(limit), ") on rank ", o_.rank, " of ", o_.size,
                         ", generation ", o_.generation, ": a rank missing or stuck?")));
      }
    }
  }

  // Enqueues one NCCL call (`call(comm)` returns its result) and records the op's event behind
  // it. Enqueues are serialised: a call still in progress must settle before the next one.
  template <class F>
  Work Enqueue(const char* name, const CollectiveOptions& opts, size_t bytes, F call) {
    auto op = NewOp(opts);
    std::lock_guard<std::mutex> serial(enqueue_mu_);
    if (auto st = FinishPendingCombine(); !st.ok()) return Work::Done(st);
    if (auto st = Issue(op->deadline, opts.timeout,
                        [&](NcclCommHandle c) { return std::make_pair(name, call(c)); });
        !st.ok()) {
      return Work::Done(st);
    }
    std::lock_guard<std::mutex> l(mu_);
    if (!failed_.ok()) return Work::Done(failed_);
    if (auto st = RecordLocked(op.get()); !st.ok()) return Work::Done(FailLocked(st));
    stats_.bytes_sent += bytes;
    ++stats_.messages_sent;
    op->helper = shared_from_this();
    return Work(op);
  }

  std::shared_ptr<Op> NewOp(const CollectiveOptions& opts) {
    auto op = std::make_shared<Op>();
    op->deadline = absl::Now() + opts.timeout;
    return op;
  }

  // Makes one NCCL call, or a group of them — `call(comm)` returns the name and result of the
  // call that decides — with mu_ held: a failure aborts the communicator; a result still in
  // progress settles (mu_ free) before anything else is issued. Needs enqueue_mu_.
  template <class F>
  absl::Status Issue(absl::Time deadline, absl::Duration timeout, F call) {
    std::pair<const char*, NcclResult> r;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!failed_.ok()) return failed_;
      r = call(comm_);
      if (auto st = TROUPE_NCCL_STATUS(*b_, comm_, r.first, r.second); !st.ok()) {
        return FailLocked(st);
      }
    }
    if (r.second != NcclResult::kInProgress) return absl::OkStatus();
    return Settle(deadline, r.first, "the operation's timeout", timeout);
  }

  // A CUDA runtime call with mu_ held (the communicator healthy): a failure aborts it.
  absl::Status CudaLocked(const char* call, CudaError e) {
    if (!failed_.ok()) return failed_;
    if (auto st = TROUPE_CUDA_STATUS(*b_, call, e); !st.ok()) return FailLocked(st);
    return absl::OkStatus();
  }

  // Creates op's event and records it behind everything enqueued so far.
  absl::Status RecordLocked(Op* op) {
    absl::Status st = TROUPE_CUDA_STATUS(*b_, "cudaSetDevice", b_->SetDevice(o_.device));
    if (st.ok()) {
      st = TROUPE_CUDA_STATUS(*b_, "cudaEventCreateWithFlags",
                              b_->EventCreateDisableTiming(&op->event));
    }
    if (st.ok()) {
      events_.insert(op->event);
      st = TROUPE_CUDA_STATUS(*b_, "cudaEventRecord", b_->EventRecord(op->event, stream_));
    }
    return st;
  }

  // Ends `op` with `st` (its event, if any, destroyed).
  void CompleteLocked(Op* op, absl::Status st) {
    if (op->event != nullptr) {
      events_.erase(op->event);
      b_->EventDestroy(op->event);
      op->event = nullptr;
    }
    op->status = std::move(st);
    op->done.Notify();
  }

  // ReduceScatter with Algorithm::kOrdered (f32 sums, validated): rank r's `in` holds the
  // partial sums of contributions [interval_lo, interval_hi) for every block. Enqueued at once:
  // the intervals' all-gather (host -> device -> NCCL -> pinned host, then intervals_event_),
  // then one group of sends and receives — every rank sends its partial of block q to rank q
  // and receives the others' partials of its own block into blocks_. The combine (AddF32
  // kernels in canonical tree order, PlanCanonicalCombine) needs the intervals on the host: it
  // is enqueued once they arrived, by the first of Work::Wait or the next enqueue
  // (FinishPendingCombine), before anything issued later.
  Work OrderedReduceScatter(const float* in, float* out, size_t block,
                            const CollectiveOptions& opts) {
    const int n = o_.size, r = o_.rank;
    if (block == 0) return Work::Done(absl::OkStatus());  // as the host backends: nothing to do
    uint64_t lo = opts.interval_lo, hi = opts.interval_hi;
    if (lo == hi) lo = r, hi = r + 1;  // unset: contribution r
    auto op = NewOp(opts);
    std::lock_guard<std::mutex> serial(enqueue_mu_);
    if (auto st = FinishPendingCombine(); !st.ok()) return Work::Done(st);
    {
      std::lock_guard<std::mutex> l(mu_);
      absl::Status st = CudaLocked("cudaSetDevice", b_->SetDevice(o_.device));
      if (st.ok()) st = ReserveLocked(block);
      if (st.ok()) {
        // The previous ordered reduce-scatter's copies are done: its combine was planned.
        host_intervals_[0] = lo;
        host_intervals_[1] = hi;
        st = CudaLocked(
            "cudaMemcpyAsync (interval to device)",
            b_->MemcpyAsync(device_intervals_, host_intervals_, 2 * sizeof(uint64_t), stream_));
      }
      if (!st.ok()) return Work::Done(st);
    }
    // Two uint64 per rank travel as four f32 words: an all-gather only copies bytes.
    if (auto st = Issue(op->deadline, opts.timeout,
                        [&](NcclCommHandle c) {
                          return std::make_pair(
                              "ncclAllGather (ordered reduce-scatter intervals)",
                              b_->AllGather(device_intervals_, device_intervals_ + 2, 4,
                                            DType::kF32, c, stream_));
                        });
        !st.ok()) {
      return Work::Done(st);
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      absl::Status st = CudaLocked("cudaMemcpyAsync (intervals to host)",
                                   b_->MemcpyAsync(host_intervals_ + 2, device_intervals_ + 2,
                                                   2 * n * sizeof(uint64_t), stream_));
      if (st.ok()) {
        st = CudaLocked("cudaEventRecord", b_->EventRecord(intervals_event_, stream_));
      }
      if (!st.ok()) return Work::Done(st);
    }
    if (n > 1) {
      auto exchange = [&](NcclCommHandle c) -> std::pair<const char*, NcclResult> {
        NcclResult res = b_->GroupStart();
        if (res != NcclResult::kSuccess) return {"ncclGroupStart", res};
        const char* name = "ncclGroupEnd (ordered reduce-scatter)";
        for (int q = 0; q < n && res == NcclResult::kSuccess; ++q) {
          if (q == r) continue;
          name = "ncclSend (ordered reduce-scatter)";
          res = b_->Send(in + q * block, block, DType::kF32, q, c, stream_);
          if (res != NcclResult::kSuccess) break;
          name = "ncclRecv (ordered reduce-scatter)";
          res = b_->Recv(blocks_ + q * block, block, DType::kF32, q, c, stream_);
        }
        // Always ended: NCCL's group state is the thread's, and later calls would join it.
        NcclResult end = b_->GroupEnd();
        if (res != NcclResult::kSuccess) return {name, res};
        return {"ncclGroupEnd (ordered reduce-scatter)", end};
      };
      if (auto st = Issue(op->deadline, opts.timeout, exchange); !st.ok()) return Work::Done(st);
    }
    std::lock_guard<std::mutex> l(mu_);
    if (!failed_.ok()) return Work::Done(failed_);
    op->planned = false;
    pending_ = {op, in, out, block};
    stats_.bytes_sent += 2 * sizeof(uint64_t) + (n - 1) * block * sizeof(float);
    ++stats_.messages_sent;
    op->helper = shared_from_this();
    return Work(op);
  }

  // The ordered reduce-scatter's buffers: pinned host and device intervals (once), and blocks_
  // for size * block floats (grown to fit; a smaller one retires — a combine in flight may still
  // read it, and cudaFree would wait for the whole device — and is freed with the communicator).
  absl::Status ReserveLocked(size_t block) {
    const size_t n = static_cast<size_t>(o_.size);
    if (host_intervals_ == nullptr) {
      void* host = nullptr;
      void* device = nullptr;
      const size_t bytes = (2 + 2 * n) * sizeof(uint64_t);  // this rank's, then every rank's
      absl::Status st = CudaLocked("cudaMallocHost", b_->MallocHost(&host, bytes));
      if (st.ok()) {
        host_intervals_ = static_cast<uint64_t*>(host);
        st = CudaLocked("cudaMalloc", b_->Malloc(&device, bytes));
      }
      EventHandle event = nullptr;
      if (st.ok()) {
        device_intervals_ = static_cast<uint64_t*>(device);
        st = CudaLocked("cudaEventCreateWithFlags", b_->EventCreateDisableTiming(&event));
      }
      if (!st.ok()) return st;
      intervals_event_ = event;
    }
    const size_t need = n > 1 ? n * block : 0;  // one slot per rank (this rank's stays unused)
    if (blocks_capacity_ >= need) return absl::OkStatus();
    if (blocks_ != nullptr) retired_blocks_.push_back(blocks_);
    blocks_ = nullptr;
    blocks_capacity_ = 0;
    void* p = nullptr;
    if (auto st = CudaLocked("cudaMalloc", b_->Malloc(&p, need * sizeof(float))); !st.ok()) {
      return st;
    }
    blocks_ = static_cast<float*>(p);
    blocks_capacity_ = need;
    return absl::OkStatus();
  }

  // Drives the pending ordered reduce-scatter (if any) until its combine is enqueued: polls
  // intervals_event_ (mu_ free between polls, so Abort gets in) against the operation's
  // deadline, then plans. Returns a failure of the communicator (sticky); intervals that are
  // not a canonical cut fail only that operation. With `only`, nothing unless that one is
  // pending. Needs enqueue_mu_.
  absl::Status FinishPendingCombine(const Op* only = nullptr) {
    for (int spins = 0;; Backoff(&spins)) {
      std::lock_guard<std::mutex> l(mu_);
      // None (or a failure ended it).
      if (pending_.op == nullptr || (only != nullptr && pending_.op.get() != only)) {
        return absl::OkStatus();
      }
      NcclResult r = NcclResult::kSuccess;
      NcclResult got = b_->CommGetAsyncError(comm_, &r);
      if (got != NcclResult::kSuccess) r = got;
      if (r != NcclResult::kSuccess && r != NcclResult::kInProgress) {
        return FailLocked(TROUPE_NCCL_STATUS(*b_, comm_, "ncclCommGetAsyncError", r));
      }
      CudaError e = b_->EventQuery(intervals_event_);
      if (e == kCudaErrorNotReady) {
        if (absl::Now() > pending_.op->deadline) {
          return FailLocked(absl::DeadlineExceededError(
              absl::StrCat("collectives: NCCL operation deadline passed on rank ", o_.rank, " of ",
                           o_.size, ", generation ", o_.generation,
                           " (ordered reduce-scatter: waiting for every rank's interval)")));
        }
        continue;
      }
      if (e != kCudaSuccess) return FailLocked(TROUPE_CUDA_STATUS(*b_, "cudaEventQuery", e));
      return CombineLocked();
    }
  }

  // The intervals are here: plan the canonical combine and enqueue it. Operands live in place:
  // a received partial or temporary is consumed by exactly one step, so each step writes over
  // one of its operands (never this rank's input) and blocks_ is all the scratch there is.
  absl::Status CombineLocked() {
    PendingCombine p = std::move(pending_);
    pending_ = PendingCombine();
    const int n = o_.size, r = o_.rank;
    std::vector<std::pair<uint64_t, uint64_t>> intervals(n);
    for (int q = 0; q < n; ++q) {
      intervals[q] = {host_intervals_[2 + 2 * q], host_intervals_[3 + 2 * q]};
    }
    absl::StatusOr<CombinePlan> plan = PlanCanonicalCombine(intervals);
    if (!plan.ok()) {
      // Every rank planned the same: the operation fails everywhere once its transfers are done,
      // and the communicator stays healthy.
      p.op->on_finish =
          absl::Status(plan.status().code(),
                       absl::StrCat("ReduceScatter (kOrdered): ", plan.status().message()));
      plan = CombinePlan();  // no steps: only the event below
    }
    using Kind = CombineOperand::Kind;
    std::vector<float*> inner(plan->inner, nullptr);
    auto at = [&](const CombineOperand& o) -> float* {
      switch (o.kind) {
        case Kind::kPartial:
          return o.index == r ? const_cast<float*>(p.in + r * p.block)
                              : blocks_ + o.index * p.block;
        case Kind::kInner:
          return inner[o.index];
        case Kind::kOutput:
          return p.out;
        case Kind::kNone:
          break;
      }
      return nullptr;
    };
    auto mine = [&](const CombineOperand& o) { return o.kind == Kind::kPartial && o.index == r; };
    absl::Status st = CudaLocked("cudaSetDevice", b_->SetDevice(o_.device));
    for (const CombineStep& s : plan->steps) {
      if (!st.ok()) break;
      float* dst = at(s.dst);
      if (s.dst.kind == Kind::kInner) {
        dst = mine(s.x) ? at(s.y) : at(s.x);
        inner[s.dst.index] = dst;
      }
      if (s.y.kind == Kind::kNone) {
        if (dst != at(s.x)) {
          st = CudaLocked("cudaMemcpyAsync (ordered reduce-scatter result)",
                          b_->MemcpyAsync(dst, at(s.x), p.block * sizeof(float), stream_));
        }
      } else {
        st =
            CudaLocked("AddF32 kernel launch", b_->AddF32(dst, at(s.x), at(s.y), p.block, stream_));
      }
    }
    if (st.ok()) {
      st = RecordLocked(p.op.get());
      if (!st.ok()) st = FailLocked(st);
    }
    if (!st.ok()) {
      CompleteLocked(p.op.get(), st);
      return st;
    }
    p.op->planned = true;
    return absl::OkStatus();
  }

  // One look at `op`: OK and *finished when its event fired; OK while pending; otherwise the
  // communicator's (sticky) failure.
  absl::Status PollLocked(Op* op, bool* finished) {
    if (!failed_.ok()) return failed_;
    NcclResult r = NcclResult::kSuccess;
    NcclResult got = b_->CommGetAsyncError(comm_, &r);
    if (got != NcclResult::kSuccess) r = got;
    if (r != NcclResult::kSuccess && r != NcclResult::kInProgress) {
      return FailLocked(TROUPE_NCCL_STATUS(*b_, comm_, "ncclCommGetAsyncError", r));
    }
    CudaError e = b_->EventQuery(op->event);
    if (e == kCudaSuccess) {
      *finished = true;
      return absl::OkStatus();
    }
    if (e != kCudaErrorNotReady) {
      return FailLocked(TROUPE_CUDA_STATUS(*b_, "cudaEventQuery", e));
    }
    if (absl::Now() > op->deadline) {
      return FailLocked(absl::DeadlineExceededError(
          absl::StrCat("collectives: NCCL operation deadline passed on rank ", o_.rank, " of ",
                       o_.size, ", generation ", o_.generation)));
    }
    return absl::OkStatus();
  }

  // The first failure wins and sticks; ncclCommAbort ends whatever NCCL still runs. Returns the
  // sticky status (a concurrent Abort's names the real cause).
  absl::Status FailLocked(absl::Status st) {
    if (failed_.ok()) failed_ = std::move(st);
    if (comm_ != nullptr) {
      b_->CommAbort(comm_);  // its result adds nothing: the communicator is gone either way
      comm_ = nullptr;
    }
    if (pending_.op != nullptr) {  // its Work may never be waited on: it holds us (helper)
      CompleteLocked(pending_.op.get(), failed_);
      pending_ = PendingCombine();
    }
    return failed_;
  }

  const NcclOptions o_;
  const std::shared_ptr<NcclBackend> b_;
  const std::string key_;
  std::mutex enqueue_mu_;  // serialises Enqueue; taken before mu_
  mutable std::mutex mu_;  // everything below, and every backend call on comm_
  NcclCommHandle comm_ = nullptr;
  StreamHandle stream_ = nullptr;
  void* scratch_ = nullptr;       // the barrier's one float, on the device
  std::set<EventHandle> events_;  // of operations not yet completed
  // Ordered reduce-scatter (OrderedReduceScatter): intervals, this rank's then every rank's.
  uint64_t* host_intervals_ = nullptr;     // pinned
  uint64_t* device_intervals_ = nullptr;   // the all-gather's buffers
  EventHandle intervals_event_ = nullptr;  // behind the copy of every rank's interval to the host
  float* blocks_ = nullptr;                // size * block floats: the partials received
  size_t blocks_capacity_ = 0;             // floats
  std::vector<float*> retired_blocks_;     // outgrown; freed with the communicator
  PendingCombine pending_;
  absl::Status failed_;
  CommStats stats_;
};

// The caller's handle: Work holds the communicator (its helper) by shared_ptr, so the owner is a
// thin forwarder whose destruction aborts what is still in flight.
class NcclOwner final : public Communicator {
 public:
  explicit NcclOwner(std::shared_ptr<NcclComm> c) : c_(std::move(c)) {}
  ~NcclOwner() override { c_->Abort(absl::CancelledError("collectives: communicator destroyed")); }

  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  uint64_t generation() const override { return c_->generation(); }
  Work AllReduce(Buffer i, Buffer o, ReduceOp op, const CollectiveOptions& x) override {
    return c_->AllReduce(i, o, op, x);
  }
  Work ReduceScatter(Buffer i, Buffer o, ReduceOp op, const CollectiveOptions& x) override {
    return c_->ReduceScatter(i, o, op, x);
  }
  Work AllGather(Buffer i, Buffer o, const CollectiveOptions& x) override {
    return c_->AllGather(i, o, x);
  }
  Work Broadcast(Buffer b, int root, const CollectiveOptions& x) override {
    return c_->Broadcast(b, root, x);
  }
  Work Send(Buffer b, int p, uint32_t t, const CollectiveOptions& x) override {
    return c_->Send(b, p, t, x);
  }
  Work Recv(Buffer b, int p, uint32_t t, const CollectiveOptions& x) override {
    return c_->Recv(b, p, t, x);
  }
  std::vector<Work> PostPointToPoint(const std::vector<PointToPoint>& ops,
                                     const CollectiveOptions& x) override {
    return c_->PostPointToPoint(ops, x);
  }
  Work Barrier(const CollectiveOptions& x) override { return c_->Barrier(x); }
  void Abort(absl::Status s) override { c_->Abort(std::move(s)); }
  CommStats stats() const override { return c_->stats(); }
  std::string DebugString() const override { return c_->DebugString(); }

 private:
  std::shared_ptr<NcclComm> c_;
};

}  // namespace

bool NcclAvailable(NcclBackend& backend, std::string* why) {
  absl::StatusOr<int> n = DeviceCount(backend);
  if (!n.ok()) {
    *why = std::string(n.status().message());
    return false;
  }
  int version = 0;
  if (NcclResult r = backend.GetVersion(&version); r != NcclResult::kSuccess) {
    *why = absl::StrCat("ncclGetVersion failed: ", NcclResultName(r), " (", static_cast<int>(r),
                        "): ", backend.ErrorString(r));
    return false;
  }
  *why = absl::StrCat(*n, " CUDA device(s), NCCL ", version);
  return true;
}

bool NcclAvailable(std::string* why) {
  absl::StatusOr<std::shared_ptr<NcclBackend>> b = RealNcclBackend();
  if (!b.ok()) {
    *why = std::string(b.status().message());
    return false;
  }
  return NcclAvailable(**b, why);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    Bootstrap* boot, const NcclOptions& o, std::shared_ptr<NcclBackend> backend) {
  if (auto st = ValidateOptions(boot, o); !st.ok()) return st;
  if (backend == nullptr) {
    return absl::InvalidArgumentError("CreateNcclCommunicator: backend expected non-null");
  }
  absl::StatusOr<int> devices = DeviceCount(*backend);
  if (!devices.ok()) return devices.status();
  if (o.device >= *devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclOptions: device expected in [0, ", *devices, "), got ", o.device));
  }
  auto comm = std::make_shared<NcclComm>(o, std::move(backend));
  if (auto st = comm->Init(boot); !st.ok()) return st;
  return std::unique_ptr<Communicator>(new NcclOwner(std::move(comm)));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Bootstrap* boot,
                                                                     const NcclOptions& o) {
  if (auto st = ValidateOptions(boot, o); !st.ok()) return st;
  absl::StatusOr<std::shared_ptr<NcclBackend>> backend = RealNcclBackend();
  if (!backend.ok()) return backend.status();
  std::string why;
  if (!NcclAvailable(**backend, &why)) return absl::FailedPreconditionError(why);
  return CreateNcclCommunicator(boot, o, *std::move(backend));
}

}  // namespace troupe::collectives
