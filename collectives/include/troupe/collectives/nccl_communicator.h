// troupe/collectives/nccl_communicator.h — the NCCL backend for device buffers.
//
// Buffers passed to this communicator are CUDA device pointers. Initialisation is non-blocking
// (ncclCommInitRankConfig with blocking = 0, polled against the connect deadline); operations
// are enqueued on the communicator's own stream and Work::Wait polls the operation's event and
// ncclCommGetAsyncError. Any asynchronous NCCL error, a passed deadline or Abort() calls
// ncclCommAbort, so no rank stays blocked inside NCCL; the communicator is then failed (sticky)
// and must be rebuilt. The unique id travels through the Bootstrap ("<prefix>/g<gen>/nccl-id").
// Ordered reduction and compression are host-backend features: requesting them here is
// InvalidArgument. Built only when TROUPE_HAVE_CUDA; otherwise Create returns
// FailedPrecondition.
//
// Example:
//   NcclOptions o;  o.rank = r;  o.size = n;  o.device = local_gpu;
//   auto comm = CreateNcclCommunicator(bootstrap, o);
//   (*comm)->AllReduce(Buffer::F32(d_grad, n), Buffer::F32(d_grad, n), ReduceOp::kAvg, {}).Wait();
#ifndef TROUPE_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define TROUPE_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "troupe/collectives/bootstrap.h"
#include "troupe/collectives/communicator.h"

namespace troupe::collectives {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  uint64_t generation = 0;
  int device = 0;  // CUDA device ordinal this rank uses
  std::string key_prefix = "troupe";
  absl::Duration connect_timeout = absl::Seconds(60);
};

// True when this build has the NCCL backend and a CUDA device is usable; `why` says why not.
bool NcclAvailable(std::string* why);

[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    Bootstrap* bootstrap, const NcclOptions& options);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_NCCL_COMMUNICATOR_H_
