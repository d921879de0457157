// troupe/train/preempted.h — the error of a job that stopped because its workers were preempted.
//
// Every worker noticed (a spot notice) at once: the coordinator checkpoints the committed step and
// ends the job with PreemptedError; the driver returns it, and running the job again resumes from
// that checkpoint. IsPreempted tells it from a failure.
#ifndef TROUPE_TRAIN_PREEMPTED_H_
#define TROUPE_TRAIN_PREEMPTED_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"

namespace troupe::train {

// UNAVAILABLE, "preempted: <what>".
inline absl::Status PreemptedError(const std::string& what) {
  return absl::UnavailableError("preempted: " + what);
}

inline bool IsPreempted(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         absl::StartsWith(status.message(), "preempted: ");
}

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_PREEMPTED_H_
