// internal/lease.h — the head's leases: at most one holder of a named role at a time.
//
// The training coordinator commits steps, names checkpoints in LATEST and saves its record only
// while it holds the lease on its name. A lease lasts `length` (the head grants its heartbeat
// timeout). The same holder renews its lease and keeps its epoch; a new holder is granted a new,
// higher epoch only once the previous lease ran out, so a holder cut off from the head has
// stopped acting before anyone else may start. The epoch is the
// fencing token the checkpoint store keeps (CheckpointStore::Claim): it is at least the grant's
// wall-clock time in microseconds, so a head started later (a new cluster on an old work_dir)
// grants higher epochs than an earlier head did. A lease whose holder's process is known to have
// exited (its node agent's waitpid) is released at once: a dead process writes nothing.
//
// Pure: no clock of its own (a test drives the time). Not thread-safe: owned by the head's actor.
#ifndef TROUPE_RUNTIME_INTERNAL_LEASE_H_
#define TROUPE_RUNTIME_INTERNAL_LEASE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace troupe::runtime::internal {

class LeaseTable {
 public:
  using Clock = std::chrono::steady_clock;
  struct Grant {
    uint64_t epoch = 0;
    Clock::time_point expiry;
  };

  // Grants or renews `name`'s lease to `holder` (an incarnation: one string per actor start, in
  // the process of worker `worker`) until now + length. Unavailable while another holder's lease
  // runs (the message names it and how long it has left): asking again after that succeeds.
  // `wall_us`: the wall clock, in microseconds.
  absl::StatusOr<Grant> Acquire(const std::string& name, const std::string& holder,
                                const std::string& worker, Clock::time_point now,
                                Clock::duration length, uint64_t wall_us);
  // `worker`'s process has exited: its leases end now (the next holder keeps no higher epoch).
  void ReleaseWorker(const std::string& worker);

 private:
  struct Lease {
    std::string holder;
    std::string worker;
    Grant grant;
  };
  std::map<std::string, Lease> leases_;
  uint64_t last_epoch_ = 0;
};

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_LEASE_H_
