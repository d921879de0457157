// internal/jobs.h — the head's jobs: what `troupe job`, `troupe status`, the dashboard and
// /metrics read. Owned by the head's actor (no locking here).
//
// A job is submitted (`troupe job submit`: pending until a node agent starts its driver) or
// registered by a driver that runs already (`troupe train`, embedded or --head). Its driver then
// sends the job's event log (<work_dir>/logs/events.log, train/job_events.h) line by line and
// its progress lines; the table turns them into the job's state, series and metrics. The record
// (JobTable::Record: no series) is what the head's store keeps, so a head that takes over lists
// every job; the series, rank timings and logs are rebuilt from a driver that re-registers (it
// sends its event log again from the start).
//
// The JSON views are the head's HTTP API (docs in runtime/ops_http.cc).
#ifndef TROUPE_RUNTIME_INTERNAL_JOBS_H_
#define TROUPE_RUNTIME_INTERNAL_JOBS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "troupe/base/events.h"

namespace troupe::runtime::internal {

// kQueued: its driver runs, and waits for the head to grant its minimum of ranks at once (why:
// Job::waiting). kPreempted: every worker was noticed; the committed step is checkpointed, and the
// same job submitted again resumes from it (`troupe job wait` exits 75 for it, as `troupe train`
// does).
enum class JobState { kPending, kQueued, kRunning, kSucceeded, kFailed, kStopped, kPreempted };
inline constexpr JobState kJobStates[] = {
    JobState::kPending, JobState::kQueued,  JobState::kRunning,  JobState::kSucceeded,
    JobState::kFailed,  JobState::kStopped, JobState::kPreempted};
// "pending", "running", ...: the state as the API, the store and `troupe job` spell it.
const char* Name(JobState s);
// The inverse of Name (internal/enum_text.h); InvalidArgument naming "job state" otherwise.
absl::StatusOr<JobState> ParseJobState(const std::string& text);
bool JobEnded(JobState s);

// A Prometheus histogram (cumulative buckets, _sum and _count).
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // per bound, not cumulative; the last is +Inf
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1) {}
  void Observe(double v);
};

struct Job {
  std::string id, name, spec_toml, node, error, last_event;
  std::string waiting;  // queued: why its ranks do not fit yet
  JobState state = JobState::kPending;
  int32_t priority = 0;  // [job] priority, as its driver asks for ranks
  bool submitted = false;
  int64_t driver_pid = 0, steps = 0;
  double submitted_at = 0, started_at = 0, ended_at = 0;
  nlohmann::json report = nullptr;  // the driver's, once succeeded
  // From the event log:
  int64_t step = 0, world = 0, generation = 0, steps_lost = 0;
  double loss = 0, tokens_per_s = 0;
  // [eval]: the newest validation loss (of the parameters of val_step steps; -1: none yet).
  int64_t val_step = -1;
  double val_loss = 0;
  nlohmann::json val_series = nlohmann::json::array();  // {t, step, val_loss} per evaluation
  nlohmann::json series = nlohmann::json::array(), events = nlohmann::json::array(),
                 ranks = nlohmann::json::array(), checkpoints = nlohmann::json::array();
  uint64_t recoveries = 0, collective_bytes = 0, checkpoint_bytes = 0;
  double collective_seconds = 0;
  std::map<std::string, uint64_t> restarts;  // by supervisor
  Histogram step_seconds{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  Histogram recovery_seconds{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram checkpoint_seconds{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  std::deque<std::string> logs;
};

class JobTable {
 public:
  // A submitted job, pending: its id ("job-N").
  std::string Submit(const std::string& name, const std::string& spec_toml, int64_t steps,
                     double now);
  // A driver starts (or starts again after the head changed): `id` "" registers a new job; a
  // submitted job's id attaches its driver (one this head does not know — its predecessor had
  // no store — is taken as it is). Resets what the event log will be replayed into. An ended
  // job is refused (FailedPrecondition).
  absl::StatusOr<std::string> Register(const std::string& id, const std::string& name,
                                       const std::string& spec_toml, int64_t steps, int64_t pid,
                                       const std::string& node, double now);
  void Placed(const std::string& id, const std::string& node);
  // The job's driver waits for its ranks (`why`), or got them: queued <-> running.
  void Queued(const std::string& id, const std::string& why, int32_t priority);
  void Admitted(const std::string& id, int32_t priority);
  // Lines of the job's event log, in order.
  void Ingest(const std::string& id, const std::vector<std::string>& lines);
  void Log(const std::string& id, const std::vector<std::string>& lines);
  // The driver says how the job ended. `report`: JSON text (succeeded) or "".
  void End(const std::string& id, JobState state, const std::string& error,
           const std::string& report, double now);

  Job* Find(const std::string& id);
  const Job* Find(const std::string& id) const;
  const std::map<std::string, Job>& jobs() const { return jobs_; }
  // Jobs whose driver is to be started (pending, not yet placed).
  std::vector<std::string> Unplaced() const;

  // The record a store keeps (no series), and a job rebuilt from one.
  static std::string Record(const Job& j);
  absl::Status Restore(const std::string& id, const std::string& record);

  static nlohmann::json Summary(const Job& j);
  static nlohmann::json Full(const Job& j);
  // The job's Prometheus series (troupe_job_*, troupe_step_seconds, ...), every job's.
  std::string Metrics() const;

 private:
  std::map<std::string, Job> jobs_;
  int64_t next_ = 1;
};

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_JOBS_H_
