// troupe chaos run: random fault schedules against a user's job, every trial's invariants
// checked, a failing schedule shrunk to a smallest one that still fails, and a report.
//
// Each trial is a `troupe train` process of this binary (its own embedded cluster, its own
// TMPDIR) on the job spec with the drawn faults, in <report>/trial-<n>. A fault-free reference
// run first gives the weights every trial must end with (deterministic mode).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "chaos_lab.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "troupe/actors/job_audit.h"
#include "troupe/base/events.h"
#include "troupe/train/chaos_schedule.h"
#include "troupe/train/job_events.h"

namespace troupe::tools {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kUsage[] =
    "usage: troupe chaos run [--spec FILE.toml] [--trials N] [--seed S] [--faults LIST]\n"
    "                        [--max-faults K] [--lab HOSTS] [--schedule FAULTS] [--report DIR]\n"
    "                        [--shrink-budget N] [--continuous] [--invariant CMD] [--workers N]\n"
    "                        [--steps N] [--data_dir DIR]\n"
    "  Runs the job once without faults (the reference weights), then N trials, each with a\n"
    "  schedule of 1..K faults drawn from the seed (kinds from --faults; default: every kind that\n"
    "  acts on one machine). After each trial it checks: exit status 0; the final weights equal\n"
    "  the reference's (deterministic mode); every committed step's microbatches served exactly\n"
    "  once; no committed step lost beyond what the faults allow; each recovery within its bound\n"
    "  (a kill: 1 s, a stop: the liveness timeout + 1 s, a coordinator: 5 s); no process or\n"
    "  temporary file left behind; and --invariant CMD (run with TROUPE_CHAOS_WORK_DIR, exit 0 =\n"
    "  holds). A failing schedule is shrunk (faults removed, moved earlier) to a smallest one "
    "that\n"
    "  still fails, printed as the `troupe train` command that reproduces it.\n"
    "  --lab HOSTS: each trial on a fresh lab of namespaced hosts (scripts/lab; root): a node\n"
    "  agent with one worker on each of HOSTS hosts, the head and the driver on one more; the\n"
    "  network kinds join the draw (partition-, oneway-, flap-, drop-, delay-node) and the\n"
    "  head's (kill-head, stop-head: carried out here once the step is committed), and the\n"
    "  workers must be idle, the hosts' /tmp empty and the lab removable after each trial.\n"
    "  --schedule FAULTS: run that one schedule (\"kill-worker@5:1 partition-node@9:2\") as\n"
    "  every trial, instead of drawing: how a lab failure is reproduced.\n"
    "  Report: <report>/report.json, a table on stdout, an SVG timeline per failing trial.\n"
    "Exit status: 0 every invariant held, 1 some failed, 2 bad spec or flags.";

struct ChaosFlags {
  SpecFlags spec;
  int64_t trials = 20, seed = 1, max_faults = 3, shrink_budget = 20;
  int64_t lab = 0;
  std::string faults, report_dir = "troupe-chaos", invariant, schedule;
  bool continuous = false;
  runtime::Duration trial_timeout = std::chrono::minutes(10);

