#include "job_views.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "troupe/base/status_macros.h"

namespace troupe::tools {
namespace {

using json = nlohmann::json;

// ---- The Job record, read into structs once so the views never touch unchecked JSON. ----

struct SeriesPoint {
  double t = 0;
  int64_t step = 0;
  std::optional<double> loss, tokens_per_s;
};

struct JobEvent {
  double t = 0;
  std::string event, kind;
  std::optional<int64_t> step;
  std::optional<double> seconds;
};

struct RankStep {
  std::string worker;
  int64_t rank = 0, step = 0;
  std::optional<int64_t> generation, collective_bytes;
  double start = 0, step_s = 0;
  std::optional<double> compute_s, collective_s;
  bool committed = false;
};

struct Checkpoint {
  int64_t step = 0;
  double t = 0;
  std::optional<double> seconds;
  std::optional<int64_t> bytes;
};

struct JobRecord {
  std::string id, state;
  std::optional<int64_t> steps;
  std::optional<double> started_at;
  std::vector<SeriesPoint> series;
  std::vector<std::pair<double, double>> val_losses;  // [eval]: (step, validation loss)
  std::vector<JobEvent> events;
  std::vector<RankStep> ranks;
  std::vector<Checkpoint> checkpoints;
};

// Reads the fields of one JSON object. The first problem is kept in *status, naming the field's
// path and the expected vs got type; reads after it return defaults, so a parser reads every
// field and checks the status once.
class Reader {
 public:
  Reader(const json& j, std::string path, absl::Status* status)
      : j_(j), path_(std::move(path)), status_(status) {
    if (status_->ok() && !j.is_object()) Fail(path_.empty() ? "job" : path_, "object", Got(j));
  }

  std::optional<double> OptNum(const char* key) { return Opt<double>(key, "number", IsNumber); }
  double Seconds(const char* key) {
    return Opt<double>(key, kSeconds, IsSeconds, true).value_or(0);
  }
  std::optional<double> OptSeconds(const char* key) {
    return Opt<double>(key, kSeconds, IsSeconds);
  }
  int64_t Int(const char* key) { return Opt<int64_t>(key, "integer", IsInt, true).value_or(0); }
  std::optional<int64_t> OptInt(const char* key) { return Opt<int64_t>(key, "integer", IsInt); }
  std::string Str(const char* key, bool required = false) {
    return Opt<std::string>(key, "string", IsString, required).value_or("");
  }
  bool Bool(const char* key) { return Opt<bool>(key, "boolean", IsBool, true).value_or(false); }

  // Calls read(element, element_path) for each element of an optional array field.
  void ForEach(const char* key, const std::function<void(const json&, const std::string&)>& read) {
    const json* arr = Find(key, "array", IsArray, false);
    for (size_t i = 0; arr != nullptr && i < arr->size() && status_->ok(); ++i) {
      read((*arr)[i], absl::StrCat(Field(key), "[", i, "]"));
    }
  }

 private:
  // Times and durations: bounded, so microsecond offsets between them fit an int64.
  static constexpr char kSeconds[] = "seconds within +-1e11";
  static bool IsSeconds(const json& v) {
    return v.is_number() && std::abs(v.get<double>()) <= 1e11;
  }
  static bool IsNumber(const json& v) { return v.is_number(); }
  static bool IsInt(const json& v) { return v.is_number_integer(); }
  static bool IsString(const json& v) { return v.is_string(); }
  static bool IsBool(const json& v) { return v.is_boolean(); }
  static bool IsArray(const json& v) { return v.is_array(); }
  static std::string Got(const json& v) {
    if (!v.is_number()) return v.type_name();
    return absl::StrCat(v.is_number_float() ? "float " : "integer ", v.dump());
  }

  std::string Field(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  void Fail(const std::string& field, const char* expected, const std::string& got) {
    *status_ =
        absl::InvalidArgumentError(absl::StrCat(field, ": expected ", expected, ", got ", got));
  }

  // The field's value, or null where it is absent, null (fails if required) or of the wrong type.
  const json* Find(const char* key, const char* expected, bool (*is)(const json&), bool required) {
    if (!status_->ok()) return nullptr;
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      if (required) Fail(Field(key), expected, it == j_.end() ? "nothing (missing)" : "null");
      return nullptr;
    }
    if (!is(*it)) {
      Fail(Field(key), expected, Got(*it));
      return nullptr;
    }
    return &*it;
  }

