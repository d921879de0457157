// troupe job: jobs as objects on a cluster's head (runtime/internal/jobs.h). A submitted job runs
// on the cluster — its driver on a node the head picks, started by that node's agent — so it
// outlives the terminal that submitted it; `troupe train` stays the one-shot form.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "commands.h"
#include "job_views.h"
#include "nlohmann/json.hpp"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/runtime.h"

namespace troupe::tools {
namespace {

using json = nlohmann::json;

constexpr char kUsage[] =
    "usage: troupe job submit --head HOST:P [--spec job.toml] [--name N] [--workers N]\n"
    "                         [--steps N] [--work_dir DIR] [--chaos KIND@STEP]...\n"
    "       troupe job list   --head HOST:P\n"
    "       troupe job status ID --head HOST:P [--json]\n"
    "       troupe job logs   ID --head HOST:P [--follow]\n"
    "       troupe job wait   ID --head HOST:P [--timeout 1h]\n"
    "       troupe job stop   ID --head HOST:P\n"
    "       troupe job trace  ID --head HOST:P --out trace.json   (Chrome / Perfetto)\n"
    "       troupe job plot   ID --head HOST:P --out plot.svg     (loss and tokens/s, faults)\n"
    "  (and --tls_ca/--tls_cert/--tls_key where the head runs with mutual TLS)\n"
    "submit prints the job's id at once; the job runs on the cluster (its driver on a node the\n"
    "head picks, on-demand first) and outlives this command. A relative --work_dir is made\n"
    "absolute here. wait exits 0 when the job succeeded, 1 when it failed or was stopped, 75\n"
    "when it was preempted (every worker noticed; submit it again to resume from its checkpoint).";

// EX_TEMPFAIL, as `troupe train`'s: a batch system's cue to run the job again.
constexpr int kExitPreempted = 75;

struct JobFlags {
  SpecFlags spec;
  runtime::RuntimeOptions runtime;
  std::string head, name, out;
  bool json = false, follow = false;
  runtime::Duration timeout = std::chrono::hours(1);

