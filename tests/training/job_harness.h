// What the end-to-end training tests read back from a job: its report (`troupe train --report`),
// its event log (<work_dir>/logs/events.log, actors/job_events.h) and its exactly-once records
// (<work_dir>/serve/*.log against <work_dir>/commits.log). Tests assert the fields of events,
// never the wording of progress lines. Shared by TrainingTest (one host) and MultihostTest (the
// lab).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "troupe/runtime/events.h"

namespace troupe::testing {

std::string Slurp(const std::string& path);

// The fields of `troupe train --report FILE` (-1 / "" when absent).
struct Report {
  double recovery_s = -1;
  int steps_lost = -1, steps = -1, world = -1, generations = -1;
  std::string crc;
};
Report ReadReport(const std::string& path);

using runtime::SupervisionEvent;
using Fields = std::map<std::string, std::string>;

// The parsed lines of an event log.
std::vector<SupervisionEvent> ReadEvents(const std::string& path);
// A field of `e` by its name in the log line (its own members or its further fields).
std::string FieldOf(const SupervisionEvent& e, const std::string& key);
// The events named `name` with every field of `fields`.
std::vector<SupervisionEvent> FindEvents(const std::vector<SupervisionEvent>& events,
                                         const std::string& name, const Fields& fields = {});

// Every committed (step, generation) of the job in `work_dir` was served exactly once per
// microbatch, and every step 0..steps-1 was committed exactly once. "" when so, else what is
// wrong (one line per defect).
std::string ExactlyOnceDefects(const std::string& work_dir, int steps, int microbatches);

}  // namespace troupe::testing