  template <typename T>
  std::optional<T> Opt(const char* key, const char* expected, bool (*is)(const json&),
                       bool required = false) {
    const json* v = Find(key, expected, is, required);
    return v == nullptr ? std::nullopt : std::optional<T>(v->get<T>());
  }

  const json& j_;
  const std::string path_;
  absl::Status* status_;
};

absl::StatusOr<JobRecord> ReadJob(const json& j) {
  absl::Status status;
  Reader job(j, "", &status);
  JobRecord out;
  out.id = job.Str("id", /*required=*/true);
  out.state = job.Str("state");
  out.steps = job.OptInt("steps");
  out.started_at = job.OptSeconds("started_at");
  job.ForEach("series", [&](const json& e, const std::string& path) {
    Reader r(e, path, &status);
    out.series.push_back(
        {r.Seconds("t"), r.Int("step"), r.OptNum("loss"), r.OptNum("tokens_per_s")});
  });
  job.ForEach("val_series", [&](const json& e, const std::string& path) {
    Reader r(e, path, &status);
    const double step = static_cast<double>(r.Int("step"));
    if (std::optional<double> v = r.OptNum("val_loss")) out.val_losses.emplace_back(step, *v);
  });
  job.ForEach("events", [&](const json& e, const std::string& path) {
    Reader r(e, path, &status);
    out.events.push_back({r.Seconds("t"), r.Str("event", true), r.Str("kind"), r.OptInt("step"),
                          r.OptSeconds("seconds")});
  });
  job.ForEach("ranks", [&](const json& e, const std::string& path) {
    Reader r(e, path, &status);
    RankStep s;
    s.worker = r.Str("worker", true);
    s.rank = r.Int("rank");
    s.step = r.Int("step");
    s.generation = r.OptInt("generation");
    s.collective_bytes = r.OptInt("collective_bytes");
    s.start = r.Seconds("start");
    s.step_s = r.Seconds("step_s");
    s.compute_s = r.OptSeconds("compute_s");
    s.collective_s = r.OptSeconds("collective_s");
    s.committed = r.Bool("committed");
    out.ranks.push_back(std::move(s));
  });
  job.ForEach("checkpoints", [&](const json& e, const std::string& path) {
    Reader r(e, path, &status);
    out.checkpoints.push_back(
        {r.Int("step"), r.Seconds("t"), r.OptSeconds("seconds"), r.OptInt("bytes")});
  });
  if (!status.ok()) return status;
  return out;
}

bool IsFault(const JobEvent& e) { return e.event == "fault_fired" || e.event == "fault_armed"; }

// The Reader checks each type before get<>() and dumps replace invalid UTF-8, so nothing here
// should throw; the catch keeps "no exception escapes" true should nlohmann find another reason.
absl::StatusOr<std::string> Guarded(const json& j, std::string (*view)(const JobRecord&)) try {
  TROUPE_ASSIGN_OR_RETURN(JobRecord job, ReadJob(j));
  return view(job);
} catch (const json::exception& e) {
  return absl::InvalidArgumentError(absl::StrCat("job: ", e.what()));
}

// ---- Chrome trace ----

constexpr int kJobTid = 0, kCheckpointTid = 1, kRecoveryTid = 2, kFirstWorkerTid = 3;

// One trace event in absolute seconds; ph 'B' stands for a B/E pair over [begin, end].
struct Span {
  char ph;
  std::string name;
  int tid;
  double begin, end;
  json args;
};

// Worker threads in name order, so a worker keeps its tid whichever ranks it ran.
std::map<std::string, int> WorkerTids(const JobRecord& job) {
  std::map<std::string, int> tids;
  for (const RankStep& r : job.ranks) tids.emplace(r.worker, 0);
  int next_tid = kFirstWorkerTid;
  for (auto& [worker, tid] : tids) tid = next_tid++;
  return tids;
}

std::vector<Span> TraceSpans(const JobRecord& job, const std::map<std::string, int>& tids) {
  std::vector<Span> spans;
  for (const RankStep& r : job.ranks) {
    const int tid = tids.at(r.worker);
    const double end = r.start + std::max(0.0, r.step_s);
    json args = {{"step", r.step}, {"rank", r.rank}, {"committed", r.committed}};
    if (r.generation) args["generation"] = *r.generation;
    spans.push_back({'X', absl::StrCat("step ", r.step), tid, r.start, end, std::move(args)});
    // Clamped so the children stay inside the step even when the parts overshoot step_s.
    const double compute_end = std::clamp(r.start + r.compute_s.value_or(0), r.start, end);
    if (r.compute_s) spans.push_back({'X', "compute", tid, r.start, compute_end, json::object()});
    if (r.collective_s) {
      json cargs = json::object();
      if (r.collective_bytes) cargs["collective_bytes"] = *r.collective_bytes;
      spans.push_back({'X', "collective", tid, compute_end,
                       std::clamp(compute_end + *r.collective_s, compute_end, end),
                       std::move(cargs)});
    }
  }
  // A step's span runs from the previous commit, so the job thread tiles time with one span per
  // committed step; the first starts at started_at where known (else it is empty). Spans never
  // start before the previous one ends, so B/E pairs nest even if the clock stepped back.
  double last = job.series.empty() ? 0 : job.series[0].t;
  last = std::min(last, job.started_at.value_or(last));
  for (const SeriesPoint& p : job.series) {
    const double begin = last;
    last = std::max(begin, p.t);
    spans.push_back({'B', absl::StrCat("step ", p.step), kJobTid, begin, last, {{"step", p.step}}});
  }
  for (const Checkpoint& c : job.checkpoints) {
    json args = {{"step", c.step}};
    if (c.bytes) args["bytes"] = *c.bytes;
    spans.push_back({'X', absl::StrCat("checkpoint ", c.step), kCheckpointTid,
                     c.t - std::max(0.0, c.seconds.value_or(0)), c.t, std::move(args)});
  }
  // A fault is armed (the coordinator decided it), then fired (where it happens): one instant,
  // the firing's, unless it never fired.
  std::set<std::pair<std::optional<int64_t>, std::string>> fired;
  for (const JobEvent& e : job.events) {
    if (e.event == "fault_fired") fired.emplace(e.step, e.kind);
  }
  std::optional<double> last_fault_t;
  for (const JobEvent& e : job.events) {
    json args = json::object();
    if (e.step) args["step"] = *e.step;
    if (e.event == "fault_armed" && fired.count({e.step, e.kind})) continue;
    if (IsFault(e)) {
      last_fault_t = e.t;
      args["event"] = e.event;
      spans.push_back({'i', e.kind.empty() ? "fault" : "fault " + e.kind, kJobTid, e.t, e.t, args});
    } else if (e.event == "recovered") {
      if (e.seconds) args["seconds"] = *e.seconds;
      spans.push_back({'i', "recovered", kJobTid, e.t, e.t, args});
      // The span needs a start: from `seconds`, else from the fault that caused it.
      const std::optional<double> begin =
          e.seconds ? e.t - std::max(0.0, *e.seconds) : last_fault_t;
      if (begin) spans.push_back({'X', "recovery", kRecoveryTid, std::min(*begin, e.t), e.t, args});
    }
  }
  return spans;
}

json Metadata(const char* what, int tid, const std::string& name) {
  return {{"ph", "M"},  {"name", what}, {"pid", 1},
          {"tid", tid}, {"ts", 0},      {"args", {{"name", name}}}};
}

std::string TraceView(const JobRecord& job) {
  const std::map<std::string, int> tids = WorkerTids(job);
  const std::vector<Span> spans = TraceSpans(job, tids);
  double base = std::numeric_limits<double>::infinity();
  for (const Span& s : spans) base = std::min(base, s.begin);
  // Whole microseconds from `base`: rounding each end the same monotonic way keeps children inside
  // their parents exactly, which per-event doubles would not.
  const auto us = [base](double t) { return std::llround((t - base) * 1e6); };

  json events = json::array();
  events.push_back(Metadata("process_name", kJobTid, job.id));
  events.push_back(Metadata("thread_name", kJobTid, "job"));
  events.push_back(Metadata("thread_name", kCheckpointTid, "checkpoints"));
  events.push_back(Metadata("thread_name", kRecoveryTid, "recovery"));
  for (const auto& [worker, tid] : tids) events.push_back(Metadata("thread_name", tid, worker));
  for (const Span& s : spans) {
    json e = {{"ph", std::string(1, s.ph)}, {"name", s.name}, {"pid", 1}, {"tid", s.tid},
              {"ts", us(s.begin)},          {"args", s.args}};
    if (s.ph == 'X') e["dur"] = us(s.end) - us(s.begin);
    if (s.ph == 'i') e["s"] = "g";
    events.push_back(e);
    if (s.ph == 'B') {
      events.push_back(
          {{"ph", "E"}, {"name", s.name}, {"pid", 1}, {"tid", s.tid}, {"ts", us(s.end)}});
    }
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

// ---- SVG plot ----

constexpr double kWidth = 960, kHeight = 540, kLeft = 80, kRight = 930;
constexpr double kPlotTop = 50, kPlotBottom = 490;  // both panels, for the markers

std::string Xml(absl::string_view text) {
  std::string out = absl::StrReplaceAll(
      text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}, {"'", "&apos;"}});
  // XML 1.0 forbids the other control characters even escaped.
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](unsigned char c) { return c < 0x20 && c != '\t' && c != '\n'; }),
            out.end());
  return out;
}