  void Register(runtime::ConfigRegistry& config) {
    spec.Register(config);
    config.AddInt("trials", &trials, "trials to run", runtime::AtLeast(1));
    config.AddInt("seed", &seed, "the seed every schedule is drawn from", runtime::AtLeast(0));
    config.AddString("faults", &faults,
                     "fault kinds to draw from, comma-separated (\"\": every kind that acts on "
                     "one machine)");
    config.AddInt("max-faults", &max_faults, "faults per trial: 1..K", runtime::InRange(1, 32));
    config.AddInt("lab", &lab,
                  "worker hosts of a lab each trial runs on (0: this machine's embedded cluster)",
                  runtime::InRange(0, 16));
    config.AddString("schedule", &schedule,
                     "one schedule every trial runs, faults separated by spaces (\"\": drawn)");
    config.AddString("report", &report_dir, "where the trials, report.json and timelines go");
    config.AddInt("shrink-budget", &shrink_budget,
                  "runs a failing schedule's shrinking may take (0: no shrinking)",
                  runtime::AtLeast(0));
    config.AddBool("continuous", &continuous,
                   "draw trials until stopped (SIGINT/SIGTERM), a line per trial: a soak");
    config.AddString("invariant", &invariant,
                     "a command that must exit 0 after each trial (sh -c; "
                     "TROUPE_CHAOS_WORK_DIR is the trial's directory)");
    config.AddDuration("trial_timeout", &trial_timeout, "a trial running longer has failed",
                       runtime::Positive());
  }
};

struct Failure {
  std::string invariant, detail;
};

// What one run of the job gave.
struct Run {
  int exit_code = -1;  // -1: timed out (killed)
  double seconds = 0;
  std::map<std::string, std::string> report;  // `troupe train --report` fields
  std::vector<base::SupervisionEvent> events;
  std::vector<Failure> lab;  // on the lab: what its cluster or its removal found wrong
};

struct Verdict {
  std::vector<Failure> failures;
  std::vector<std::pair<std::string, double>> recoveries;  // fault kind, seconds
  int64_t steps_lost = -1;
  bool Held() const { return failures.empty(); }
  bool FailsAnyOf(const std::vector<Failure>& wanted) const {
    for (const Failure& f : failures) {
      for (const Failure& w : wanted) {
        if (f.invariant == w.invariant) return true;
      }
    }
    return false;
  }
};

bool HasClockStep(const std::vector<train::Fault>& schedule) {
  return std::any_of(schedule.begin(), schedule.end(),
                     [](const train::Fault& f) { return f.kind == train::FaultKind::kClockStep; });
}

class Runner {
 public:
  Runner(ChaosFlags flags, train::JobSpec spec, std::string job_toml, std::string lab_script)
      : flags_(std::move(flags)),
        spec_(std::move(spec)),
        job_toml_(std::move(job_toml)),
        lab_script_(std::move(lab_script)) {
    std::error_code ec;
    self_ = fs::read_symlink("/proc/self/exe", ec).string();  // this binary, for the trials
  }

  // Runs the job with `schedule` in `dir` (emptied first).
  Run Execute(const std::vector<train::Fault>& schedule, const std::string& dir) const {
    if (flags_.lab > 0) return ExecuteOnLab(schedule, dir);
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::create_directories(dir + "/tmp", ec);
    std::vector<std::string> argv = {self_,        "train", "--spec",   job_toml_,
                                     "--work_dir", dir,     "--report", dir + "/report.txt"};
    for (const train::Fault& f : schedule) argv.insert(argv.end(), {"--chaos", f.ToString()});
    Run r;
    const Child c = RunChild(std::move(argv), TrialEnvironment(dir, HasClockStep(schedule), true),
                             dir + "/out.txt", flags_.trial_timeout);
    r.exit_code = c.exit_code;
    r.seconds = c.seconds;
    ReadOutcome(dir, &r);
    return r;
  }

