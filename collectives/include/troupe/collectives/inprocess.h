// troupe/collectives/inprocess.h — an in-process backend: every rank is a Communicator in this
// process (drive each from its own thread), messages are memcpy'd through a shared mailbox.
// It runs the same algorithms as the UCX backend, so unit tests cover them without processes.
//
// Example:
//   std::vector<std::unique_ptr<Communicator>> comms;
//   auto group = InProcessGroup::Create(/*size=*/4, /*generation=*/0, &comms);
//   // thread i: comms[i]->AllReduce(in_i, out_i, ReduceOp::kSum, {}).Wait();
//   group->KillRank(2);  // simulate a death: pending ops elsewhere fail with Unavailable
#ifndef TROUPE_COLLECTIVES_INPROCESS_H_
#define TROUPE_COLLECTIVES_INPROCESS_H_

#include <memory>
#include <vector>

#include "troupe/collectives/communicator.h"

namespace troupe::collectives {

class InProcessGroup {
 public:
  virtual ~InProcessGroup() = default;
  // Creates `size` communicators (rank i is (*comms)[i]). The group outlives none of them by
  // itself: keep the returned pointer while the communicators are in use.
  static std::shared_ptr<InProcessGroup> Create(int size, uint64_t generation,
                                                std::vector<std::unique_ptr<Communicator>>* comms);
  // Simulates the death of `rank`: every other rank's pending and later operations fail with
  // Unavailable naming it; the dead rank's own fail with Unavailable too.
  virtual void KillRank(int rank) = 0;
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_INPROCESS_H_