// A linear map from [lo, hi] (widened when empty) to pixels [px0, px1].
struct Scale {
  double lo, hi, px0, px1;
  Scale(double lo_in, double hi_in, double px0_in, double px1_in)
      : lo(lo_in), hi(hi_in), px0(px0_in), px1(px1_in) {
    if (hi - lo <= 0) {
      const double pad = std::max(1.0, std::abs(lo) * 0.1);
      lo -= pad;
      hi += pad;
    }
  }
  double operator()(double v) const { return px0 + (v - lo) / (hi - lo) * (px1 - px0); }

  // About five round values (1, 2 or 5 times a power of ten, at least min_step apart) in range.
  std::vector<double> Ticks(double min_step) const {
    const double raw = (hi - lo) / 5, mag = std::pow(10, std::floor(std::log10(raw)));
    const double f = raw / mag;
    const double step = std::max(min_step, (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag);
    std::vector<double> out;
    // Capped: past 2^53, ++k no longer changes k (steps in the 1e16s, say).
    for (double k = std::ceil(lo / step); k * step <= hi + step * 1e-9 && out.size() < 12; ++k) {
      out.push_back(k * step);
    }
    return out;
  }
};

std::string Text(double x, double y, absl::string_view text, absl::string_view attrs = "") {
  return absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\"%s>%s</text>\n", x, y, attrs, Xml(text));
}