  // The same on a fresh lab: the job's work_dir on the lab's shared directory, copied to `dir`
  // once the checks that need the lab are done; the lab removed.
  Run ExecuteOnLab(const std::vector<train::Fault>& schedule, const std::string& dir) const {
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::create_directories(dir, ec);
    Run r;
    const std::map<std::string, std::string> env =
        TrialEnvironment(dir, HasClockStep(schedule), false);
    ChaosLab lab(lab_script_, self_, static_cast<int>(flags_.lab));
    if (absl::Status up = lab.Up(env); !up.ok()) {
      r.exit_code = Child::kNotStarted;
      r.lab.push_back({"lab", std::string(up.message())});
      (void)lab.Down();
      return r;
    }
    // The spec and the corpus where every host sees them (a report under /tmp would not be).
    train::JobSpec spec = spec_;
    const std::string data = spec.model.data_dir;
    spec.model.data_dir = lab.shared() + "/data";
    if (fs::exists(data, ec)) fs::copy(data, spec.model.data_dir, fs::copy_options::recursive, ec);
    std::ofstream(lab.shared() + "/job.toml") << spec.ToToml();
    const std::string work = lab.shared() + "/job";
    std::vector<std::string> argv = {self_,        "train",
                                     "--head",     lab.head(),
                                     "--spec",     lab.shared() + "/job.toml",
                                     "--work_dir", work,
                                     "--report",   work + "/report.txt"};
    std::vector<HeadFaults::At> head;  // the runner's to carry out; the rest the job's
    for (const train::Fault& f : schedule) {
      if (train::IsHeadFault(f.kind)) {
        head.push_back({f.step, f.kind == train::FaultKind::kKillHead});
      } else {
        argv.insert(argv.end(), {"--chaos", f.ToString()});
      }
    }
    HeadFaults faults(&lab, head, work + "/commits.log",
                      absl::ToChronoMilliseconds(spec_.network_fault));
    const Child c = RunChild(lab.OnHeadHost(argv), env, dir + "/out.txt", flags_.trial_timeout);
    faults.Join();
    std::ofstream(dir + "/head-faults.txt") << absl::StrJoin(faults.done(), "\n");
    if (faults.failed()) {
      r.lab.push_back({"head-fault", absl::StrJoin(faults.done(), "; ")});
    }
    r.exit_code = c.exit_code;
    r.seconds = c.seconds;
    if (c.exit_code != Child::kInterrupted) {
      for (absl::Status s : {lab.WorkersIdle(std::chrono::seconds(10)), lab.HostTmpEmpty()}) {
        if (!s.ok()) r.lab.push_back({"leftovers", std::string(s.message())});
      }
    }
    fs::copy(work, dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
    fs::copy(lab.shared() + "/logs", dir + "/cluster-logs", fs::copy_options::recursive, ec);
    if (!fs::exists(data, ec)) {
      fs::copy(spec.model.data_dir, data, fs::copy_options::recursive, ec);
    }
    if (absl::Status down = lab.Down(); !down.ok()) {
      r.lab.push_back({"leftovers", std::string(down.message())});
    }
    ReadOutcome(dir, &r);
    return r;
  }

  // The job's report and event log in `dir`.
  static void ReadOutcome(const std::string& dir, Run* out) {
    Run& r = *out;
    std::istringstream rep(Slurp(dir + "/report.txt"));
    for (std::string field; rep >> field;) {
      const size_t eq = field.find('=');
      if (eq != std::string::npos) r.report[field.substr(0, eq)] = field.substr(eq + 1);
    }
    std::istringstream log(Slurp(train::EventLogPath(dir)));
    for (std::string line; std::getline(log, line);) {
      base::SupervisionEvent e;
      if (base::ParseEvent(line, &e)) r.events.push_back(std::move(e));
    }
  }

  // The invariants of a run of `schedule` in `dir`.
  Verdict Judge(const std::vector<train::Fault>& schedule, const std::string& dir,
                const Run& r) const {
    Verdict v;
    auto fail = [&](const std::string& inv, std::string detail) {
      v.failures.push_back({inv, std::move(detail)});
    };
    for (const Failure& f : r.lab) fail(f.invariant, f.detail);
    if (r.exit_code != 0) {
      fail("exit", r.exit_code == Child::kTimedOut
                       ? absl::StrCat("timed out after ", r.seconds, " s")
                   : r.exit_code == Child::kNotStarted
                       ? std::string("could not be started (fork or wait failed)")
                       : absl::StrCat("exit status ", r.exit_code, ", want 0 (",
                                      LastLine(dir + "/out.txt"), ")"));
    }
    const auto crc = r.report.find("crc32c");
    if (!reference_crc_.empty() && r.exit_code == 0 &&
        (crc == r.report.end() || crc->second != reference_crc_)) {
      fail("weights",
           absl::StrCat("final weights crc32c ", crc == r.report.end() ? "(none)" : crc->second,
                        ", the fault-free run's ", reference_crc_));
    }
    if (r.exit_code == 0) {
      const auto lost = r.report.find("steps_lost");
      if (lost == r.report.end() || !absl::SimpleAtoi(lost->second, &v.steps_lost)) {
        v.steps_lost = -1;
        fail("steps-lost", "the job's report has no steps_lost");
      }
      const std::string defects = actors::ExactlyOnceDefects(
          dir, spec_.steps, spec_.model.microbatches, std::max<int64_t>(0, v.steps_lost));
      if (!defects.empty()) fail("exactly-once", defects.substr(0, defects.find('\n')));
      const int64_t allowed =
          train::StepsLostAllowed(schedule, spec_.checkpoint_every, flags_.lab > 0);
      if (v.steps_lost > allowed) {
        fail("steps-lost",
             absl::StrCat(v.steps_lost, " committed steps lost, the faults allow ", allowed));
      }
    }
    for (const base::SupervisionEvent& e : r.events) {
      if (e.event != "recovered") continue;
      double s = 0;
      absl::StatusOr<train::Fault> f = train::ParseFault(e.Field("fault") + "@1");
      if (!absl::SimpleAtod(e.Field("seconds"), &s) || !f.ok()) {
        fail("recovery", absl::StrCat("unreadable recovered event: ", base::FormatEvent(e)));
        continue;
      }
      v.recoveries.push_back({e.Field("fault"), s});
      // The recovery ends with a commit: a step's time (the reference's slowest) on top of the
      // kind's bound.
      const absl::Duration bound = train::RecoveryBound(f->kind, spec_.timeouts);
      const absl::Duration allowed = bound + absl::Seconds(step_slack_s_);
      if (bound > absl::ZeroDuration() && absl::Seconds(s) > allowed) {
        fail("recovery", absl::StrCat(e.Field("fault"), " took ", s, " s to the next commit, ",
                                      "bound ", absl::FormatDuration(allowed)));
      }
    }
    Leftovers(dir, &v);
    if (!flags_.invariant.empty()) {
      const Child c =
          RunChild({"/bin/sh", "-c", flags_.invariant}, {{"TROUPE_CHAOS_WORK_DIR", dir}},
                   dir + "/invariant.txt", flags_.trial_timeout);
      if (c.exit_code != 0 && c.exit_code != Child::kInterrupted) {
        fail("user",
             absl::StrCat("`", flags_.invariant, "` ",
                          c.exit_code == Child::kTimedOut ? "timed out"
                                                          : absl::StrCat("exited ", c.exit_code),
                          " (", dir, "/invariant.txt)"));
      }
    }
    return v;
  }

  // Shrinks a failing schedule: the first smaller candidate that fails one of the same
  // invariants replaces it, until none does or the budget is spent. Returns the smallest.
  std::vector<train::Fault> Shrink(std::vector<train::Fault> schedule, const Verdict& failed,
                                   const std::string& dir, int* runs) const {
    *runs = 0;
    for (bool smaller = true; smaller && *runs < flags_.shrink_budget;) {
      smaller = false;
      for (const auto& candidate : train::ShrinkCandidates(schedule, spec_.checkpoint_every)) {
        if (*runs >= flags_.shrink_budget || g_chaos_stop) break;
        const std::string at = absl::StrCat(dir, "/shrink-", ++*runs);
        const Run r = Execute(candidate, at);
        if (r.exit_code == Child::kInterrupted) break;
        const Verdict v = Judge(candidate, at, r);
        std::printf("  shrink %d: %s -> %s\n", *runs, train::FormatSchedule(candidate).c_str(),
                    v.FailsAnyOf(failed.failures) ? "still fails" : "holds");
        std::fflush(stdout);
        if (v.FailsAnyOf(failed.failures)) {
          schedule = candidate;
          smaller = true;
          break;
        }
      }
    }
    return schedule;
  }

  std::string Reproduce(const std::vector<train::Fault>& schedule) const {
    if (flags_.lab > 0) {
      return absl::StrCat("troupe chaos run --spec ", job_toml_, " --lab ", flags_.lab,
                          " --trials 1 --report ", fs::path(job_toml_).parent_path().string(),
                          "/repro --schedule '", train::FormatSchedule(schedule), "'");
    }
    std::string cmd = absl::StrCat("troupe train --spec ", job_toml_, " --work_dir ",
                                   fs::path(job_toml_).parent_path().string(), "/repro");
    for (const train::Fault& f : schedule) absl::StrAppend(&cmd, " --chaos ", f.ToString());
    return cmd;
  }

  void set_reference(std::string crc, double slowest_step_s) {
    reference_crc_ = std::move(crc);
    step_slack_s_ = slowest_step_s;
  }

 private:
  // No process of the trial (its marker in the environment) outlives it — the roles die with
  // the driver: a few seconds' grace — and its TMPDIR is empty. A process left is killed after it
  // is reported; the files stay for a person to see.
  static void Leftovers(const std::string& dir, Verdict* v) {
    const std::string marker = absl::StrCat(kTrialMarker, "=", dir);
    std::vector<pid_t> left = MarkedProcesses(marker);
    for (int i = 0; i < 100 && !left.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      left = MarkedProcesses(marker);
    }
    if (!left.empty()) {
      v->failures.push_back({"leftovers", absl::StrCat(left.size(),
                                                       " process(es) outlived the "
                                                       "job, e.g. pid ",
                                                       left[0])});
      for (pid_t p : left) kill(p, SIGKILL);
    }
    std::error_code ec;
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir + "/tmp", ec)) {
      files.push_back(e.path().filename());
    }
    if (!files.empty()) {
      v->failures.push_back({"leftovers", absl::StrCat("temporary files left in TMPDIR: ",
                                                       absl::StrJoin(files, " "))});
    }
  }

