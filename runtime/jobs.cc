#include "internal/jobs.h"

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal/enum_text.h"

namespace troupe::runtime::internal {
namespace {

using json = nlohmann::json;

// The most entries a job keeps of each series (oldest dropped first): a long job's head stays
// small, and a dashboard or trace shows the latest.
constexpr size_t kKeep = 20000;
constexpr size_t kKeepLogs = 5000;

// The number of an id "job-N" (0 for another form): ids handed out later are above it.
int64_t IdNumber(const std::string& id) {
  int64_t n = 0;
  return absl::SimpleAtoi(absl::string_view(id).substr(4), &n) ? n : 0;
}

void Push(json& list, json entry) {
  if (list.size() >= kKeep) list.erase(list.begin());
  list.push_back(std::move(entry));
}

double Seconds(const base::SupervisionEvent& e) {
  return std::chrono::duration<double>(e.wall_time.time_since_epoch()).count();
}

double DoubleField(const base::SupervisionEvent& e, const std::string& key) {
  double v = 0;
  return absl::SimpleAtod(e.Field(key), &v) ? v : 0.0;
}

// "recovered step=12 fault=kill-worker seconds=0.41": the event and its fields, for a person.
std::string Describe(const base::SupervisionEvent& e) {
  std::string s = e.event;
  if (!e.child.empty()) absl::StrAppend(&s, " ", e.child);
  for (const auto& [k, v] : e.fields) {
    if (k != "at_ns" && k != "workers") absl::StrAppend(&s, " ", k, "=", v);
  }
  if (!e.reason.empty()) absl::StrAppend(&s, ": ", e.reason);
  return s;
}

// One label value, escaped as the text format wants.
std::string Label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

void Family(std::string* out, const char* name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Histo(std::string* out, const char* name, const std::string& labels, const Histogram& h) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    const std::string le = i < h.bounds.size() ? absl::StrCat(h.bounds[i]) : "+Inf";
    absl::StrAppend(out, name, "_bucket{", labels, ",le=\"", le, "\"} ", cumulative, "\n");
  }
  absl::StrAppend(out, name, "_sum{", labels, "} ", absl::StrFormat("%.9g", h.sum), "\n");
  absl::StrAppend(out, name, "_count{", labels, "} ", h.count, "\n");
}

}  // namespace

const char* Name(JobState s) {
  switch (s) {
    case JobState::kPending:
      return "pending";
    case JobState::kQueued:
      return "queued";
    case JobState::kRunning:
      return "running";
    case JobState::kSucceeded:
      return "succeeded";
    case JobState::kFailed:
      return "failed";
    case JobState::kStopped:
      return "stopped";
    case JobState::kPreempted:
      return "preempted";
  }
  return "?";
}

absl::StatusOr<JobState> ParseJobState(const std::string& text) {
  return ParseEnum("job state", text, kJobStates);
}

bool JobEnded(JobState s) {
  return s != JobState::kPending && s != JobState::kQueued && s != JobState::kRunning;
}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

std::string JobTable::Submit(const std::string& name, const std::string& spec_toml, int64_t steps,
                             double now) {
  Job j;
  j.id = absl::StrCat("job-", next_++);
  j.name = name;
  j.spec_toml = spec_toml;
  j.steps = steps;
  j.submitted = true;
  j.submitted_at = now;
  const std::string id = j.id;
  jobs_.emplace(id, std::move(j));
  return id;
}

absl::StatusOr<std::string> JobTable::Register(const std::string& id, const std::string& name,
                                               const std::string& spec_toml, int64_t steps,
                                               int64_t pid, const std::string& node, double now) {
  Job* j = nullptr;
  if (id.empty()) {
    Job fresh;
    fresh.id = absl::StrCat("job-", next_++);
    fresh.submitted_at = now;
    j = &jobs_.emplace(fresh.id, std::move(fresh)).first->second;
  } else {
    j = Find(id);
    if (j == nullptr) {
      // A head that knew it is gone without a store: the driver knows what it runs.
      Job known;
      known.id = id;
      known.submitted = true;
      known.submitted_at = now;
      j = &jobs_.emplace(id, std::move(known)).first->second;
      next_ = std::max(next_, IdNumber(id) + 1);
    }
    if (JobEnded(j->state)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", id, "' has ended (", Name(j->state), ")"));
    }
  }
  // Everything the event log rebuilds starts empty: the driver sends it from its beginning.
  Job fresh;
  fresh.id = j->id;
  fresh.submitted = j->submitted;
  fresh.submitted_at = j->submitted_at;
  fresh.started_at = j->started_at > 0 ? j->started_at : now;
  fresh.logs = std::move(j->logs);
  fresh.name = name;
  fresh.spec_toml = spec_toml;
  fresh.steps = steps;
  fresh.driver_pid = pid;
  fresh.node = node.empty() ? j->node : node;
  fresh.state = JobState::kRunning;
  *j = std::move(fresh);
  return j->id;
}

