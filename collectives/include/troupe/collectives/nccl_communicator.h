// troupe/collectives/nccl_communicator.h — the NCCL backend for device buffers.
//
// Buffers passed to this communicator are CUDA device pointers. Initialisation is non-blocking
// (ncclCommInitRankConfig with blocking = 0, polled against the connect deadline); operations
// are enqueued on the communicator's own stream and Work::Wait polls the operation's event and
// ncclCommGetAsyncError. Any asynchronous NCCL error, a passed deadline or Abort() calls
// ncclCommAbort, so no rank stays blocked inside NCCL; the communicator is then failed (sticky)
// and must be rebuilt. The unique id travels through the Bootstrap ("<prefix>/g<gen>/nccl-id"):
// rank 0 makes it and publishes it, the others look it up.
//
//   creating ──(1)──> healthy ──(2)──> failed ──(3)──> destroyed
//       └───────────────(4)──────────────┘
//   (1) every rank joined ncclCommInitRankConfig before `connect_timeout`;
//   (2) an NCCL error (enqueue or asynchronous), a CUDA error, an operation's deadline, or
//       Abort(): ncclCommAbort at once; pending and later operations fail with that first status;
//   (3) destruction: ncclCommAbort if still healthy; operations in flight fail with Cancelled;
//   (4) the id lookup, init or device setup fails: Create returns the status.
//
// Status codes: NCCL's ncclRemoteError and ncclSystemError (a peer died, aborted its
// communicator, or the network broke — NCCL cannot tell which, so no peer is blamed) are
// Unavailable; ncclInvalidArgument / ncclInvalidUsage are InvalidArgument; other NCCL codes are
// Internal; CUDA runtime errors are FailedPrecondition (the device is unusable here); Abort(s)
// fails this rank with `s`; its peers see the remote abort as ncclRemoteError (Unavailable) where
// the transport notices (a connection closes), but over NVLink or shared memory they may wait
// until their own Abort or deadline — so every survivor's liveness monitor aborts its own
// communicator. The deadline is DeadlineExceeded. Bad options or arguments are InvalidArgument and
// leave the communicator healthy. Compression is a host-backend feature: requesting it is
// InvalidArgument. Algorithm::kOrdered (the deterministic mode) is ReduceScatter's only, for f32
// sums (other types, ops or operations: InvalidArgument): each rank's block is combined in the
// canonical tree order over the ranks' contribution intervals, bit-identical to the host
// backends for any group size. It all-gathers the intervals, exchanges the partials in one NCCL
// group and adds them with a kernel; the adds are enqueued once the intervals reached the host,
// by Wait or by the next operation issued (which waits for that, up to the ordered operation's
// deadline, so issue it on every rank before issuing more on one). Intervals that are not
// disjoint aligned subtrees covering [0, total) are InvalidArgument on every rank and leave the
// communicator healthy; a peer's failure during it fails it as any other operation. It needs
// size * output.count floats of device scratch (kept, grown as needed, with the communicator).
// Other algorithm hints are ignored (NCCL picks its own). Tags of Send/Recv are not matched:
// between two ranks they pair in issue order, as in NCCL, and each is its own NCCL call (not
// grouped), so two ranks that both Send to each other first deadlock until the deadline: order
// them (e.g. even ranks send first). Threads:
// any thread may issue operations, wait, or call Abort (a liveness monitor does). Issuing sets the
// calling thread's current CUDA device to `NcclOptions::device`. Built when TROUPE_HAVE_CUDA;
// otherwise Create returns FailedPrecondition.
//
// Example:
//   NcclOptions o;  o.rank = r;  o.size = n;  o.generation = g;  o.device = local_gpu;
//   auto comm = CreateNcclCommunicator(bootstrap, o);
//   (*comm)->AllReduce(Buffer::F32(d_grad, n), Buffer::F32(d_grad, n), ReduceOp::kAvg, {}).Wait();
//   // liveness reports a dead peer: (*comm)->Abort(BlamePeer(absl::UnavailableError(...), p));
//   // then create a communicator over the survivors with generation g + 1.
#ifndef TROUPE_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define TROUPE_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "troupe/collectives/bootstrap.h"
#include "troupe/collectives/communicator.h"

namespace troupe::collectives {

struct NcclOptions {
  int rank = 0;  // in [0, size)
  int size = 1;  // >= 1
  uint64_t generation = 0;
  int device = 0;                     // CUDA device ordinal this rank uses, in [0, device count)
  std::string key_prefix = "troupe";  // non-empty
  // The unique id lookup and init of every rank must finish within this (> 0).
  absl::Duration connect_timeout = absl::Seconds(60);
};

// True when this build has the NCCL backend and a CUDA device is usable; `why` says why not,
// naming the failing call and its error code (e.g. cudaErrorInsufficientDriver (35)).
bool NcclAvailable(std::string* why);

[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    Bootstrap* bootstrap, const NcclOptions& options);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_NCCL_COMMUNICATOR_H_