  ChaosFlags flags_;
  train::JobSpec spec_;
  std::string job_toml_, lab_script_, reference_crc_, self_;
  double step_slack_s_ = 0;
};

// A timeline of a run: faults (red), generations (blue), commits (grey), over seconds.
void WriteTimeline(const std::string& path, const Run& r, const std::string& title) {
  if (r.events.empty()) return;
  const auto t0 = r.events.front().wall_time;
  double end = 0;
  for (const auto& e : r.events) {
    end = std::max(end, std::chrono::duration<double>(e.wall_time - t0).count());
  }
  const double width = 900, x0 = 110, scale = (width - x0 - 10) / std::max(end, 1e-3);
  std::ofstream out(path);
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width
      << "' height='150' font-family='sans-serif' font-size='11'>\n"
      << "<text x='5' y='14'>" << title << "</text>\n";
  const char* rows[] = {"faults", "generations", "commits"};
  for (int i = 0; i < 3; ++i)
    out << "<text x='5' y='" << 45 + 35 * i << "'>" << rows[i] << "</text>\n";
  for (const auto& e : r.events) {
    const double x = x0 + scale * std::chrono::duration<double>(e.wall_time - t0).count();
    int row = -1;
    std::string color, label;
    if (e.event == "fault_fired" || e.event == "fault_armed") {
      row = 0, color = "#c0392b", label = e.Field("kind");
    } else if (e.event == "generation") {
      row = 1, color = "#2c6fbb",
      label = "g" + std::to_string(e.generation) + " w" + e.Field("world");
    } else if (e.event == "step") {
      row = 2, color = "#888";
    }
    if (row < 0) continue;
    const int y = 30 + 35 * row;
    out << "<line x1='" << x << "' x2='" << x << "' y1='" << y << "' y2='" << y + 20 << "' stroke='"
        << color << "'/>\n";
    if (!label.empty()) {
      out << "<text x='" << x + 2 << "' y='" << y + 30 << "' fill='" << color << "'>" << label
          << "</text>\n";
    }
  }
  out << "<text x='" << x0 << "' y='145'>0 s</text><text x='" << width - 60 << "' y='145'>"
      << absl::StrFormat("%.1f s", end) << "</text>\n</svg>\n";
}

