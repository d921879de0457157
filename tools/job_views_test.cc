// The job views on one hand-made Job record: 3 ranks, 12 committed steps, a worker killed in step
// 5 (its attempt uncommitted, generation 1 -> 2, a replacement worker), recovered at step 6, and
// two checkpoints that straddle step boundaries. The trace is checked for structure (fields,
// nesting per thread) and meaning; the SVG for well-formedness and its markers.
#include "job_views.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace troupe::tools {
namespace {

using json = nlohmann::json;

constexpr double kT0 = 1764180000.0;

// Commit time of each step: 0.1 s apart, with 0.5 s lost to the fault in step 5.
double CommitT(int step) { return kT0 + 0.1 * step + (step >= 5 ? 0.5 : 0); }

json MakeJob() {
  json job = {{"id", "job-7"}, {"state", "running"}, {"steps", 60}, {"started_at", kT0}};
  json series = json::array(), ranks = json::array();
  auto rank_step = [&](const char* worker, int rank, int step, int gen, double start, bool ok) {
    // Rank 2 in step 3 overshoots step_s with its parts: the trace clamps them.
    const double compute = (rank == 2 && step == 3) ? 0.04 : 0.03;
    ranks.push_back({{"worker", worker},
                     {"rank", rank},
                     {"step", step},
                     {"generation", gen},
                     {"start", start},
                     {"step_s", 0.05},
                     {"compute_s", compute},
                     {"collective_s", 0.015 + (compute - 0.03)},
                     {"collective_bytes", 123456},
                     {"committed", ok}});
  };
  // Rank 1's worker dies in step 5 of generation 1; the step reruns in generation 2 on n1/w1.
  rank_step("n1/w0", 1, 5, 1, CommitT(4) + 0.01, false);
  for (int step = 1; step <= 12; ++step) {
    const int gen = step >= 5 ? 2 : 1;
    const double start = step == 5 ? kT0 + 0.84 : CommitT(step - 1) + 0.01;
    rank_step("n0/w0", 0, step, gen, start, true);
    rank_step(step >= 5 ? "n1/w1" : "n1/w0", 1, step, gen, start, true);
    rank_step("n2/w0", 2, step, gen, start, true);
    series.push_back({{"t", CommitT(step)},
                      {"step", step},
                      {"loss", 5.5 - 0.2 * step},
                      {"tokens_per_s", 5000.0 + 10 * step},
                      {"step_s", 0.05},
                      {"world", 3},
                      {"generation", gen}});
  }
  job["series"] = series;
  job["ranks"] = ranks;
  job["events"] = {{{"t", kT0}, {"event", "fault_armed"}, {"step", 5}, {"kind", "kill-worker"}},
                   {{"t", kT0 + 0.43},
                    {"event", "fault_fired"},
                    {"step", 5},
                    {"kind", "kill-worker"},
                    {"text", "fault_fired kind=kill-worker step=5 rank=1"}},
                   {{"t", kT0 + 0.5}, {"event", "generation"}, {"step", 5}},
                   {{"t", kT0 + 0.83},
                    {"event", "recovered"},
                    {"step", 6},
                    {"seconds", 0.4},
                    {"kind", "kill-worker"}},
                   {{"t", CommitT(4) + 0.02}, {"event", "checkpoint_committed"}, {"step", 4}},
                   {{"t", CommitT(8) + 0.02}, {"event", "checkpoint_committed"}, {"step", 8}}};
  job["checkpoints"] = {
      {{"step", 4}, {"t", CommitT(4) + 0.02}, {"seconds", 0.03}, {"bytes", 400000}},
      {{"step", 8}, {"t", CommitT(8) + 0.02}, {"seconds", 0.03}, {"bytes", 400000}}};
  return job;
}

json Trace(const json& job) {
  absl::StatusOr<std::string> trace = ChromeTrace(job);
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? json::parse(*trace) : json();
}

// What is wrong with the nesting of the trace's spans, or "" if nothing: per thread, B/E pairs
// must match as a stack in time order, all spans (X and B/E) must nest without partial overlap,
// and "compute"/"collective" must lie inside a "step" span.
std::string NestingProblem(const json& trace) {
  struct Interval {
    int64_t begin, end;
    std::string name;
  };
  std::map<int64_t, std::vector<json>> by_tid;
  for (const json& e : trace["traceEvents"]) by_tid[e["tid"].get<int64_t>()].push_back(e);
  for (auto& [tid, events] : by_tid) {
    const std::string where = "tid " + std::to_string(tid) + ": ";
    std::stable_sort(events.begin(), events.end(),
                     [](const json& a, const json& b) { return a["ts"] < b["ts"]; });
    std::vector<Interval> intervals, open;
    for (const json& e : events) {
      const int64_t ts = e["ts"];
      if (e["ph"] == "X") intervals.push_back({ts, ts + e["dur"].get<int64_t>(), e["name"]});
      if (e["ph"] == "B") open.push_back({ts, ts, e["name"]});
      if (e["ph"] == "E") {
        if (open.empty()) return where + "E without B at ts " + std::to_string(ts);
        if (open.back().name != e["name"]) return where + "E closes " + open.back().name;
        intervals.push_back({open.back().begin, ts, open.back().name});
        open.pop_back();
      }
    }
    if (!open.empty()) return where + "B without E: " + open.back().name;
    // Outer spans first: by begin, then longest first; each must fit inside the innermost span
    // still open at its begin.
    std::sort(intervals.begin(), intervals.end(), [](const Interval& a, const Interval& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    std::vector<Interval> stack;
    for (const Interval& in : intervals) {
      while (!stack.empty() && stack.back().end <= in.begin) stack.pop_back();
      if (!stack.empty() && in.end > stack.back().end) {
        return where + in.name + " overlaps " + stack.back().name + " without nesting";
      }
      if ((in.name == "compute" || in.name == "collective") &&
          (stack.empty() || stack.back().name.rfind("step ", 0) != 0)) {
        return where + in.name + " outside a step at ts " + std::to_string(in.begin);
      }
      stack.push_back(in);
    }
  }
  return "";
}

int64_t Tid(const json& trace, const std::string& thread) {
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == thread)
      return e["tid"];
  }
  ADD_FAILURE() << "no thread " << thread;
  return -1;
}

std::vector<json> Events(const json& trace, const std::string& ph, int64_t tid) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == ph && e["tid"] == tid) out.push_back(e);
  }
  return out;
}