  void Register(runtime::ConfigRegistry& config) {
    runtime.Register(config);
    spec.Register(config);
    config.AddString("head", &head, "HOST:PORT of the cluster's head");
    config.AddString("name", &name, "submit: the job's name (default: the spec's [job] name)");
    config.AddString("out", &out, "trace, plot: the file to write");
    config.AddBool("json", &json, "status: the head's JSON record of the job");
    config.AddBool("follow", &follow, "logs: keep printing until the job ends");
    config.AddDuration("timeout", &timeout, "wait: give up after this long (exit 1)",
                       runtime::Positive());
  }
};

// A connection to the head, for the life of one command.
struct Session {
  std::unique_ptr<runtime::Runtime> runtime;
  std::optional<runtime::ClusterClient> client;
};

absl::StatusOr<Session> Open(const JobFlags& f) {
  TROUPE_ASSIGN_OR_RETURN(auto hp, runtime::ParseHostPort(f.head));
  runtime::RuntimeOptions ro = f.runtime;
  ro.network = true;
  Session s;
  absl::StatusOr<std::unique_ptr<runtime::Runtime>> rt =
      runtime::Runtime::Create(runtime::ActorRegistry{}, ro);
  if (!rt.ok()) return rt.status();
  s.runtime = std::move(*rt);
  TROUPE_ASSIGN_OR_RETURN(runtime::ClusterClient c,
                          runtime::ClusterClient::Connect(*s.runtime, hp.first, hp.second));
  s.client.emplace(std::move(c));
  return s;
}

absl::StatusOr<json> JobRecord(runtime::ClusterClient& c, const std::string& id) {
  TROUPE_ASSIGN_OR_RETURN(std::string v, c.View("job", id));
  return json::parse(v);
}

bool Ended(const json& j) {
  const std::string s = j.value("state", "");
  return s == "succeeded" || s == "failed" || s == "stopped" || s == "preempted";
}

std::string StatusText(const json& j) {
  std::string out =
      absl::StrFormat("%s  %s  %s\n", j.value("id", ""), j.value("name", ""), j.value("state", ""));
  absl::StrAppend(&out, absl::StrFormat("  step %d/%d  loss %.4f  tokens/s %.0f  world %d  "
                                        "generation %d\n",
                                        j.value("step", 0), j.value("steps", 0),
                                        j.value("loss", 0.0), j.value("tokens_per_s", 0.0),
                                        j.value("world", 0), j.value("generation", 0)));
  absl::StrAppend(&out, absl::StrFormat("  steps lost %d  recoveries %d", j.value("steps_lost", 0),
                                        j.value("recoveries", 0)));
  if (j.contains("report")) {
    absl::StrAppend(&out, "  crc32c ", j["report"].value("crc32c", "?"));
  }
  absl::StrAppend(&out, "\n");
  if (!j.value("node", "").empty()) {
    absl::StrAppend(&out, "  driver: pid ", j.value("driver_pid", 0), " on node ",
                    j.value("node", ""), "\n");
  }
  if (!j.value("waiting", "").empty()) {
    absl::StrAppend(&out, "  waiting: ", j.value("waiting", ""), "\n");
  }
  if (!j.value("last_event", "").empty()) {
    absl::StrAppend(&out, "  last event: ", j.value("last_event", ""), "\n");
  }
  if (!j.value("error", "").empty()) absl::StrAppend(&out, "  error: ", j.value("error", ""), "\n");
  return out;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "troupe job: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

int Submit(runtime::ClusterClient& c, const JobFlags& f) {
  absl::StatusOr<train::JobSpec> spec = f.spec.Make();
  if (!spec.ok()) return Fail(absl::InvalidArgumentError(spec.status().message()));
  // The driver runs elsewhere, in another directory: paths are made absolute here.
  spec->work_dir = std::filesystem::absolute(spec->work_dir).lexically_normal().string();
  if (!spec->model.data_dir.empty()) {
    spec->model.data_dir = std::filesystem::absolute(spec->model.data_dir).string();
  }
  if (!spec->checkpoint_dir.empty()) {
    spec->checkpoint_dir = std::filesystem::absolute(spec->checkpoint_dir).string();
  }
  absl::StatusOr<std::string> id =
      c.SubmitJob(f.name.empty() ? spec->name : f.name, spec->ToToml(), spec->steps);
  if (!id.ok()) return Fail(id.status());
  std::cout << *id << std::endl;
  return 0;
}

int List(runtime::ClusterClient& c) {
  absl::StatusOr<std::string> v = c.View("jobs");
  if (!v.ok()) return Fail(v.status());
  std::cout << absl::StrFormat("%-10s %-10s %-14s %-9s %-9s %-9s %s\n", "ID", "STATE", "NAME",
                               "STEP", "LOSS", "TOK/S", "LAST EVENT (QUEUED: WHY)");
  const json list = json::parse(*v);
  for (const json& j : list["jobs"]) {
    std::cout << absl::StrFormat(
        "%-10s %-10s %-14s %-9s %-9.4f %-9.0f %s\n", j.value("id", ""), j.value("state", ""),
        j.value("name", ""), absl::StrCat(j.value("step", 0), "/", j.value("steps", 0)),
        j.value("loss", 0.0), j.value("tokens_per_s", 0.0),
        j.value("waiting", "").empty() ? j.value("last_event", "") : j.value("waiting", ""));
  }
  return 0;
}

int Logs(runtime::ClusterClient& c, const std::string& id, bool follow) {
  size_t printed = 0;
  while (true) {
    absl::StatusOr<std::string> logs = c.View("logs", id);
    if (!logs.ok()) return Fail(logs.status());
    if (logs->size() > printed) std::cout << logs->substr(printed) << std::flush;
    printed = std::max(printed, logs->size());
    if (!follow) return 0;
    absl::StatusOr<json> j = JobRecord(c, id);
    if (!j.ok()) return Fail(j.status());
    if (Ended(*j)) {
      // What came in with the end.
      logs = c.View("logs", id);
      if (logs.ok() && logs->size() > printed) std::cout << logs->substr(printed) << std::flush;
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

int Wait(runtime::ClusterClient& c, const std::string& id, runtime::Duration timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (true) {
    absl::StatusOr<json> j = JobRecord(c, id);
    if (!j.ok()) return Fail(j.status());
    if (Ended(*j)) {
      std::cout << StatusText(*j);
      const std::string state = j->value("state", "");
      return state == "succeeded" ? 0 : state == "preempted" ? kExitPreempted : 1;
    }
    if (std::chrono::steady_clock::now() > until) {
      std::cout << StatusText(*j);
      return Fail(absl::DeadlineExceededError(
          absl::StrCat("job ", id, " has not ended within ", runtime::FormatDuration(timeout))));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

// trace / plot: the job's record, through `view`, into --out.
int Write(runtime::ClusterClient& c, const std::string& id, const std::string& out,
          absl::StatusOr<std::string> (*view)(const json&)) {
  if (out.empty()) return Fail(absl::InvalidArgumentError("--out: expected a file to write"));
  absl::StatusOr<json> j = JobRecord(c, id);
  if (!j.ok()) return Fail(j.status());
  absl::StatusOr<std::string> text = view(*j);
  if (!text.ok()) return Fail(text.status());
  const std::string tmp = out + ".tmp";
  std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
  file << *text;
  file.close();
  if (!file || std::rename(tmp.c_str(), out.c_str()) != 0) {
    return Fail(absl::UnavailableError(absl::StrCat(out, ": cannot write it")));
  }
  std::cout << out << std::endl;
  return 0;
}

}  // namespace

int RunJob(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "help") {
    std::fprintf(args.empty() ? stderr : stdout, "%s\n", kUsage);
    return args.empty() ? 2 : 0;
  }
  const std::string verb = args[0];
  Args rest(args.begin() + 1, args.end());
  std::string id;
  if (verb != "submit" && verb != "list") {
    if (rest.empty() || rest[0].rfind("--", 0) == 0) {
      std::fprintf(stderr, "troupe job %s: expected a job id\n%s\n", verb.c_str(), kUsage);
      return 2;
    }
    id = rest[0];
    rest.erase(rest.begin());
  }
  JobFlags flags;
  runtime::ConfigRegistry config;
  flags.Register(config);
  if (int rc = runtime::ParseCommandLine("job " + verb, kUsage, rest, config); rc >= 0) return rc;
  if (flags.head.empty()) {
    std::fprintf(stderr, "troupe job %s: --head HOST:PORT is required\n", verb.c_str());
    return 2;
  }
  absl::StatusOr<Session> s = Open(flags);
  if (!s.ok()) return Fail(s.status());
  runtime::ClusterClient& c = *s->client;
  if (verb == "submit") return Submit(c, flags);
  if (verb == "list") return List(c);
  if (verb == "logs") return Logs(c, id, flags.follow);
  if (verb == "wait") return Wait(c, id, flags.timeout);
  if (verb == "trace") return Write(c, id, flags.out, ChromeTrace);
  if (verb == "plot") return Write(c, id, flags.out, PlotSvg);
  if (verb == "stop") {
    absl::Status st = c.StopJob(id);
    if (!st.ok()) return Fail(st);
    std::cout << "job " << id << ": stop asked" << std::endl;
    return 0;
  }
  if (verb == "status") {
    absl::StatusOr<json> j = JobRecord(c, id);
    if (!j.ok()) return Fail(j.status());
    std::cout << (flags.json ? j->dump(2) + "\n" : StatusText(*j));
    return 0;
  }
  std::fprintf(stderr, "troupe job: unknown verb '%s'\n%s\n", verb.c_str(), kUsage);
  return 2;
}

}  // namespace troupe::tools