std::string Line(double x1, double y1, double x2, double y2, absl::string_view attrs) {
  return absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" %s/>\n", x1, y1, x2,
                         y2, attrs);
}

// A (step, value) curve; dashed where `dash` is set.
std::string Curve(const std::vector<std::pair<double, double>>& points, const Scale& x,
                  const Scale& y, const char* color, const char* dash) {
  std::string svg =
      absl::StrFormat("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"",
                      color, dash[0] ? absl::StrCat(" stroke-dasharray=\"", dash, "\"") : "");
  for (const auto& [step, v] : points) absl::StrAppendFormat(&svg, "%.1f,%.1f ", x(step), y(v));
  return svg + "\"/>\n";
}

// One panel: frame, y ticks with grid lines, x tick marks, and the (step, value) curve — with a
// second one on the same scale, dashed, where `second` has points (the validation loss).
std::string Panel(const char* label, const std::vector<std::pair<double, double>>& points,
                  const Scale& x, double top, double bottom, const char* color,
                  const std::vector<std::pair<double, double>>& second = {},
                  const char* second_label = "", const char* second_color = "") {
  std::string svg = absl::StrFormat(
      "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
      "stroke=\"#888\"/>\n",
      kLeft, top, kRight - kLeft, bottom - top);
  svg += Text(kLeft, top - 6, label, " font-weight=\"bold\"");
  for (const double step : x.Ticks(1)) {
    svg += Line(x(step), bottom, x(step), bottom + 4, "stroke=\"#888\"");
  }
  if (points.empty()) return svg + Text((kLeft + kRight) / 2, (top + bottom) / 2, "no data");
  std::vector<double> values;
  for (const auto* set : {&points, &second}) {
    for (const auto& p : *set) values.push_back(p.second);
  }
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  const Scale y(*lo, *hi, bottom - 8, top + 8);
  for (const double v : y.Ticks(0)) {
    svg += Line(kLeft, y(v), kRight, y(v), "stroke=\"#eee\"");
    svg += Text(kLeft - 6, y(v) + 4, absl::StrFormat("%g", v), " text-anchor=\"end\"");
  }
  svg += Curve(points, x, y, color, "");
  if (second.empty()) return svg;
  svg += Text(kLeft + 60, top - 6, second_label,
              absl::StrCat(" font-weight=\"bold\" fill=\"", second_color, "\""));
  return svg + Curve(second, x, y, second_color, "6 3");
}