TEST(TraceTest, EveryEventIsCompleteAndSpansNestPerThread) {
  const json trace = Trace(MakeJob());
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  ASSERT_TRUE(trace["traceEvents"].is_array());
  for (const json& e : trace["traceEvents"]) {
    for (const char* key : {"ph", "ts", "pid", "tid", "name"}) {
      ASSERT_TRUE(e.contains(key)) << key << " missing in " << e;
    }
    EXPECT_EQ(e["pid"], 1) << e;
    EXPECT_GE(e["ts"].get<double>(), 0) << e;
    if (e["ph"] == "X") {
      EXPECT_GE(e["dur"].get<double>(), 0) << e;
    }
  }
  EXPECT_EQ(NestingProblem(trace), "");
}

TEST(TraceTest, NestingCheckerCatchesOverlapsAndUnmatchedEnds) {
  const json overlap = {{"traceEvents",
                         {{{"ph", "X"}, {"name", "step 1"}, {"tid", 1}, {"ts", 0}, {"dur", 10}},
                          {{"ph", "X"}, {"name", "compute"}, {"tid", 1}, {"ts", 5}, {"dur", 10}}}}};
  EXPECT_NE(NestingProblem(overlap), "");
  const json unmatched = {
      {"traceEvents", {{{"ph", "E"}, {"name", "step 1"}, {"tid", 0}, {"ts", 3}}}}};
  EXPECT_NE(NestingProblem(unmatched), "");
}

TEST(TraceTest, NamesTheProcessAndOneThreadPerWorker) {
  const json trace = Trace(MakeJob());
  std::set<std::string> threads;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name") {
      EXPECT_EQ(e["args"]["name"], "job-7");
    } else {
      EXPECT_TRUE(threads.insert(e["args"]["name"]).second) << e;
    }
  }
  EXPECT_EQ(threads, (std::set<std::string>{"job", "checkpoints", "recovery", "n0/w0", "n1/w0",
                                            "n1/w1", "n2/w0"}));
  EXPECT_EQ(Tid(trace, "job"), 0);
  // Workers in name order; the replacement n1/w1 gets its own thread.
  EXPECT_LT(Tid(trace, "n0/w0"), Tid(trace, "n1/w0"));
  EXPECT_LT(Tid(trace, "n1/w0"), Tid(trace, "n1/w1"));
  EXPECT_LT(Tid(trace, "n1/w1"), Tid(trace, "n2/w0"));
  const std::vector<json> old_worker = Events(trace, "X", Tid(trace, "n1/w0"));
  EXPECT_EQ(old_worker.size(), 4u * 3 + 3);  // steps 1-4 and the failed step 5, with children
  const json failed = old_worker[0];
  EXPECT_EQ(failed["name"], "step 5");
  EXPECT_EQ(failed["args"]["committed"], false);
  EXPECT_EQ(failed["args"]["generation"], 1);
}