void JobTable::Placed(const std::string& id, const std::string& node) {
  if (Job* j = Find(id)) j->node = node;
}

void JobTable::Queued(const std::string& id, const std::string& why, int32_t priority) {
  Job* j = Find(id);
  if (j == nullptr || JobEnded(j->state)) return;
  j->state = JobState::kQueued;
  j->waiting = why;
  j->priority = priority;
}

void JobTable::Admitted(const std::string& id, int32_t priority) {
  Job* j = Find(id);
  if (j == nullptr || JobEnded(j->state)) return;
  j->state = JobState::kRunning;
  j->waiting.clear();
  j->priority = priority;
}

void JobTable::Ingest(const std::string& id, const std::vector<std::string>& lines) {
  Job* j = Find(id);
  if (j == nullptr) return;
  for (const std::string& line : lines) {
    base::SupervisionEvent e;
    if (!base::ParseEvent(line, &e)) continue;
    const double t = Seconds(e);
    const int64_t step = e.IntField("step", 0);
    if (e.event == "step") {
      j->step = step;
      j->loss = DoubleField(e, "loss");
      j->tokens_per_s = DoubleField(e, "tokens_per_s");
      j->world = e.IntField("world", j->world);
      j->generation = static_cast<int64_t>(e.generation);
      const double secs = DoubleField(e, "step_s");
      j->step_seconds.Observe(secs);
      Push(j->series, {{"t", t},
                       {"step", step},
                       {"loss", j->loss},
                       {"tokens_per_s", j->tokens_per_s},
                       {"step_s", secs},
                       {"world", j->world},
                       {"generation", j->generation}});
      continue;
    }
    if (e.event == "rank_step") {
      const uint64_t bytes = static_cast<uint64_t>(e.IntField("collective_bytes", 0));
      const double coll = DoubleField(e, "collective_s");
      j->collective_bytes += bytes;
      j->collective_seconds += coll;
      Push(j->ranks, {{"worker", e.child},
                      {"rank", e.IntField("rank", 0)},
                      {"step", step},
                      {"generation", e.generation},
                      {"start", e.IntField("start_ns", 0) / 1e9},
                      {"step_s", DoubleField(e, "step_s")},
                      {"compute_s", DoubleField(e, "compute_s")},
                      {"collective_s", coll},
                      {"collective_bytes", bytes}});
      continue;
    }
    if (e.event == "stage_in_flight") continue;
    if (e.event == "restart_scheduled") ++j->restarts[e.supervisor];
    if (e.event == "generation") {
      j->generation = static_cast<int64_t>(e.generation);
      j->world = e.IntField("world", j->world);
      j->steps_lost = e.IntField("steps_lost", j->steps_lost);
    }
    if (e.event == "recovered") {
      ++j->recoveries;
      j->recovery_seconds.Observe(DoubleField(e, "seconds"));
    }
    if (e.event == "eval") {
      j->val_step = step;
      j->val_loss = DoubleField(e, "val_loss");
      Push(j->val_series, {{"t", t}, {"step", step}, {"val_loss", j->val_loss}});
    }
    if (e.event == "checkpoint_committed") {
      const uint64_t bytes = static_cast<uint64_t>(e.IntField("bytes", 0));
      const double secs = DoubleField(e, "seconds");
      j->checkpoint_bytes = bytes;
      j->checkpoint_seconds.Observe(secs);
      Push(j->checkpoints, {{"step", step}, {"t", t}, {"seconds", secs}, {"bytes", bytes}});
    }
    j->last_event = Describe(e);
    json entry = {{"t", t}, {"event", e.event}, {"text", j->last_event}};
    if (e.fields.count("step")) entry["step"] = step;
    if (e.fields.count("seconds")) entry["seconds"] = DoubleField(e, "seconds");
    if (e.fields.count("kind")) entry["kind"] = e.Field("kind");
    if (e.fields.count("fault")) entry["kind"] = e.Field("fault");
    Push(j->events, std::move(entry));
  }
}