// A dashed line across both panels at the event's step, labelled.
std::string Marker(const char* cls, int64_t step, const Scale& x, const std::string& label,
                   const char* color, double label_y) {
  return absl::StrFormat("<g class=\"%s\" data-step=\"%d\">\n", cls, step) +
         Line(x(step), kPlotTop, x(step), kPlotBottom,
              absl::StrCat("stroke=\"", color, "\" stroke-dasharray=\"5 4\"")) +
         Text(x(step) + 3, label_y, label, absl::StrCat(" fill=\"", color, "\"")) + "</g>\n";
}

std::string PlotView(const JobRecord& job) {
  const int64_t committed = job.series.empty() ? 0 : job.series.back().step;
  const std::string steps = job.steps ? absl::StrCat(*job.steps) : "?";
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      kWidth, kHeight, kWidth, kHeight);
  svg += Text(kWidth / 2, 24,
              absl::StrCat(job.id, " — ", job.state.empty() ? "unknown" : job.state, " — step ",
                           committed, "/", steps),
              " text-anchor=\"middle\" font-size=\"16\"");
  if (job.series.empty()) {
    return svg +
           Text(kWidth / 2, kHeight / 2, "no committed steps yet", " text-anchor=\"middle\"") +
           "</svg>\n";
  }
  // The x range covers the markers too, so a fault past the last commit is still drawn.
  double lo = job.series.front().step, hi = lo;
  std::vector<std::pair<double, double>> loss, tokens;
  for (const SeriesPoint& p : job.series) {
    lo = std::min<double>(lo, p.step);
    hi = std::max<double>(hi, p.step);
    if (p.loss) loss.emplace_back(p.step, *p.loss);
    if (p.tokens_per_s) tokens.emplace_back(p.step, *p.tokens_per_s);
  }
  for (const JobEvent& e : job.events) {
    if (e.step && (IsFault(e) || e.event == "recovered")) {
      lo = std::min<double>(lo, *e.step);
      hi = std::max<double>(hi, *e.step);
    }
  }
  const Scale x(lo, hi, kLeft + 10, kRight - 10);
  svg += Panel("loss", loss, x, kPlotTop, 260, "#1f77b4", job.val_losses, "validation loss",
               "#2ca02c");
  svg += Panel("tokens/s", tokens, x, 300, kPlotBottom, "#ff7f0e");
  for (const double step : x.Ticks(1)) {
    svg += Text(x(step), kPlotBottom + 16, absl::StrFormat("%g", step), " text-anchor=\"middle\"");
  }
  svg += Text((kLeft + kRight) / 2, kPlotBottom + 36, "step", " text-anchor=\"middle\"");
  // fault_armed and fault_fired of one fault share a step and kind: one marker.
  std::set<std::pair<int64_t, std::string>> faults;
  for (const JobEvent& e : job.events) {
    if (!e.step) continue;
    if (IsFault(e) && faults.emplace(*e.step, e.kind).second) {
      svg += Marker("fault-marker", *e.step, x, absl::StrCat("fault ", e.kind), "#d62728",
                    kPlotTop + 14);
    } else if (e.event == "recovered") {
      const std::string label =
          e.seconds ? absl::StrFormat("recovered %.2fs", *e.seconds) : std::string("recovered");
      svg += Marker("recovery-marker", *e.step, x, label, "#2ca02c", kPlotTop + 28);
    }
  }
  return svg + "</svg>\n";
}

}  // namespace

absl::StatusOr<std::string> ChromeTrace(const nlohmann::json& job) {
  return Guarded(job, TraceView);
}

absl::StatusOr<std::string> PlotSvg(const nlohmann::json& job) { return Guarded(job, PlotView); }

}  // namespace troupe::tools