TEST(TraceTest, OneJobStepSpanPerCommittedStep) {
  const json trace = Trace(MakeJob());
  const std::vector<json> begins = Events(trace, "B", Tid(trace, "job"));
  ASSERT_EQ(begins.size(), 12u);
  EXPECT_EQ(Events(trace, "E", Tid(trace, "job")).size(), 12u);
  for (size_t i = 0; i < begins.size(); ++i) {
    EXPECT_EQ(begins[i]["name"], "step " + std::to_string(i + 1));
  }
  // The first step starts at started_at, the job's earliest time.
  EXPECT_EQ(begins[0]["ts"], 0);
  EXPECT_EQ(Events(trace, "E", Tid(trace, "job"))[0]["ts"], 100000);
}

TEST(TraceTest, RankStepsHoldComputeThenCollectiveClampedToTheStep) {
  const json trace = Trace(MakeJob());
  // Rank 2 in step 3: compute 0.04 s + collective 0.025 s > step_s.
  const std::vector<json> events = Events(trace, "X", Tid(trace, "n2/w0"));
  const auto step3 = std::find_if(events.begin(), events.end(),
                                  [](const json& e) { return e["name"] == "step 3"; });
  ASSERT_NE(step3, events.end());
  ASSERT_GE(events.end() - step3, 3);
  const json &step = step3[0], &compute = step3[1], &collective = step3[2];
  EXPECT_EQ(step["dur"], 50000);
  EXPECT_EQ(step["args"]["step"], 3);
  EXPECT_EQ(compute["name"], "compute");
  EXPECT_EQ(compute["ts"], step["ts"]);
  EXPECT_EQ(compute["dur"], 40000);
  EXPECT_EQ(collective["name"], "collective");
  EXPECT_EQ(collective["ts"], step["ts"].get<int64_t>() + 40000);
  EXPECT_EQ(collective["dur"], 10000);  // clamped from 25000
  EXPECT_EQ(collective["args"]["collective_bytes"], 123456);
}

TEST(TraceTest, FaultRecoveryAndCheckpoints) {
  const json trace = Trace(MakeJob());
  int fired = 0;
  int64_t recovered_ts = -1;
  for (const json& e : Events(trace, "i", Tid(trace, "job"))) {
    EXPECT_EQ(e["s"], "g");
    if (e["name"] == "fault kill-worker" && e["args"]["event"] == "fault_fired") {
      ++fired;
      EXPECT_EQ(e["args"]["step"], 5);
      EXPECT_EQ(e["ts"], 430000);
    }
    if (e["name"] == "recovered") {
      recovered_ts = e["ts"];
      EXPECT_EQ(e["args"]["step"], 6);
      EXPECT_EQ(e["args"]["seconds"], 0.4);
    }
  }
  EXPECT_EQ(fired, 1);
  const std::vector<json> recovery = Events(trace, "X", Tid(trace, "recovery"));
  ASSERT_EQ(recovery.size(), 1u);
  EXPECT_EQ(recovery[0]["name"], "recovery");
  EXPECT_EQ(recovery[0]["dur"], 400000);
  EXPECT_EQ(recovery[0]["ts"].get<int64_t>() + 400000, recovered_ts);
  const std::vector<json> checkpoints = Events(trace, "X", Tid(trace, "checkpoints"));
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_EQ(checkpoints[0]["name"], "checkpoint 4");
  EXPECT_EQ(checkpoints[0]["ts"], 390000);
  EXPECT_EQ(checkpoints[0]["dur"], 30000);
  EXPECT_EQ(checkpoints[1]["args"]["bytes"], 400000);
}

TEST(TraceTest, MalformedRecordsAreInvalidArgumentNamingTheField) {
  auto error = [](const json& job) {
    absl::StatusOr<std::string> trace = ChromeTrace(job);
    EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument) << trace.status();
    return std::string(trace.status().message());
  };
  json job = MakeJob();
  job["series"] = {{"t", 1.0}};
  EXPECT_EQ(error(job), "series: expected array, got object");
  job = MakeJob();
  job["ranks"][2]["start"] = "soon";
  EXPECT_EQ(error(job), "ranks[2].start: expected seconds within +-1e11, got string");
  job = MakeJob();
  job["series"][0]["step"] = 1.5;
  EXPECT_EQ(error(job), "series[0].step: expected integer, got float 1.5");
  job = MakeJob();
  job["events"][1].erase("event");
  EXPECT_EQ(error(job), "events[1].event: expected string, got nothing (missing)");
  job = MakeJob();
  job["checkpoints"][1]["t"] = 1e300;  // times are bounded, so offsets in microseconds fit
  EXPECT_EQ(error(job), "checkpoints[1].t: expected seconds within +-1e11, got float 1e+300");
  EXPECT_EQ(error(json::array()), "job: expected object, got array");
  EXPECT_EQ(PlotSvg(json{{"id", 7}}).status().message(), "id: expected string, got integer 7");
}