void JobTable::Log(const std::string& id, const std::vector<std::string>& lines) {
  Job* j = Find(id);
  if (j == nullptr) return;
  for (const std::string& l : lines) {
    if (j->logs.size() >= kKeepLogs) j->logs.pop_front();
    j->logs.push_back(l);
  }
}

void JobTable::End(const std::string& id, JobState state, const std::string& error,
                   const std::string& report, double now) {
  Job* j = Find(id);
  if (j == nullptr || JobEnded(j->state)) return;
  j->state = state;
  j->error = error;
  j->ended_at = now;
  if (!report.empty()) {
    json r = json::parse(report, nullptr, false);
    if (!r.is_discarded()) {
      j->report = std::move(r);
      j->steps_lost = j->report.value("steps_lost", j->steps_lost);
    }
  }
}

const Job* JobTable::Find(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

Job* JobTable::Find(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<std::string> JobTable::Unplaced() const {
  std::vector<std::string> out;
  for (const auto& [id, j] : jobs_) {
    if (j.state == JobState::kPending && j.node.empty()) out.push_back(id);
  }
  return out;
}

json JobTable::Summary(const Job& j) {
  json s = {{"id", j.id},
            {"name", j.name},
            {"state", Name(j.state)},
            {"submitted", j.submitted},
            {"node", j.node},
            {"driver_pid", j.driver_pid},
            {"submitted_at", j.submitted_at},
            {"started_at", j.started_at},
            {"ended_at", j.ended_at},
            {"steps", j.steps},
            {"step", j.step},
            {"loss", j.loss},
            {"val_loss", j.val_step >= 0 ? json(j.val_loss) : json(nullptr)},
            {"val_step", j.val_step},
            {"tokens_per_s", j.tokens_per_s},
            {"world", j.world},
            {"generation", j.generation},
            {"steps_lost", j.steps_lost},
            {"recoveries", j.recoveries},
            {"last_event", j.last_event},
            {"priority", j.priority},
            {"waiting", j.waiting},
            {"error", j.error}};
  if (!j.report.is_null()) s["report"] = j.report;
  return s;
}

json JobTable::Full(const Job& j) {
  json f = Summary(j);
  f["series"] = j.series;
  f["val_series"] = j.val_series;
  f["events"] = j.events;
  f["checkpoints"] = j.checkpoints;
  // A rank's step counts when the job committed that step in that generation.
  std::map<int64_t, int64_t> committed;  // step -> generation
  for (const json& s : j.series) committed[s["step"].get<int64_t>()] = s["generation"];
  json ranks = j.ranks;
  for (json& r : ranks) {
    auto it = committed.find(r["step"].get<int64_t>());
    r["committed"] = it != committed.end() && it->second == r["generation"].get<int64_t>();
  }
  f["ranks"] = std::move(ranks);
  return f;
}

std::string JobTable::Record(const Job& j) {
  json r = Summary(j);
  r["spec"] = j.spec_toml;
  return r.dump();
}

absl::Status JobTable::Restore(const std::string& id, const std::string& record) {
  const json r = json::parse(record, nullptr, false);
  if (r.is_discarded() || !r.is_object()) {
    return absl::DataLossError(absl::StrCat("job '", id, "': its stored record is not JSON"));
  }
  Job j;
  try {
    j.id = id;
    j.name = r.value("name", "");
    j.spec_toml = r.value("spec", "");
    j.node = r.value("node", "");
    j.error = r.value("error", "");
    j.last_event = r.value("last_event", "");
    j.waiting = r.value("waiting", "");
    j.priority = r.value("priority", int32_t{0});
    j.submitted = r.value("submitted", false);
    j.driver_pid = r.value("driver_pid", int64_t{0});
    j.steps = r.value("steps", int64_t{0});
    j.step = r.value("step", int64_t{0});
    j.world = r.value("world", int64_t{0});
    j.generation = r.value("generation", int64_t{0});
    j.steps_lost = r.value("steps_lost", int64_t{0});
    j.recoveries = r.value("recoveries", uint64_t{0});
    j.loss = r.value("loss", 0.0);
    j.val_step = r.value("val_step", int64_t{-1});
    if (j.val_step >= 0) j.val_loss = r.value("val_loss", 0.0);
    j.tokens_per_s = r.value("tokens_per_s", 0.0);
    j.submitted_at = r.value("submitted_at", 0.0);
    j.started_at = r.value("started_at", 0.0);
    j.ended_at = r.value("ended_at", 0.0);
    if (r.contains("report")) j.report = r["report"];
    j.state = ParseJobState(r.value("state", "")).value_or(JobState::kPending);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("job '", id, "': its stored record: ", e.what()));
  }
  next_ = std::max(next_, IdNumber(id) + 1);
  jobs_[id] = std::move(j);
  return absl::OkStatus();
}

std::string JobTable::Metrics() const {
  std::string out;
  std::map<std::string, int> by_state;
  for (JobState s : kJobStates) by_state[Name(s)] = 0;
  for (const auto& [id, j] : jobs_) ++by_state[Name(j.state)];
  Family(&out, "troupe_jobs", "gauge", "Jobs on this head by state.");
  for (const auto& [s, n] : by_state)
    absl::StrAppend(&out, "troupe_jobs{state=\"", s, "\"} ", n, "\n");
  // One family at a time, every job's sample in it (the text format wants families whole).
  auto each = [&](const char* name, const char* type, const char* help, auto value) {
    Family(&out, name, type, help);
    for (const auto& [id, j] : jobs_) {
      absl::StrAppend(&out, name, "{job_id=\"", Label(id), "\"} ", value(j), "\n");
    }
  };
  each("troupe_job_step", "gauge", "The job's last committed step.",
       [](const Job& j) { return absl::StrCat(j.step); });
  each("troupe_job_loss", "gauge", "The loss of the job's last committed step.",
       [](const Job& j) { return absl::StrFormat("%.9g", j.loss); });
  // Only jobs that evaluate ([eval]) have a sample: no made-up 0 for the others.
  Family(&out, "troupe_job_val_loss", "gauge",
         "The validation loss ([eval]) of the job's newest evaluated parameters.");
  for (const auto& [id, j] : jobs_) {
    if (j.val_step < 0) continue;
    absl::StrAppend(&out, "troupe_job_val_loss{job_id=\"", Label(id), "\"} ",
                    absl::StrFormat("%.9g", j.val_loss), "\n");
  }
  each("troupe_job_tokens_per_second", "gauge", "Tokens per second of the last committed step.",
       [](const Job& j) { return absl::StrFormat("%.9g", j.tokens_per_s); });
  each("troupe_job_world_size", "gauge", "Ranks in the job's generation.",
       [](const Job& j) { return absl::StrCat(j.world); });
  each("troupe_job_generation", "gauge", "The job's generation (bumped on every re-plan).",
       [](const Job& j) { return absl::StrCat(j.generation); });
  each("troupe_job_recoveries_total", "counter", "Recoveries from faults (first commit after).",
       [](const Job& j) { return absl::StrCat(j.recoveries); });
  each("troupe_job_steps_lost_total", "counter", "Committed steps lost and re-run.",
       [](const Job& j) { return absl::StrCat(j.steps_lost); });
  each("troupe_collective_bytes_total", "counter", "Bytes the ranks' collectives sent.",
       [](const Job& j) { return absl::StrCat(j.collective_bytes); });
  each("troupe_collective_seconds_total", "counter", "Seconds the ranks spent in collectives.",
       [](const Job& j) { return absl::StrFormat("%.9g", j.collective_seconds); });
  each("troupe_checkpoint_bytes", "gauge", "Size of the job's newest committed checkpoint.",
       [](const Job& j) { return absl::StrCat(j.checkpoint_bytes); });
  Family(&out, "troupe_job_restarts_total", "counter",
         "Restarts of the job's actors by supervisor.");
  for (const auto& [id, j] : jobs_) {
    for (const auto& [sup, n] : j.restarts) {
      absl::StrAppend(&out, "troupe_job_restarts_total{job_id=\"", Label(id), "\",supervisor=\"",
                      Label(sup), "\"} ", n, "\n");
    }
  }
  const std::pair<const char*, Histogram Job::*> histos[] = {
      {"troupe_step_seconds", &Job::step_seconds},
      {"troupe_recovery_seconds", &Job::recovery_seconds},
      {"troupe_checkpoint_write_seconds", &Job::checkpoint_seconds}};
  const char* help[] = {"Wall time of a committed step.",
                        "From a fault to the first commit after it.",
                        "From a checkpoint's step commit to its manifest's commit."};
  for (size_t i = 0; i < 3; ++i) {
    Family(&out, histos[i].first, "histogram", help[i]);
    for (const auto& [id, j] : jobs_) {
      Histo(&out, histos[i].first, absl::StrCat("job_id=\"", Label(id), "\""), j.*histos[i].second);
    }
  }
  return out;
}

}  // namespace troupe::runtime::internal
