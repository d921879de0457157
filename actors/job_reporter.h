// job_reporter.h — a training job as the cluster's head sees it (runtime/internal/jobs.h): the
// driver registers the job (or attaches to a submitted one), then sends the head its event log
// (<work_dir>/logs/events.log, as the coordinator, the ranks and the driver append to it) and its
// progress lines, and at the end how the job ended. Private to actors/.
//
// A thread of its own reads the event log every 200 ms and sends what is new; a head that takes
// over (SetHead) gets the job registered again and the whole log from its start, so its
// dashboard and metrics lose nothing the log holds.
#ifndef TROUPE_ACTORS_JOB_REPORTER_H_
#define TROUPE_ACTORS_JOB_REPORTER_H_

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <streambuf>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "caf/actor.hpp"
#include "caf/actor_system.hpp"
#include "troupe/actors/training.h"
#include "troupe/train/job_spec.h"

namespace troupe::actors {

class JobReporter {
 public:
  // `job_id`: "" for a job of its own, else the submitted job this driver runs.
  JobReporter(const train::JobSpec& spec, std::string job_id);
  ~JobReporter();
  JobReporter(const JobReporter&) = delete;
  JobReporter& operator=(const JobReporter&) = delete;

  // Registers the job with `head` (refused when the head does not know a submitted job's id, or
  // it has ended) and starts sending. `driver` receives (job_stop_atom, id) when someone stops
  // the job.
  [[nodiscard]] absl::Status Connect(caf::actor_system& sys, caf::actor head, caf::actor driver);
  const std::string& id() const { return id_; }
  // The head that took over: the job is registered there again, the event log sent again.
  void SetHead(caf::actor head);
  // A progress line (the driver's output), for `troupe job logs`; kept until connected.
  void Line(std::string line);
  // Sends what is left of the event log, then how the job ended; waits (up to 5 s) until the
  // head has it, so that a node agent's report of this process's exit cannot come first.
  void End(const absl::StatusOr<JobReport>& report);

 private:
  absl::Status Register(const caf::actor& head);
  void Run();
  void Flush(const caf::actor& head);

  caf::actor_system* sys_ = nullptr;
  std::string id_, name_, spec_toml_, log_path_;
  int64_t steps_;
  caf::actor driver_;
  std::mutex mu_;
  std::condition_variable cv_;
  caf::actor head_;  // under mu_
  bool reregister_ = false, stop_ = false;
  std::vector<std::string> lines_;  // progress lines not yet sent, under mu_
  uint64_t offset_ = 0;             // of the event log, sent up to here (the thread's)
  std::thread thread_;
};

// An ostream buffer that passes each complete line to `out`, in one write, and to `line`. The
// driver's actor and its thread both print, in pieces (`out << "job " << id << …`), and the
// process's actors print to the same stdout: each thread's line is gathered apart and written
// whole, so no line comes out with another inside it. A line not yet ended is written when it
// ends, or when the LineTee goes.
class LineTee : public std::streambuf {
 public:
  LineTee(std::ostream& out, std::function<void(std::string)> line)
      : out_(out), line_(std::move(line)) {}
  ~LineTee() override;  // writes what is left of lines not ended, each whole

 protected:
  int overflow(int c) override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;
  int sync() override;

 private:
  void Put(std::thread::id thread, char c);  // under mu_

  std::mutex mu_;
  std::ostream& out_;
  std::function<void(std::string)> line_;
  std::map<std::thread::id, std::string> pending_;  // each thread's line so far
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_JOB_REPORTER_H_