TEST(TraceTest, OptionalNumbersMayBeAbsentOrNullAndTextNeedNotBeUtf8) {
  json job = MakeJob();
  job["started_at"] = nullptr;
  job["ranks"][0].erase("compute_s");
  job["events"][3]["seconds"] = nullptr;  // the recovery span then starts at the fault
  job["id"] = "job-\xff";
  const json trace = Trace(job);
  EXPECT_EQ(NestingProblem(trace), "");
  const std::vector<json> recovery = Events(trace, "X", Tid(trace, "recovery"));
  ASSERT_EQ(recovery.size(), 1u);
  EXPECT_EQ(recovery[0]["dur"], 400000);
}

// Tags open and close in order (self-closing ones aside): enough XML for a generated file.
bool BalancedTags(const std::string& xml) {
  std::vector<std::string> open;
  for (size_t pos = xml.find('<'); pos != std::string::npos; pos = xml.find('<', pos + 1)) {
    const size_t end = xml.find('>', pos);
    if (end == std::string::npos) return false;
    const std::string tag = xml.substr(pos + 1, end - pos - 1);
    const std::string name =
        tag.substr(tag[0] == '/', tag.find_first_of(" />", 1) - (tag[0] == '/'));
    if (tag[0] == '/') {
      if (open.empty() || open.back() != name) return false;
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(name);
    }
  }
  return open.empty();
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

TEST(PlotTest, TwoPanelsWithOneMarkerPerFaultAndRecovery) {
  absl::StatusOr<std::string> svg = PlotSvg(MakeJob());
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(svg->rfind("<svg", 0), 0u);
  EXPECT_EQ(svg->substr(svg->size() - 7), "</svg>\n");
  EXPECT_TRUE(BalancedTags(*svg)) << *svg;
  EXPECT_NE(svg->find("width=\"960\" height=\"540\""), std::string::npos);
  EXPECT_NE(svg->find("job-7 — running — step 12/60"), std::string::npos);
  EXPECT_EQ(Count(*svg, "<polyline"), 2);
  // fault_armed and fault_fired of the same fault make one marker.
  EXPECT_EQ(Count(*svg, "class=\"fault-marker\""), 1);
  EXPECT_EQ(Count(*svg, "class=\"fault-marker\" data-step=\"5\""), 1);
  EXPECT_EQ(Count(*svg, "class=\"recovery-marker\" data-step=\"6\""), 1);
}

// [eval]'s validation losses: a dashed curve on the loss panel's scale, which widens to hold them.
TEST(PlotTest, TheValidationLossIsADashedCurveOnTheLossPanel) {
  json job = MakeJob();
  job["val_series"] = {{{"t", CommitT(4)}, {"step", 4}, {"val_loss", 9.0}},
                       {{"t", CommitT(8)}, {"step", 8}, {"val_loss", 4.0}}};
  absl::StatusOr<std::string> svg = PlotSvg(job);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_TRUE(BalancedTags(*svg)) << *svg;
  EXPECT_EQ(Count(*svg, "<polyline"), 3);
  EXPECT_EQ(Count(*svg, "stroke-dasharray=\"6 3\""), 1);
  EXPECT_NE(svg->find(">validation loss</text>"), std::string::npos);
  EXPECT_NE(svg->find(">9</text>"), std::string::npos) << "the scale reaches the highest one";
  job["val_series"] = "none";
  EXPECT_EQ(PlotSvg(job).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlotTest, EscapesTextAndSaysWhenNothingIsCommitted) {
  json job = MakeJob();
  job["id"] = "<a&b>";
  job["series"] = json::array();
  absl::StatusOr<std::string> svg = PlotSvg(job);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_TRUE(BalancedTags(*svg)) << *svg;
  EXPECT_NE(svg->find("&lt;a&amp;b&gt;"), std::string::npos);
  EXPECT_NE(svg->find("no committed steps yet"), std::string::npos);
  EXPECT_EQ(Count(*svg, "fault-marker"), 0);
}

TEST(PlotTest, MalformedSeriesIsInvalidArgument) {
  json job = MakeJob();
  job["series"] = "none";
  EXPECT_EQ(PlotSvg(job).status(),
            absl::InvalidArgumentError("series: expected array, got string"));
}

}  // namespace
}  // namespace troupe::tools
