// Offline views of one training job: the Job record the head serves at /api/jobs/<id> (see the
// operator API: series, events, ranks, checkpoints) turned into a Chrome/Perfetto trace or an SVG
// plot, so a run can be inspected after the fact without the dashboard.
//
// Example:
//   nlohmann::json job = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
//   absl::StatusOr<std::string> trace = ChromeTrace(job);  // open in ui.perfetto.dev
//   absl::StatusOr<std::string> svg = PlotSvg(job);
//
// Both are pure functions of the record. A record with a missing required field or a field of the
// wrong type gives InvalidArgument naming the field path and the expected vs got type, e.g.
// "ranks[2].start: expected number, got string"; no exception escapes. Absent or null optional
// numbers (the API omits unknown ones) are left out of the output.
#ifndef TROUPE_TOOLS_JOB_VIEWS_H_
#define TROUPE_TOOLS_JOB_VIEWS_H_

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"

namespace troupe::tools {

// A trace in the Chrome JSON object format ({"traceEvents": [...], "displayTimeUnit": "ms"}),
// times in microseconds since the job's earliest time. One process (pid 1, named by the job id)
// with these threads:
//   tid 0 "job":          one B/E span "step N" per committed step (from the previous commit, or
//                         started_at, to this commit), global instants "fault <kind>" and
//                         "recovered".
//   tid 1 "checkpoints":  "checkpoint N" spans, ending at the checkpoint's t.
//   tid 2 "recovery":     "recovery" spans, ending at the recovered event's t and lasting its
//                         `seconds` (without them: from the last fault).
//   tid 3.. <worker>:     one per worker name, in name order: "step N" per rank step, with
//                         "compute" then "collective" inside it.
// Checkpoints and recoveries straddle step boundaries, so they get their own threads: on the job
// thread they would overlap the step spans without nesting, which trace viewers mis-draw.
[[nodiscard]] absl::StatusOr<std::string> ChromeTrace(const nlohmann::json& job);

// A standalone 960x540 SVG: loss vs step over tokens/s vs step, titled with the job id, state and
// steps; a dashed <g class="fault-marker" data-step="N"> per fault (fault_fired/fault_armed) and a
// <g class="recovery-marker" data-step="N"> per recovery. No committed steps: a valid SVG saying
// so.
[[nodiscard]] absl::StatusOr<std::string> PlotSvg(const nlohmann::json& job);

}  // namespace troupe::tools

#endif  // TROUPE_TOOLS_JOB_VIEWS_H_