std::string RecoverySummary(const Verdict& v) {
  if (v.recoveries.empty()) return "-";
  std::vector<std::string> parts;
  for (const auto& [kind, s] : v.recoveries) parts.push_back(absl::StrFormat("%.2f", s));
  return absl::StrJoin(parts, ",");
}

// The job as every trial runs it, written to <report>/job.toml: the spec's own faults dropped
// (the schedules replace them), one prepared corpus for all. Exit status 2 on bad input.
struct Setup {
  train::JobSpec spec;
  std::vector<train::FaultKind> kinds;
  std::vector<train::Fault> schedule;  // --schedule: every trial's
  std::string report, job_toml, lab_script;
};

// --schedule's faults, the kinds' needs, or --lab's script: a usage error names what is wrong.
absl::Status PrepareFixed(const ChaosFlags& flags, const std::vector<train::FaultKind>& kinds,
                          Setup* out) {
  for (train::FaultKind k : kinds) {
    if (train::IsHeadFault(k) && flags.lab == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--faults ", train::FaultKindName(k), ": the head's faults need --lab"));
    }
  }
  for (absl::string_view f : absl::StrSplit(flags.schedule, ' ', absl::SkipWhitespace())) {
    absl::StatusOr<train::Fault> fault = train::ParseFault(std::string(f));
    if (!fault.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--schedule: '", f, "': ", fault.status().message()));
    }
    if (train::IsHeadFault(fault->kind) && flags.lab == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--schedule: '", f, "': the head's faults need --lab"));
    }
    out->schedule.push_back(*fault);
  }
  if (flags.lab > 0) {
    std::error_code ec;
    out->lab_script = ChaosLab::FindScript(fs::read_symlink("/proc/self/exe", ec).string());
    if (out->lab_script.empty()) {
      return absl::FailedPreconditionError(
          "--lab: scripts/lab not found (set TROUPE_LAB_SCRIPT to troupe's scripts/lab)");
    }
    if (geteuid() != 0) {
      return absl::FailedPreconditionError("--lab: the lab needs root (namespaces, links)");
    }
  }
  return absl::OkStatus();
}

