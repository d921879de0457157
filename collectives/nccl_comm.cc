// The NCCL communicator's operations (nccl_comm.h): argument checks, issuing one NCCL call or
// group and recording its event, Work::Helper's polling, and the sticky failure that aborts the
// NCCL communicator. Set-up is in nccl_communicator.cc, the ordered reduce-scatter in
// nccl_ordered_reduce_scatter.cc.
#include "nccl_comm.h"

#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "algorithms.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"

namespace troupe::collectives {
namespace {

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
  TROUPE_RETURN_IF_ERROR(CheckBuffer(op, "input", in));
  TROUPE_RETURN_IF_ERROR(CheckBuffer(op, "output", out));
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

}  // namespace

void NcclComm::Backoff(int* spins) {
  if (++*spins < 1000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Work NcclComm::AllReduce(Buffer in, Buffer out, ReduceOp op, const CollectiveOptions& opts) {
  absl::Status st = CheckOp("AllReduce", opts);
  if (st.ok()) {
    st = CheckPair("AllReduce", in, out, in.count, out.count, "output.count (= input.count)");
  }
  if (!st.ok()) return Work::Done(st);
  return Enqueue("ncclAllReduce", opts, in.bytes(), [&](NcclCommHandle c) {
    return b_->AllReduce(in.data, out.data, in.count, in.dtype, op, c, stream_);
  });
}

Work NcclComm::ReduceScatter(Buffer in, Buffer out, ReduceOp op, const CollectiveOptions& opts) {
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

Work NcclComm::AllGather(Buffer in, Buffer out, const CollectiveOptions& opts) {
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

Work NcclComm::Broadcast(Buffer buf, int root, const CollectiveOptions& opts) {
  absl::Status st = CheckOp("Broadcast", opts);
  if (st.ok()) st = CheckBuffer("Broadcast", "buffer", buf);
  if (st.ok()) st = CheckRank("Broadcast", "root", root, o_.size, /*self=*/-1);
  if (!st.ok()) return Work::Done(st);
  return Enqueue("ncclBroadcast", opts, o_.rank == root ? buf.bytes() : 0, [&](NcclCommHandle c) {
    return b_->Broadcast(buf.data, buf.data, buf.count, buf.dtype, root, c, stream_);
  });
}

Work NcclComm::Send(Buffer buf, int peer, uint32_t, const CollectiveOptions& opts) {
  absl::Status st = CheckOp("Send", opts);
  if (st.ok()) st = CheckBuffer("Send", "buffer", buf);
  if (st.ok()) st = CheckRank("Send", "peer", peer, o_.size, o_.rank);
  if (!st.ok()) return Work::Done(st);
  return Enqueue("ncclSend", opts, buf.bytes(), [&](NcclCommHandle c) {
    return b_->Send(buf.data, buf.count, buf.dtype, peer, c, stream_);
  });
}

Work NcclComm::Recv(Buffer buf, int peer, uint32_t, const CollectiveOptions& opts) {
  absl::Status st = CheckOp("Recv", opts);
  if (st.ok()) st = CheckBuffer("Recv", "buffer", buf);
  if (st.ok()) st = CheckRank("Recv", "peer", peer, o_.size, o_.rank);
  if (!st.ok()) return Work::Done(st);
  return Enqueue("ncclRecv", opts, 0, [&](NcclCommHandle c) {
    return b_->Recv(buf.data, buf.count, buf.dtype, peer, c, stream_);
  });
}

std::vector<Work> NcclComm::PostPointToPoint(const std::vector<PointToPoint>& ops,
                                             const CollectiveOptions& opts) {
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

Work NcclComm::Barrier(const CollectiveOptions& opts) {
  if (auto st = CheckOp("Barrier", opts); !st.ok()) return Work::Done(st);
  return Enqueue("ncclAllReduce (barrier)", opts, sizeof(float), [&](NcclCommHandle c) {
    return b_->AllReduce(scratch_, scratch_, 1, DType::kF32, ReduceOp::kSum, c, stream_);
  });
}

void NcclComm::Abort(absl::Status status) {
  if (status.ok()) status = absl::AbortedError("collectives: Abort() with an OK status");
  std::lock_guard<std::mutex> l(mu_);
  FailLocked(std::move(status)).IgnoreError();
}

CommStats NcclComm::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

std::string NcclComm::DebugString() const {
  std::lock_guard<std::mutex> l(mu_);
  return absl::StrCat("nccl communicator rank ", o_.rank, "/", o_.size, " generation ",
                      o_.generation, " device ", o_.device, " id key ", key_, " pending ",
                      events_.size() + (pending_.op != nullptr ? 1 : 0), " status ",
                      failed_.ok() ? "healthy" : failed_.ToString());
}

void NcclComm::Help(const void* state) {
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

absl::Status NcclComm::Settle(absl::Time deadline, const char* call, const char* limit_name,
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
    if (base::MonotonicNow() > deadline) {
      return FailLocked(absl::DeadlineExceededError(
          absl::StrCat("collectives: ", call, " still in progress after ", limit_name, " (",
                       absl::FormatDuration(limit), ") on rank ", o_.rank, " of ", o_.size,
                       ", generation ", o_.generation, ": a rank missing or stuck?")));
    }
  }
}

template <class F>
Work NcclComm::Enqueue(const char* name, const CollectiveOptions& opts, size_t bytes, F call) {
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

std::shared_ptr<NcclComm::Op> NcclComm::NewOp(const CollectiveOptions& opts) {
  auto op = std::make_shared<Op>();
  op->deadline = base::MonotonicNow() + opts.timeout;
  return op;
}

absl::Status NcclComm::Issue(absl::Time deadline, absl::Duration timeout, IssueCall call) {
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

absl::Status NcclComm::CudaLocked(const char* call, CudaError e) {
  if (!failed_.ok()) return failed_;
  if (auto st = TROUPE_CUDA_STATUS(*b_, call, e); !st.ok()) return FailLocked(st);
  return absl::OkStatus();
}

absl::Status NcclComm::RecordLocked(Op* op) {
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

void NcclComm::CompleteLocked(Op* op, absl::Status st) {
  if (op->event != nullptr) {
    events_.erase(op->event);
    b_->EventDestroy(op->event);
    op->event = nullptr;
  }
  op->status = std::move(st);
  op->done.Notify();
}

absl::Status NcclComm::PollLocked(Op* op, bool* finished) {
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
  if (base::MonotonicNow() > op->deadline) {
    return FailLocked(absl::DeadlineExceededError(
        absl::StrCat("collectives: NCCL operation deadline passed on rank ", o_.rank, " of ",
                     o_.size, ", generation ", o_.generation)));
  }
  return absl::OkStatus();
}

absl::Status NcclComm::FailLocked(absl::Status st) {
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

}  // namespace troupe::collectives
