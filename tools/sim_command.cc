// troupe sim spot: goodput and cost of spot/on-demand mixes for a preemption trace
// (train/spot_sim.h), and with --measure the same trace run for real on this machine — a local
// cluster of node agents, each preemption a SIGTERM notice to its node at its time, each
// replacement a new node — to check the prediction against it. The step times the prediction
// uses then come from fault-free runs of the same job at each world (calibration), never from
// the run it is checked against.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "commands.h"
#include "troupe/actors/training.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/config.h"
#include "troupe/train/spot_sim.h"

namespace troupe::tools {
namespace {

constexpr char kUsage[] =
    "usage: troupe sim spot --trace FILE [--mix OD:SPOT,...] [--measure] [--work_dir DIR]\n"
    "  Replays the trace's preemptions through troupe's elastic policy and scheduler for each\n"
    "  mix of on-demand and spot machines (default: the trace's [cluster]) and prints goodput\n"
    "  (committed steps per hour) and cost. --measure also runs the trace's own mix for real on\n"
    "  this machine (calibrating step times first) and compares: predicted_err_pct.";

using Clock = std::chrono::steady_clock;

// When a job's commits happened: commits.log polled (a line per committed step).
struct Commits {
  double first_s = -1, last_s = -1;  // since the controller started
  int64_t first = 0, last = 0;       // commits.log lines then
  double StepSeconds() const { return last > first ? (last_s - first_s) / (last - first) : 0; }
  double GoodputPerH() const {
    return last_s > first_s ? 3600.0 * static_cast<double>(last - first) / (last_s - first_s) : 0;
  }
};

// Whether `pid` still runs (a zombie has left: its parent reaps it later).
bool Running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

int64_t Lines(const std::string& path) {
  std::ifstream in(path);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// Spot machines round-robin over the zones; a replacement in the zone of the one it replaces.
struct SpotMachines {
  runtime::LocalCluster* cluster;
  std::map<std::string, train::SpotZone> zone_of;

  absl::StatusOr<pid_t> Add(const std::string& name, const train::SpotZone& z) {
    zone_of[name] = z;
    const double grace = z.notice_s > 0 ? z.notice_s : 1;
    return cluster->AddNode(
        name, 1, "cpu=1", "spot=true,zone=" + z.name,
        {"--preemption_source", "sigterm", "--grace", absl::StrFormat("%.3fs", grace)});
  }
};

// RunOnCluster's controller: polls commits.log (a line per committed step) and, with `replay`,
// gives each [[preemption]] at its time after the first commit and replaces each spot machine
// that has left.
class PreemptionReplay {
 public:
  PreemptionReplay(const train::SpotTrace& t, SpotMachines& machines, int spot, bool replay,
                   std::string commits_log)
      : t_(t),
        machines_(machines),
        replay_(replay),
        commits_log_(std::move(commits_log)),
        next_spot_(spot) {}

  void Run(const std::atomic<bool>& stop) {
    t0_ = Clock::now();
    while (!stop) {
      WatchCommits();
      GiveDue();
      ReplaceGone();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  const Commits& commits() const { return c_; }

 private:
  struct Pending {
    double at_s;
    std::string machine;
    bool replacement;
    train::SpotZone zone;
  };

  double Since() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  void WatchCommits() {
    const int64_t n = Lines(commits_log_);
    if (n == seen_) return;
    seen_ = n;
    if (c_.first_s < 0 && n > 0) {
      c_.first_s = Since();
      c_.first = n;
      for (const train::SpotPreemption& p : t_.preemptions) {
        if (replay_) pending_.push_back({c_.first_s + p.at_s, p.machine, false, {}});
      }
    }
    c_.last_s = Since();
    c_.last = n;
  }

  // Gives each preemption that is due (as RunOnCluster says) and starts each replacement.
  void GiveDue() {
    std::vector<Pending> due;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (Since() >= it->at_s) {
        due.push_back(*it);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    for (const Pending& p : due) {
      if (p.replacement) {
        (void)machines_.Add(absl::StrCat("s", next_spot_++), p.zone);
        continue;
      }
      auto node = machines_.cluster->nodes().find(p.machine);
      if (node == machines_.cluster->nodes().end() || !machines_.zone_of.count(p.machine)) continue;
      const train::SpotZone z = machines_.zone_of[p.machine];
      kill(node->second, z.notice_s > 0 ? SIGTERM : SIGKILL);
      leaving_[node->second] = z;
    }
  }

  // A noticed machine is replaced replace_s after it leaves — handed over, or at its notice's end.
  void ReplaceGone() {
    for (auto it = leaving_.begin(); it != leaving_.end();) {
      if (Running(it->first)) {
        ++it;
        continue;
      }
      pending_.push_back({Since() + it->second.replace_s, "", true, it->second});
      it = leaving_.erase(it);
    }
  }

  const train::SpotTrace& t_;
  SpotMachines& machines_;
  const bool replay_;
  const std::string commits_log_;
  Clock::time_point t0_;
  Commits c_;
  std::vector<Pending> pending_;
  std::map<pid_t, train::SpotZone> leaving_;  // noticed machines not yet gone, by agent pid
  int next_spot_;
  int64_t seen_ = 0;
};

// The trace's job for a cluster of `workers` (its data and run under `dir`).
absl::StatusOr<train::JobSpec> SpotJob(const train::SpotTrace& t, int workers, int64_t steps,
                                       const std::string& dir) {
  absl::StatusOr<train::JobSpec> spec = train::ParseJobSpec("", "sim");
  if (!spec.ok()) return spec.status();
  spec->steps = steps;
  spec->workers = workers;
  spec->min_workers = t.min_workers;
  spec->max_workers = t.max_workers;
  spec->work_dir = dir + "/run";
  spec->model.data_dir = dir + "/data";
  return spec;
}

// The trace's job on a local cluster of `od` on-demand and `spot` spot machines (a node agent and
// one worker each). With `replay`, each [[preemption]] is given at its time after the first
// commit: SIGTERM to its node (a notice; the node drains for the zone's notice_s), or SIGKILL
// where the zone gives none; a spot machine that leaves is replaced after replace_s.
absl::StatusOr<Commits> RunOnCluster(const train::SpotTrace& t, int od, int spot, int64_t steps,
                                     bool replay, const std::string& dir) {
  std::filesystem::remove_all(dir + "/run");
  std::filesystem::create_directories(dir + "/run");
  runtime::LocalCluster::Options lo;
  lo.workers = 0;
  lo.cluster.log_dir = dir + "/run/logs";
  absl::StatusOr<std::unique_ptr<runtime::LocalCluster>> cluster = runtime::LocalCluster::Start(lo);
  if (!cluster.ok()) return cluster.status();
  SpotMachines machines{cluster->get(), {}};
  for (int i = 0; i < od; ++i) {
    absl::StatusOr<pid_t> p = (*cluster)->AddNode(absl::StrCat("od", i), 1, "cpu=1",
                                                  "spot=false,zone=" + t.zones[0].name);
    if (!p.ok()) return p.status();
  }
  for (int i = 0; i < spot; ++i) {
    absl::StatusOr<pid_t> p =
        machines.Add(absl::StrCat("s", i), t.zones[static_cast<size_t>(i) % t.zones.size()]);
    if (!p.ok()) return p.status();
  }
  const std::string head = absl::StrCat("127.0.0.1:", (*cluster)->port());
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string wait = absl::StrCat(self, " status --head ", head, " --wait_workers ",
                                        od + spot, " >/dev/null 2>&1");
  if (std::system(wait.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("the local cluster's ", od + spot,
                                               " workers did not all come up (logs in ", dir,
                                               "/run/logs)"));
  }
  TROUPE_ASSIGN_OR_RETURN(train::JobSpec spec, SpotJob(t, od + spot, steps, dir));
  actors::TrainOptions options;
  options.head = head;
  std::ofstream progress(dir + "/run/out.txt");
  options.progress = &progress;

  PreemptionReplay controller(t, machines, spot, replay, dir + "/run/commits.log");
  std::atomic<bool> stop{false};
  std::thread thread([&] { controller.Run(stop); });
  absl::StatusOr<actors::JobReport> report = actors::RunTrainingJob(spec, options);
  stop = true;
  thread.join();
  if (!report.ok()) return report.status();
  return controller.commits();
}

std::string Row(const train::SpotOutcome& o) {
  return absl::StrFormat(
      "mix od=%d spot=%d: goodput %.0f steps/h, cost %.4f (%.4f per 1k steps), %d preemptions, "
      "%d generations, %d hand-over checkpoints, %d coordinator moves, %d steps lost, world %d%s "
      "(coordinator first on %s%s)",
      o.on_demand, o.spot, o.goodput_steps_per_h, o.cost, o.cost_per_1k_steps, o.preemptions,
      o.generations, o.handover_checkpoints, o.coordinator_moves, o.steps_lost, o.final_world,
      o.preempted ? ", stopped preempted" : "", o.coordinator_machine,
      o.ignored_preemptions ? absl::StrCat("; ", o.ignored_preemptions,
                                           " listed preemptions of machines it does not have")
                            : "");
}

// --mix: OD:SPOT pairs, comma-separated, after the trace's own; false (after printing why) for a
// malformed one.
bool ParseMixes(const std::string& mixes, std::vector<std::pair<int, int>>* mix) {
  for (absl::string_view text : absl::StrSplit(mixes, ',', absl::SkipEmpty())) {
    const std::string m(text);
    std::vector<std::string> p = absl::StrSplit(m, ':');
    int od = -1, sp = -1;
    if (p.size() != 2 || !absl::SimpleAtoi(p[0], &od) || !absl::SimpleAtoi(p[1], &sp) || od < 0 ||
        sp < 0 || od + sp == 0) {
      std::fprintf(stderr, "troupe sim spot: --mix: expected OD:SPOT (e.g. 1:3), got '%s'\n",
                   m.c_str());
      return false;
    }
    mix->emplace_back(od, sp);
  }
  return true;
}

// The step time at each world, from fault-free runs on this machine, into trace->step_s; false
// (after printing why) when a run fails.
bool Calibrate(train::SpotTrace* trace, int64_t calibration_steps, const std::string& work_dir) {
  const int max_world = std::min(trace->max_workers, trace->on_demand + trace->spot);
  std::vector<double> step_s;
  for (int w = 1; w <= max_world; ++w) {
    absl::StatusOr<Commits> c =
        RunOnCluster(*trace, w, 0, calibration_steps, /*replay=*/false, work_dir);
    if (!c.ok()) {
      std::fprintf(stderr, "troupe sim spot: calibration at world %d: %s\n", w,
                   c.status().ToString().c_str());
      return false;
    }
    step_s.push_back(c->StepSeconds());
    std::cout << absl::StrFormat("calibration: world %d: %.4f s per step", w, step_s.back())
              << std::endl;
  }
  trace->step_s = step_s;
  return true;
}

// --measure: the trace's own mix run for real, calibrated first, against its prediction; the
// prediction's error in percent, or nothing (after printing why) when a run fails.
std::optional<double> MeasurePredictionError(train::SpotTrace* trace, int64_t calibration_steps,
                                             const std::string& work_dir) {
  if (!Calibrate(trace, calibration_steps, work_dir)) return std::nullopt;
  absl::StatusOr<Commits> run = RunOnCluster(*trace, trace->on_demand, trace->spot, trace->steps,
                                             /*replay=*/true, work_dir);
  if (!run.ok()) {
    std::fprintf(stderr, "troupe sim spot: the measured run: %s\n",
                 run.status().ToString().c_str());
    return std::nullopt;
  }
  absl::StatusOr<train::SpotOutcome> predicted =
      train::SimulateSpot(*trace, trace->on_demand, trace->spot);
  if (!predicted.ok()) {
    std::fprintf(stderr, "troupe sim spot: %s\n", predicted.status().ToString().c_str());
    return std::nullopt;
  }
  const double measured = run->GoodputPerH();
  const double err_pct = 100.0 * std::fabs(predicted->goodput_steps_per_h - measured) / measured;
  std::cout << absl::StrFormat(
                   "measured (od=%d spot=%d, this machine): goodput %.0f steps/h over %.2f s; "
                   "predicted %.0f steps/h over %.2f s; error %.1f%% (runs in %s)",
                   trace->on_demand, trace->spot, measured, run->last_s - run->first_s,
                   predicted->goodput_steps_per_h, predicted->seconds, err_pct, work_dir)
            << std::endl;
  return err_pct;
}

// A row per mix, then the summary of the first (the trace's own); the exit status.
int PrintMixes(const train::SpotTrace& trace, const std::vector<std::pair<int, int>>& mix,
               double err_pct) {
  train::SpotOutcome own;
  for (size_t i = 0; i < mix.size(); ++i) {
    absl::StatusOr<train::SpotOutcome> o = train::SimulateSpot(trace, mix[i].first, mix[i].second);
    if (!o.ok()) {
      std::fprintf(stderr, "troupe sim spot: od=%d spot=%d: %s\n", mix[i].first, mix[i].second,
                   std::string(o.status().message()).c_str());
      return 1;
    }
    if (i == 0) own = *o;
    std::cout << Row(*o) << std::endl;
  }
  std::cout << absl::StrFormat("summary: goodput_steps_per_h=%.0f cost_per_1k_steps=%.4f ",
                               own.goodput_steps_per_h, own.cost_per_1k_steps)
            << (err_pct < 0 ? std::string("predicted_err_pct=n/a")
                            : absl::StrFormat("predicted_err_pct=%.1f", err_pct))
            << std::endl;
  return 0;
}

}  // namespace

int RunSim(const Args& args) {
  if (args.empty() || args[0] != "spot") {
    std::fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  std::string trace_path, mixes, work_dir;
  bool measure = false;
  int64_t calibration_steps = 150;
  runtime::ConfigRegistry config;
  config.AddString("trace", &trace_path, "the preemption trace (TOML; examples/spot/trace.toml)");
  config.AddString("mix", &mixes, "OD:SPOT machine mixes to simulate, comma-separated");
  config.AddBool("measure", &measure, "also run the trace's own mix for real and compare");
  config.AddString("work_dir", &work_dir, "--measure: where the runs go (default: a temp dir)");
  config.AddInt("calibration_steps", &calibration_steps,
                "--measure: steps of each fault-free calibration run",
                runtime::InRange(10, 100000));
  if (int rc =
          runtime::ParseCommandLine("sim spot", kUsage, Args(args.begin() + 1, args.end()), config);
      rc >= 0) {
    return rc;
  }
  absl::StatusOr<train::SpotTrace> trace = train::LoadSpotTrace(trace_path);
  if (!trace.ok()) {
    std::fprintf(stderr, "troupe sim spot: %s\n", std::string(trace.status().message()).c_str());
    return 2;
  }
  std::vector<std::pair<int, int>> mix = {{trace->on_demand, trace->spot}};
  if (!ParseMixes(mixes, &mix)) return 2;
  double err_pct = -1;
  if (measure) {
    if (work_dir.empty()) work_dir = absl::StrCat("/tmp/troupe-sim-spot-", getpid());
    const std::optional<double> measured =
        MeasurePredictionError(&*trace, calibration_steps, work_dir);
    if (!measured) return 1;
    err_pct = *measured;
  }
  return PrintMixes(*trace, mix, err_pct);
}

}  // namespace troupe::tools
