// What the end-to-end training tests read back from a job: its report (`troupe train --report`),
// its event log (<work_dir>/logs/events.log, train/job_events.h) and its exactly-once records
// (<work_dir>/serve/*.log against <work_dir>/commits.log). Tests assert the fields of events,
// never the wording of progress lines. Shared by TrainingTest (one host) and MultihostTest (the
// lab).
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "troupe/actors/job_audit.h"
#include "troupe/base/events.h"

namespace troupe::testing {

std::string Slurp(const std::string& path);

// The fields of `troupe train --report FILE` (-1 / "" when absent).
struct Report {
  double recovery_s = -1;
  int steps_lost = -1, steps = -1, world = -1, generations = -1;
  std::string crc;
  double val_loss = -1;  // [eval]: the final parameters' validation loss
  // A rank's mean step by phase, seconds, and the overlapped exchange's hidden share.
  double step_s = -1, compute_s = -1, exposed_s = -1, update_s = -1, overlap = -1;
  double delta_share = -1;  // of rank steps sending their updated parameters as a delta
};
Report ReadReport(const std::string& path);

using base::SupervisionEvent;
using Fields = std::map<std::string, std::string>;

// The parsed lines of an event log.
std::vector<SupervisionEvent> ReadEvents(const std::string& path);
// A field of `e` by its name in the log line (its own members or its further fields).
std::string FieldOf(const SupervisionEvent& e, const std::string& key);
// The events named `name` with every field of `fields`.
std::vector<SupervisionEvent> FindEvents(const std::vector<SupervisionEvent>& events,
                                         const std::string& name, const Fields& fields = {});

using actors::ExactlyOnceDefects;  // the product's audit (troupe/actors/job_audit.h)

// What a `troupe train` run left: its exit code (-1: killed after its timeout), its output and
// its report.
struct JobRun {
  int exit_code = -1;
  std::string output;
  Report report;
};

constexpr int kSteps = 24;
constexpr int kMicrobatches = 8;

// A test that runs `troupe train` jobs (TROUPE_BINARY) in <tmp>/troupe_<suite>_<pid>_<test>/<run>
// on one prepared corpus: a spec of steps_ (kSteps unless a suite says) steps of microbatches_
// (kMicrobatches) microbatches, min 1 / max max_workers_ (6) workers, a checkpoint every 5 steps,
// then spec_extra_.
class JobTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;  // the directory stays for a failed test (or TROUPE_KEEP_TEST_DIRS)

  // Starts `troupe train` in its own process group; output goes to <dir>/out.txt.
  pid_t Start(const std::string& dir, const std::vector<std::string>& extra);
  // The exit code of `pid` (128 + signal when killed); -1 after `timeout`, when every thread's
  // stack is printed (gdb) and its process group killed.
  static int Wait(pid_t pid, std::chrono::milliseconds timeout);
  JobRun Train(const std::string& name, const std::vector<std::string>& extra,
               std::chrono::milliseconds timeout = std::chrono::milliseconds(240000));
  // The fault-free 4-worker run's final weights: computed once for a troupe binary and spec, then
  // read by every other test process (<data dir>/reference-<key>.crc).
  const std::string& Reference();
  // Every committed (step, generation) was served exactly once per microbatch, and every step
  // 0..steps-1 (default: steps_ - 1) was committed exactly once.
  void ExpectExactlyOnce(const std::string& name, int steps = -1, int64_t steps_lost = 0);
  // The events of run `name`'s log.
  std::vector<SupervisionEvent> Events(const std::string& name);
  std::string EventLogText(const std::string& name);
  bool HasEvent(const std::string& run, const std::string& event, const Fields& fields = {});
  // Polls run `name`'s log until it has the event, or `timeout` passes.
  bool WaitForEvent(const std::string& run, const std::string& event, const Fields& fields,
                    std::chrono::seconds timeout);
  // Lines of <dir>/commits.log: the steps committed so far.
  static int Commits(const std::string& dir);

  std::string base_, data_, spec_;
  int steps_ = kSteps;  // a suite may change these in its constructor
  int microbatches_ = kMicrobatches;
  int max_workers_ = 6;
  std::string spec_extra_;  // TOML sections after the spec's own
};

}  // namespace troupe::testing