int Prepare(const ChaosFlags& flags, Setup* out) {
  absl::StatusOr<train::JobSpec> spec = flags.spec.Make();
  absl::StatusOr<std::vector<train::FaultKind>> kinds =
      !flags.faults.empty() ? train::ParseFaultKinds(flags.faults)
      : flags.lab > 0       ? train::LabFaultKinds()
                            : train::OneHostFaultKinds();
  for (const absl::Status& s : {spec.status(), kinds.status(),
                                kinds.ok() ? PrepareFixed(flags, *kinds, out) : absl::OkStatus()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "troupe chaos run: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  std::error_code ec;
  fs::create_directories(flags.report_dir, ec);
  const fs::path report = fs::absolute(flags.report_dir, ec);
  if (ec) {
    std::fprintf(stderr, "troupe chaos run: --report %s: %s\n", flags.report_dir.c_str(),
                 ec.message().c_str());
    return 2;
  }
  out->report = report.lexically_normal().string();
  for (train::FaultKind k : *kinds) {  // a stuck rank is blamed by deterministic mode's exchange
    const bool drawn = !flags.faults.empty() || spec->deterministic;
    if (drawn || k != train::FaultKind::kHangWorker) out->kinds.push_back(k);
  }
  out->spec = *spec;
  out->spec.faults.clear();
  if (flags.lab > 0) {  // a worker per host
    out->spec.workers = static_cast<int32_t>(flags.lab);
    out->spec.min_workers = std::min(out->spec.min_workers, out->spec.workers);
    out->spec.max_workers = std::max(out->spec.max_workers, out->spec.workers);
  }
  // Each trial's checkpoints in its own work_dir: a shared [checkpoint] dir would resume one
  // trial from another's.
  out->spec.checkpoint_dir.clear();
  std::string& data = out->spec.model.data_dir;
  data = fs::absolute(data.empty() ? out->report + "/data" : data, ec).lexically_normal().string();
  out->job_toml = out->report + "/job.toml";
  fs::remove(out->report + "/trials.jsonl", ec);
  std::ofstream toml(out->job_toml);
  toml << out->spec.ToToml();
  if (!toml.flush()) {
    std::fprintf(stderr, "troupe chaos run: cannot write %s\n", out->job_toml.c_str());
    return 2;
  }
  return 0;
}

// Runs and judges trial `t`; prints its line, shrinks it if it failed; its report entry.
json RunTrial(const ChaosFlags& flags, const Runner& runner, const train::ChaosDraw& draw,
              const std::vector<train::Fault>& fixed, const std::string& report, int64_t t) {
  const std::vector<train::Fault> schedule =
      !fixed.empty() ? fixed : train::DrawSchedule(static_cast<uint64_t>(flags.seed), t, draw);
  const std::string dir = absl::StrCat(report, "/trial-", t);
  const Run r = runner.Execute(schedule, dir);
  if (r.exit_code == Child::kInterrupted || g_chaos_stop) return json();  // stopped: no verdict
  const Verdict v = runner.Judge(schedule, dir, r);
  std::printf("%-6lld %-60s %-8s %-14s %-5lld %.1f\n", static_cast<long long>(t),
              train::FormatSchedule(schedule).c_str(), v.Held() ? "ok" : "FAILED",
              RecoverySummary(v).c_str(), static_cast<long long>(v.steps_lost), r.seconds);
  json row = {{"trial", t},
              {"seed", flags.seed},
              {"schedule", train::FormatSchedule(schedule)},
              {"faults", schedule.size()},
              {"outcome", v.Held() ? "ok" : "failed"},
              {"exit_code", r.exit_code},
              {"steps_lost", v.steps_lost},
              {"seconds", r.seconds},
              {"recovery", json::array()},
              {"failures", json::array()}};
  for (const auto& [kind, s] : v.recoveries) {
    row["recovery"].push_back({{"fault", kind}, {"seconds", s}});
  }
  for (const Failure& f : v.failures) {
    row["failures"].push_back({{"invariant", f.invariant}, {"detail", f.detail}});
    std::printf("       %s: %s\n", f.invariant.c_str(), f.detail.c_str());
  }
  std::error_code ec;
  if (v.Held()) {
    fs::remove_all(dir, ec);  // its numbers are in the report; 200 trials' checkpoints are not
  } else {
    row["dir"] = dir;
    row["timeline"] = dir + "/timeline.svg";
    WriteTimeline(dir + "/timeline.svg", r,
                  absl::StrCat("trial ", t, ": ", train::FormatSchedule(schedule)));
    int runs = 0;
    const std::vector<train::Fault> smallest = runner.Shrink(schedule, v, dir, &runs);
    row["shrunk"] = ShrunkEntry(runs, train::FormatSchedule(smallest), smallest.size(),
                                runner.Reproduce(smallest));
  }
  std::fflush(stdout);
  return row;
}

int RunChaos(const ChaosFlags& flags) {
  Setup setup;
  if (int rc = Prepare(flags, &setup); rc != 0) return rc;
  const train::JobSpec& spec = setup.spec;
  Runner runner(flags, spec, setup.job_toml, setup.lab_script);
  std::printf(
      "troupe chaos: %s, %lld steps on %d workers%s; seed %lld, %s trials of 1..%lld "
      "faults from %zu kinds; report in %s\n",
      spec.name.c_str(), static_cast<long long>(spec.steps), spec.workers,
      flags.lab > 0 ? absl::StrCat(" (a host each, on lab ", ChaosLab("", "", 0).name(), " of ",
                                   flags.lab + 1, " hosts)")
                          .c_str()
                    : "",
      static_cast<long long>(flags.seed),
      flags.continuous ? "continuous" : std::to_string(flags.trials).c_str(),
      static_cast<long long>(flags.max_faults), setup.kinds.size(), setup.report.c_str());
  std::fflush(stdout);
  const Run reference = runner.Execute({}, setup.report + "/reference");
  if (reference.exit_code == Child::kInterrupted) return 130;
  const auto crc = reference.report.find("crc32c");
  if (reference.exit_code != 0 || crc == reference.report.end()) {
    std::fprintf(stderr,
                 "troupe chaos run: the fault-free reference run failed (exit %d; %s/out.txt)\n",
                 reference.exit_code, (setup.report + "/reference").c_str());
    return 1;
  }
  double slowest_step = 0;
  for (const base::SupervisionEvent& e : reference.events) {
    double s = 0;
    if (e.event == "step" && absl::SimpleAtod(e.Field("step_s"), &s)) {
      slowest_step = std::max(slowest_step, s);
    }
  }
  runner.set_reference(spec.deterministic ? crc->second : "", slowest_step);
  std::printf("reference: %.1f s, weights crc32c %s%s\n", reference.seconds, crc->second.c_str(),
              spec.deterministic ? "" : " (not deterministic: weights are not compared)");
  std::printf("%-6s %-60s %-8s %-14s %-5s %s\n", "trial", "schedule", "outcome", "recovery_s",
              "lost", "seconds");
  const train::ChaosDraw draw{setup.kinds,  static_cast<int>(flags.max_faults),
                              spec.steps,   spec.checkpoint_every,
                              spec.workers, spec.min_workers,
                              flags.lab > 0};
  json doc = {
      {"spec", setup.job_toml},
      {"seed", flags.seed},
      {"max_faults", flags.max_faults},
      {"lab_hosts", flags.lab > 0 ? flags.lab + 1 : 0},
      {"kinds", json::array()},
      {"reference_crc32c", crc->second},
      {"deterministic", spec.deterministic},
      {"invariants", {"exit", "weights", "exactly-once", "steps-lost", "recovery", "leftovers"}}};
  for (train::FaultKind k : setup.kinds) doc["kinds"].push_back(train::FaultKindName(k));
  if (!flags.invariant.empty()) doc["invariants"].push_back("user");
  return RunTrials(flags.continuous, flags.trials, setup.report, std::move(doc), [&](int64_t t) {
    return RunTrial(flags, runner, draw, setup.schedule, setup.report, t);
  });
}

}  // namespace

int RunChaosCommand(const Args& args) {
  if (!args.empty() && args[0] == "actors") {
    return RunChaosActors(Args(args.begin() + 1, args.end()));
  }
  if (args.empty() || args[0] != "run") {
    std::fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  ChaosFlags flags;
  runtime::ConfigRegistry config;
  flags.Register(config);
  if (int rc = runtime::ParseCommandLine("chaos run", kUsage, Args(args.begin() + 1, args.end()),
                                         config);
      rc >= 0) {
    return rc;
  }
  CatchStopSignals();
  return RunChaos(flags);
}

}  // namespace troupe::tools
