// Private: the NCCL communicator's implementation, NcclComm, written once against NcclBackend
// (nccl_backend.h): libnccl/libcudart in production, an in-process fake in the tests. The failure
// model and the communicator's states are drawn in troupe/collectives/nccl_communicator.h.
//
// Its parts live in three files:
//   nccl_communicator.cc            set-up and bootstrap: options, the unique id through the
//                                   Bootstrap, non-blocking init, tear-down, and the public
//                                   entry points (CreateNcclCommunicator, NcclAvailable);
//   nccl_comm.cc                    the operations: argument checks, enqueue, Work::Helper's
//                                   polling, the sticky failure;
//   nccl_ordered_reduce_scatter.cc  ReduceScatter with Algorithm::kOrdered: intervals, partials,
//                                   and the canonical combine enqueued once the intervals arrive.
//
// One operation (Op), from issue to completion:
//
//   issued ──────(1)──────> enqueued ──(2)──> completed
//     │                        ^
//     └─(3)─> waiting for ─(4)─┘
//             intervals
//   (1) its NCCL call (or group) issued and settled, its event recorded behind it;
//   (2) Help() sees the event fire (status: OK, or its on_finish); or, from either state, the
//       communicator fails (status: the sticky failure) — whichever a thread sees first;
//   (3) an ordered reduce-scatter: its intervals' all-gather and its partials' exchange issued,
//       `planned` false, no event yet (at most one such: pending_);
//   (4) FinishPendingCombine: the intervals reached the host, the combine is enqueued and the
//       event recorded (by the first Wait on it or the next operation issued).
//
// Threads: any thread issues, waits or aborts. enqueue_mu_ serialises issuing (taken before
// mu_); mu_ guards the state and every backend call on comm_, and is free between polls so that
// Abort() gets in.
#ifndef TROUPE_COLLECTIVES_NCCL_COMM_H_
#define TROUPE_COLLECTIVES_NCCL_COMM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nccl_backend.h"
#include "troupe/collectives/bootstrap.h"
#include "troupe/collectives/communicator.h"
#include "troupe/collectives/nccl_communicator.h"

