// The NCCL communicator's deterministic mode: ReduceScatter with Algorithm::kOrdered (f32 sums)
// combined on the device in the canonical tree order over the ranks' contribution intervals
// (PlanCanonicalCombine), bit-identical to the host backends. See nccl_comm.h for where the
// operation waits, nccl_communicator.h for the contract.
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nccl_comm.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"
#include "troupe/collectives/canonical_combine.h"

namespace troupe::collectives {

// ReduceScatter with Algorithm::kOrdered (f32 sums, validated): rank r's `in` holds the
// partial sums of contributions [interval_lo, interval_hi) for every block. Enqueued at once:
// the intervals' all-gather (host -> device -> NCCL -> pinned host, then intervals_event_),
// then one group of sends and receives — every rank sends its partial of block q to rank q
// and receives the others' partials of its own block into blocks_. The combine (AddF32
// kernels in canonical tree order, PlanCanonicalCombine) needs the intervals on the host: it
// is enqueued once they arrived, by the first of Work::Wait or the next enqueue
// (FinishPendingCombine), before anything issued later.
Work NcclComm::OrderedReduceScatter(const float* in, float* out, size_t block,
                                    const CollectiveOptions& opts) {
  const int n = o_.size, r = o_.rank;
  if (block == 0) return Work::Done(absl::OkStatus());  // as the host backends: nothing to do
  uint64_t lo = opts.interval_lo, hi = opts.interval_hi;
  if (lo == hi) lo = r, hi = r + 1;  // unset: contribution r
  auto op = NewOp(opts);
  std::lock_guard<std::mutex> serial(enqueue_mu_);
  if (auto st = FinishPendingCombine(); !st.ok()) return Work::Done(st);
  if (auto st = GatherIntervals(lo, hi, block, op->deadline, opts.timeout); !st.ok()) {
    return Work::Done(st);
  }
  if (n > 1) {
    auto exchange = [&](NcclCommHandle c) { return ExchangePartialsLocked(c, in, block); };
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

// Enqueues the intervals' all-gather: this rank's [lo, hi) to the device, every rank's gathered
// by NCCL and copied to pinned host memory, intervals_event_ recorded behind the copy. First
// reserves the buffers for `block`. Needs enqueue_mu_.
absl::Status NcclComm::GatherIntervals(uint64_t lo, uint64_t hi, size_t block, absl::Time deadline,
                                       absl::Duration timeout) {
  const int n = o_.size;
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
    if (!st.ok()) return st;
  }
  // Two uint64 per rank travel as four f32 words: an all-gather only copies bytes.
  if (auto st = Issue(deadline, timeout,
                      [&](NcclCommHandle c) {
                        return std::make_pair(
                            "ncclAllGather (ordered reduce-scatter intervals)",
                            b_->AllGather(device_intervals_, device_intervals_ + 2, 4, DType::kF32,
                                          c, stream_));
                      });
      !st.ok()) {
    return st;
  }
  std::lock_guard<std::mutex> l(mu_);
  absl::Status st = CudaLocked("cudaMemcpyAsync (intervals to host)",
                               b_->MemcpyAsync(host_intervals_ + 2, device_intervals_ + 2,
                                               2 * n * sizeof(uint64_t), stream_));
  if (st.ok()) st = CudaLocked("cudaEventRecord", b_->EventRecord(intervals_event_, stream_));
  return st;
}

// One NCCL group: every rank sends its partial of block q to rank q and receives the others'
// partials of its own block into blocks_. Called by Issue (mu_ held); returns the name and
// result of the call that decides.
std::pair<const char*, NcclResult> NcclComm::ExchangePartialsLocked(NcclCommHandle c,
                                                                    const float* in, size_t block) {
  const int n = o_.size, r = o_.rank;
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
}

// The ordered reduce-scatter's buffers: pinned host and device intervals (once), and blocks_
// for size * block floats (grown to fit; a smaller one retires — a combine in flight may still
// read it, and cudaFree would wait for the whole device — and is freed with the communicator).
absl::Status NcclComm::ReserveLocked(size_t block) {
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
  TROUPE_RETURN_IF_ERROR(CudaLocked("cudaMalloc", b_->Malloc(&p, need * sizeof(float))));
  blocks_ = static_cast<float*>(p);
  blocks_capacity_ = need;
  return absl::OkStatus();
}

// Drives the pending ordered reduce-scatter (if any) until its combine is enqueued: polls
// intervals_event_ (mu_ free between polls, so Abort gets in) against the operation's
// deadline, then plans. Returns a failure of the communicator (sticky); intervals that are
// not a canonical cut fail only that operation. With `only`, nothing unless that one is
// pending. Needs enqueue_mu_.
absl::Status NcclComm::FinishPendingCombine(const Op* only) {
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
      if (base::MonotonicNow() > pending_.op->deadline) {
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
absl::Status NcclComm::CombineLocked() {
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
    p.op->on_finish = absl::Status(
        plan.status().code(), absl::StrCat("ReduceScatter (kOrdered): ", plan.status().message()));
    plan = CombinePlan();  // no steps: only the event below
  }
  using Kind = CombineOperand::Kind;
  std::vector<float*> inner(plan->inner, nullptr);
  auto at = [&](const CombineOperand& o) -> float* {
    switch (o.kind) {
      case Kind::kPartial:
        return o.index == r ? const_cast<float*>(p.in + r * p.block) : blocks_ + o.index * p.block;
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
      st = CudaLocked("AddF32 kernel launch", b_->AddF32(dst, at(s.x), at(s.y), p.block, stream_));
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

}  // namespace troupe::collectives
