// The NCCL backend in a build without CUDA: the communicator's logic is there
// (nccl_comm.h, tested over the fake), the libraries it would call are not.
#include "nccl_backend.h"

namespace troupe::collectives {

absl::StatusOr<std::shared_ptr<NcclBackend>> RealNcclBackend() {
  return absl::FailedPreconditionError(
      "troupe was built without CUDA (TROUPE_HAVE_CUDA=OFF or NCCL not found): no NCCL backend");
}

}  // namespace troupe::collectives