namespace troupe::collectives {

// NCCL / CUDA return codes become a Status with file:line here, at the edge of the backend
// (nccl_communicator.cc). kInProgress is not an error: the caller polls it.
#define TROUPE_NCCL_STATUS(backend, comm, call, result) \
  NcclStatus((backend), (comm), (call), (result), __FILE__, __LINE__)
#define TROUPE_CUDA_STATUS(backend, call, result) \
  CudaStatus((backend), (call), (result), __FILE__, __LINE__)
absl::Status NcclStatus(NcclBackend& b, NcclCommHandle comm, const char* call, NcclResult r,
                        const char* file, int line);
absl::Status CudaStatus(NcclBackend& b, const char* call, CudaError e, const char* file, int line);

class NcclComm final : public Communicator,
                       public Work::Helper,
                       public std::enable_shared_from_this<NcclComm> {
 public:
  NcclComm(const NcclOptions& o, std::shared_ptr<NcclBackend> backend);
  // Only the last reference (the owner and every Work gone) destroys: nobody else is inside.
  ~NcclComm() override;

  // --- set-up (nccl_communicator.cc) ---
  // The device, the stream, the unique id through `boot`, and ncclCommInitRankConfig settled
  // before the connect timeout.
  [[nodiscard]] absl::Status Init(Bootstrap* boot);

  // --- Communicator (nccl_comm.cc) ---
  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  uint64_t generation() const override { return o_.generation; }
  Work AllReduce(Buffer in, Buffer out, ReduceOp op, const CollectiveOptions& opts) override;
  Work ReduceScatter(Buffer in, Buffer out, ReduceOp op, const CollectiveOptions& opts) override;
  Work AllGather(Buffer in, Buffer out, const CollectiveOptions& opts) override;
  Work Broadcast(Buffer buf, int root, const CollectiveOptions& opts) override;
  Work Send(Buffer buf, int peer, uint32_t, const CollectiveOptions& opts) override;
  Work Recv(Buffer buf, int peer, uint32_t, const CollectiveOptions& opts) override;
  // One NCCL group: the sends and receives start together (tags unmatched: between two ranks
  // they pair in issue order). Every op's Work is the group's.
  std::vector<Work> PostPointToPoint(const std::vector<PointToPoint>& ops,
                                     const CollectiveOptions& opts) override;
  Work Barrier(const CollectiveOptions& opts) override;
  void Abort(absl::Status status) override;
  CommStats stats() const override;
  std::string DebugString() const override;
  // Every rank on one host: NVLink or PCIe between the devices, not a network (set by Init).
  bool PeersShareHost() const override { return one_host_; }
  // NCCL matches a pair's sends and receives in the order they were posted.
  bool MatchesByTag() const override { return false; }

  // Work::Helper: polls one operation to completion (event, async error, deadline). Several
  // threads may wait on copies of one Work: the first to see the outcome completes it.
  // An ordered reduce-scatter whose combine is not enqueued yet gets it enqueued first.
  void Help(const void* state) override;

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

  // The NCCL call (or group) Issue makes: the name and result of the call that decides.
  using IssueCall = absl::FunctionRef<std::pair<const char*, NcclResult>(NcclCommHandle)>;

  // --- set-up (nccl_communicator.cc) ---
  // Rank 0 makes the id and publishes it; the others wait for it until `deadline`.
  absl::StatusOr<NcclUniqueId> ExchangeId(Bootstrap* boot, absl::Time deadline);
  // Where rank `rank` publishes its net::HostKey() before it joins the communicator.
  std::string HostKeyName(int rank) const;
  // Whether every rank published the same host key as this one's, `mine` (the same answer on
  // every rank).
  absl::StatusOr<bool> AllOnOneHost(Bootstrap* boot, const std::string& mine, absl::Time deadline);

  // --- issuing and polling (nccl_comm.cc) ---
  // Polling: spin (lowest latency on a GPU) for a while, then sleep so waiting threads do not
  // starve the ranks that still have to enqueue (the fake's ranks share the CPU).
  static void Backoff(int* spins);
  // Polls a non-blocking call until it settles; the first failure (its own, an Abort, the
  // deadline) aborts the communicator and is returned. `mu_` is free between polls, so Abort()
  // from another thread gets in.
  absl::Status Settle(absl::Time deadline, const char* call, const char* limit_name,
                      absl::Duration limit);
  // Enqueues one NCCL call (`call(comm)` returns its result) and records the op's event behind
  // it. Enqueues are serialised: a call still in progress must settle before the next one.
  template <class F>
  Work Enqueue(const char* name, const CollectiveOptions& opts, size_t bytes, F call);
  std::shared_ptr<Op> NewOp(const CollectiveOptions& opts);
  // Makes one NCCL call, or a group of them — `call(comm)` returns the name and result of the
  // call that decides — with mu_ held: a failure aborts the communicator; a result still in
  // progress settles (mu_ free) before anything else is issued. Needs enqueue_mu_.
  absl::Status Issue(absl::Time deadline, absl::Duration timeout, IssueCall call);
  // A CUDA runtime call with mu_ held (the communicator healthy): a failure aborts it.
  absl::Status CudaLocked(const char* call, CudaError e);
  // Creates op's event and records it behind everything enqueued so far.
  absl::Status RecordLocked(Op* op);
  // Ends `op` with `st` (its event, if any, destroyed).
  void CompleteLocked(Op* op, absl::Status st);
  // One look at `op`: OK and *finished when its event fired; OK while pending; otherwise the
  // communicator's (sticky) failure.
  absl::Status PollLocked(Op* op, bool* finished);
  // The first failure wins and sticks; ncclCommAbort ends whatever NCCL still runs. Returns the
  // sticky status (a concurrent Abort's names the real cause).
  absl::Status FailLocked(absl::Status st);

  // --- the ordered reduce-scatter (nccl_ordered_reduce_scatter.cc) ---
  Work OrderedReduceScatter(const float* in, float* out, size_t block,
                            const CollectiveOptions& opts);
  absl::Status GatherIntervals(uint64_t lo, uint64_t hi, size_t block, absl::Time deadline,
                               absl::Duration timeout);
  std::pair<const char*, NcclResult> ExchangePartialsLocked(NcclCommHandle c, const float* in,
                                                            size_t block);
  absl::Status ReserveLocked(size_t block);
  absl::Status FinishPendingCombine(const Op* only = nullptr);
  absl::Status CombineLocked();

  const NcclOptions o_;
  const std::shared_ptr<NcclBackend> b_;
  const std::string key_;
  bool one_host_ = false;  // written by Init only
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

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_NCCL_COMM_H_
