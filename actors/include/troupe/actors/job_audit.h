// job_audit.h — what a finished training job's own records say about it, checked: every
// committed step's microbatches served exactly once. The records are the coordinator's
// <work_dir>/commits.log ("<step> <generation>" per commit) and each rank's
// <work_dir>/serve/<worker>.log ("<step> <microbatch> <generation>" per microbatch it trained).
// `troupe chaos run` checks every trial with it; the training tests use it too.
#ifndef TROUPE_ACTORS_JOB_AUDIT_H_
#define TROUPE_ACTORS_JOB_AUDIT_H_

#include <cstdint>
#include <string>

namespace troupe::actors {

// Every committed (step, generation) of the job in `work_dir` was served exactly once per
// microbatch, every step 0..steps-1 was committed, and the commits of a step after its first
// are exactly the `steps_lost` the job reported (steps re-run after a rollback to a checkpoint,
// when a shard's owner and its buddy died together). "" when so, else what is wrong (one line
// per defect).
std::string ExactlyOnceDefects(const std::string& work_dir, int64_t steps, int32_t microbatches,
                               int64_t steps_lost = 0);

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_JOB_AUDIT_H_
