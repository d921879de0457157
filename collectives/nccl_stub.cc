// The NCCL backend in a build without CUDA.
#include "troupe/collectives/nccl_communicator.h"

namespace troupe::collectives {

bool NcclAvailable(std::string* why) {
  *why = "troupe was built without CUDA (TROUPE_HAVE_CUDA=OFF): no NCCL backend";
  return false;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Bootstrap*,
                                                                     const NcclOptions&) {
  return absl::FailedPreconditionError(
      "CreateNcclCommunicator: troupe was built without CUDA (TROUPE_HAVE_CUDA=OFF)");
}

}  // namespace troupe::collectives
