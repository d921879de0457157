// troupe chaos actors: random fault schedules against the actors of a program that embeds
// troupe's runtime — killed, stopped (hung in their handler) or slowed by name at random instants —
// each trial judged by the program's exit status and a user's invariant command, a failing
// schedule shrunk to a smallest one that still fails, and a report.
//
// The schedule reaches the program through TROUPE_CHAOS_ACTORS, which its Runtime reads when it
// is created and carries out itself (troupe/runtime/faults.h); what fired comes back through
// TROUPE_CHAOS_LOG.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "chaos_lab.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "troupe/base/events.h"
#include "troupe/base/seeded_words.h"
#include "troupe/runtime/faults.h"

namespace troupe::tools {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using runtime::ActorFault;

constexpr char kUsage[] =
    "usage: troupe chaos actors --program CMD [--actors NAMES] [--trials N] [--seed S]\n"
    "                           [--max-faults K] [--kinds kill,stop,delay] [--window-ms W]\n"
    "                           [--max-for-ms F] [--invariant CMD] [--timeout-s T] [--report DIR]\n"
    "                           [--shrink-budget N] [--continuous]\n"
    "  Runs CMD (sh -c), a program that embeds troupe's runtime, N times, each with a schedule of\n"
    "  1..K faults drawn from the seed on the actors NAMES (comma-separated; default: the names\n"
    "  its runtime lists in a first, fault-free run): kill (exit_reason::kill), stop (hung in its\n"
    "  handler for 100..F ms) or delay (its messages delayed 10..200 ms each, for 100..F ms), at\n"
    "  instants in [0, W] ms after its Runtime was created; the program gets the schedule as\n"
    "  TROUPE_CHAOS_ACTORS ('kill:worker-2@1500 stop:worker-1@800+400', see\n"
    "  troupe/runtime/faults.h), TROUPE_CHAOS_LOG (where its runtime logs each fault fired) and\n"
    "  TROUPE_CHAOS_TRIAL, in its own process group, its working directory and TMPDIR in\n"
    "  <report>/trial-<n> (give CMD's paths absolute), stdout and stderr in files there, killed\n"
    "  after --timeout-s. A trial holds when CMD exits 0 and --invariant CMD (sh -c, afterwards,\n"
    "  with TROUPE_CHAOS_TRIAL_DIR and TROUPE_CHAOS_SCHEDULE) exits 0. A failing schedule is\n"
    "  shrunk (faults removed, moved earlier) to a smallest one that still fails the same way,\n"
    "  printed as the command that reproduces it.\n"
    "  Report: a line per trial, <report>/report.json, <report>/trials.jsonl.\n"
    "Exit status: 0 every trial held, 1 some failed, 2 bad flags.";

struct Flags {
  std::string program, actors, kinds = "kill,stop,delay", invariant;
  std::string report_dir = "troupe-chaos-actors";
  int64_t trials = 20, seed = 1, max_faults = 3, window_ms = 2000, max_for_ms = 1000;
  int64_t shrink_budget = 8;
  double timeout_s = 60;
  bool continuous = false;

  void Register(runtime::ConfigRegistry& config) {
    config.AddString("program", &program, "the program to run (sh -c), embedding troupe");
    config.AddString("actors", &actors,
                     "actor names the faults target, comma-separated (\"\": those the program's "
                     "runtime lists in a fault-free run)");
    config.AddInt("trials", &trials, "trials to run", runtime::AtLeast(1));
    config.AddInt("seed", &seed, "the seed every schedule is drawn from", runtime::AtLeast(0));
    config.AddInt("max-faults", &max_faults, "faults per trial: 1..K", runtime::InRange(1, 32));
    config.AddString("kinds", &kinds, "fault kinds to draw from, comma-separated");
    config.AddInt("window-ms", &window_ms, "faults fall in [0, W] ms after the runtime starts",
                  runtime::InRange(0, 86400000));
    config.AddInt("max-for-ms", &max_for_ms, "a stop or delay lasts 100..F ms (F < 100: 1..F)",
                  runtime::InRange(1, 86400000));
    config.AddString("invariant", &invariant,
                     "a command that must exit 0 after each trial (sh -c; TROUPE_CHAOS_TRIAL_DIR "
                     "is the trial's directory)");
    config.AddDouble("timeout-s", &timeout_s,
                     "a trial's program (and invariant) running longer "
                     "is killed and has failed",
                     [](const double& s) { return s > 0 ? "" : "expected > 0"; });
    config.AddString("report", &report_dir, "where the trials and report.json go");
    config.AddInt("shrink-budget", &shrink_budget,
                  "runs a failing schedule's shrinking may take (0: no shrinking)",
                  runtime::AtLeast(0));
    config.AddBool("continuous", &continuous,
                   "draw trials until stopped (SIGINT/SIGTERM), a line per trial: a soak");
  }
};

using Words = base::SeededWords;

// What a trial may draw.
struct Draw {
  std::vector<ActorFault::Kind> kinds;  // non-empty
  std::vector<std::string> actors;      // non-empty
  int64_t max_faults = 3, window_ms = 2000, max_for_ms = 1000;
};

// Trial `trial`'s schedule under `seed`, in at_ms order.
std::vector<ActorFault> DrawSchedule(uint64_t seed, int64_t trial, const Draw& d) {
  Words w(seed, trial);
  std::vector<ActorFault> out(static_cast<size_t>(w.In(1, d.max_faults)));
  const int64_t min_for = std::min<int64_t>(100, d.max_for_ms);
  for (ActorFault& f : out) {
    f.kind = d.kinds[static_cast<size_t>(w.In(0, static_cast<int64_t>(d.kinds.size()) - 1))];
    f.actor = d.actors[static_cast<size_t>(w.In(0, static_cast<int64_t>(d.actors.size()) - 1))];
    f.at_ms = w.In(0, d.window_ms);
    if (f.kind != ActorFault::Kind::kKill) f.for_ms = w.In(min_for, d.max_for_ms);
    if (f.kind == ActorFault::Kind::kDelay) f.delay_ms = w.In(10, 200);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ActorFault& a, const ActorFault& b) { return a.at_ms < b.at_ms; });
  return out;
}

// Faults are never moved earlier than this after the runtime starts: before it, a program's
// actors may not exist yet, and a fault that finds no actor reproduces nothing.
constexpr int64_t kEarliestMs = 100;

// Smaller schedules to try after `schedule` failed, most reduced first: each fault removed, then
// each moved earlier (to half its instant, not before kEarliestMs).
std::vector<std::vector<ActorFault>> ShrinkCandidates(const std::vector<ActorFault>& schedule) {
  std::vector<std::vector<ActorFault>> out;
  for (size_t i = 0; i < schedule.size(); ++i) {
    std::vector<ActorFault> fewer = schedule;
    fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(i));
    out.push_back(std::move(fewer));
  }
  for (size_t i = 0; i < schedule.size(); ++i) {
    if (schedule[i].at_ms / 2 < kEarliestMs) continue;
    std::vector<ActorFault> earlier = schedule;
    earlier[i].at_ms = schedule[i].at_ms / 2;
    std::stable_sort(earlier.begin(), earlier.end(),
                     [](const ActorFault& a, const ActorFault& b) { return a.at_ms < b.at_ms; });
    out.push_back(std::move(earlier));
  }
  return out;
}

std::string Format(const std::vector<ActorFault>& schedule) {
  return schedule.empty() ? "(none)" : runtime::FormatActorFaults(schedule);
}

// `text` as one word of sh: single-quoted, a quote inside as '\''.
std::string ShellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// One run of the program with a schedule, and how it went.
struct Outcome {
  int exit_code = Child::kNotStarted;  // the program's
  double seconds = 0;                  // the program's and the invariant's
  std::string failure;                 // "": held; else "exit", "timeout" or "invariant"
  std::string detail;
  json fired = json::array();  // the faults its runtime logged: {fault, result, fired_ms}
  bool interrupted = false;
  bool Held() const { return failure.empty(); }
};

class Trials {
 public:
  explicit Trials(const Flags& flags) : flags_(flags) {}

  // Runs the program with `schedule` in `dir` (emptied first), then the invariant.
  Outcome Execute(const std::vector<ActorFault>& schedule, const std::string& dir,
                  int64_t trial) const {
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::create_directories(dir + "/tmp", ec);
    std::map<std::string, std::string> env = {
        {"TROUPE_CHAOS_ACTORS", runtime::FormatActorFaults(schedule)},
        {"TROUPE_CHAOS_LOG", dir + "/faults.log"},
        {"TROUPE_CHAOS_TRIAL", std::to_string(trial)},
        {"TMPDIR", dir + "/tmp"}};
    Outcome o;
    const Child c = InDir(flags_.program, dir, env, "stdout.txt", "stderr.txt");
    o.exit_code = c.exit_code;
    o.seconds = c.seconds;
    o.interrupted = c.exit_code == Child::kInterrupted;
    o.fired = Fired(dir + "/faults.log");
    if (o.interrupted) return o;
    if (c.exit_code == Child::kTimedOut) {
      o.failure = "timeout";
      o.detail = absl::StrCat("still running after ", flags_.timeout_s, " s: killed");
    } else if (c.exit_code != 0) {
      o.failure = "exit";
      std::string last = LastLine(dir + "/stderr.txt");
      if (last.empty()) last = LastLine(dir + "/stdout.txt");
      o.detail = c.exit_code == Child::kNotStarted
                     ? std::string("could not be started (fork or wait failed)")
                     : absl::StrCat("exit status ", c.exit_code, ", want 0 (", last, ")");
    } else if (!flags_.invariant.empty()) {
      env["TROUPE_CHAOS_ACTORS"] = "";  // an invariant that embeds troupe is not faulted
      env["TROUPE_CHAOS_SCHEDULE"] = runtime::FormatActorFaults(schedule);
      env["TROUPE_CHAOS_TRIAL_DIR"] = dir;
      const Child inv = InDir(flags_.invariant, dir, env, "invariant.txt", "invariant.txt");
      o.seconds += inv.seconds;
      o.interrupted = inv.exit_code == Child::kInterrupted;
      if (inv.exit_code != 0 && !o.interrupted) {
        o.failure = "invariant";
        o.detail =
            absl::StrCat("`", flags_.invariant, "` ",
                         inv.exit_code == Child::kTimedOut ? std::string("timed out")
                                                           : absl::StrCat("exited ", inv.exit_code),
                         " (", dir, "/invariant.txt)");
      }
    }
    return o;
  }

  // Shrinks a failing schedule: the first smaller candidate that fails the same way replaces
  // it, until none does or the budget is spent. Returns the smallest.
  std::vector<ActorFault> Shrink(std::vector<ActorFault> schedule, const Outcome& failed,
                                 const std::string& dir, int64_t trial, int* runs) const {
    *runs = 0;
    std::set<std::string> tried;  // each held (or failed otherwise): not run again
    for (bool smaller = true; smaller && *runs < flags_.shrink_budget;) {
      smaller = false;
      for (const auto& candidate : ShrinkCandidates(schedule)) {
        if (*runs >= flags_.shrink_budget || g_chaos_stop) break;
        if (!tried.insert(Format(candidate)).second) continue;
        const Outcome o = Execute(candidate, absl::StrCat(dir, "/shrink-", ++*runs), trial);
        if (o.interrupted) break;
        const bool fails = o.failure == failed.failure;
        std::printf("  shrink %d: %s -> %s\n", *runs, Format(candidate).c_str(),
                    fails      ? "still fails"
                    : o.Held() ? "holds"
                               : "fails otherwise");
        std::fflush(stdout);
        if (fails) {
          schedule = candidate;
          smaller = true;
          break;
        }
      }
    }
    return schedule;
  }

  std::string Reproduce(const std::vector<ActorFault>& schedule) const {
    return absl::StrCat("TROUPE_CHAOS_ACTORS=", ShellQuote(runtime::FormatActorFaults(schedule)),
                        " ", flags_.program);
  }

 private:
  // `command` (sh -c) in its own process group with `dir` its working directory, stdout and
  // stderr to files there (the same name: both to one file).
  Child InDir(const std::string& command, const std::string& dir,
              const std::map<std::string, std::string>& env, const std::string& out,
              const std::string& err) const {
    std::string sh =
        absl::StrCat("cd ", ShellQuote(dir), " && exec /bin/sh -c ", ShellQuote(command));
    if (err != out) absl::StrAppend(&sh, " 2>", ShellQuote(dir + "/" + err));
    return RunChild({"/bin/sh", "-c", sh}, env, dir + "/" + out,
                    std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::duration<double>(flags_.timeout_s)));
  }

  // The faults the program's runtime logged (event=chaos_fault lines, troupe/base/events.h).
  static json Fired(const std::string& log_path) {
    json out = json::array();
    std::istringstream log(Slurp(log_path));
    for (std::string line; std::getline(log, line);) {
      base::SupervisionEvent e;
      if (!base::ParseEvent(line, &e) || e.event != "chaos_fault") continue;
      out.push_back({{"fault", e.Field("fault")},
                     {"result", e.Field("result")},
                     {"fired_ms", e.IntField("fired_ms")}});
    }
    return out;
  }

  const Flags& flags_;
};

// The flags checked and turned into a draw and a report directory; a message and false when
// one is wrong.
bool Prepare(const Flags& flags, Draw* draw, std::string* report) {
  auto bad = [](const std::string& message) {
    std::fprintf(stderr, "troupe chaos actors: %s\n", message.c_str());
    return false;
  };
  if (flags.program.empty()) return bad("--program: expected a command to run, got none");
  for (absl::string_view k : absl::StrSplit(flags.kinds, ',', absl::SkipWhitespace())) {
    ActorFault::Kind kind;
    if (!runtime::ParseActorFaultKind(std::string(k), &kind)) {
      return bad(absl::StrCat("--kinds: unknown kind '", k,
                              "': expected kill, stop or delay (comma-separated), got '",
                              flags.kinds, "'"));
    }
    if (std::find(draw->kinds.begin(), draw->kinds.end(), kind) == draw->kinds.end()) {
      draw->kinds.push_back(kind);
    }
  }
  if (draw->kinds.empty()) return bad("--kinds: expected kill, stop or delay, got none");
  for (absl::string_view a : absl::StrSplit(flags.actors, ',', absl::SkipWhitespace())) {
    if (a.find_first_of(" \t\n") != absl::string_view::npos) {
      return bad(absl::StrCat("--actors: expected names without spaces, got '", a, "'"));
    }
    draw->actors.emplace_back(a);
  }
  draw->max_faults = flags.max_faults;
  draw->window_ms = flags.window_ms;
  draw->max_for_ms = flags.max_for_ms;
  std::error_code ec;
  fs::create_directories(flags.report_dir, ec);
  const fs::path dir = fs::absolute(flags.report_dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return bad(absl::StrCat("--report ", flags.report_dir, ": expected a directory it can make, ",
                            "got ", ec ? ec.message() : "not a directory"));
  }
  *report = dir.lexically_normal().string();
  fs::remove(*report + "/trials.jsonl", ec);
  return true;
}

// --actors not given: the names the program's runtime lists (TROUPE_CHAOS_ACTORS_LIST) in a run
// without faults. False (said why) when it lists none.
bool DiscoverActors(const Flags& flags, const std::string& report, Draw* draw) {
  const std::string dir = report + "/discover";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir + "/tmp", ec);
  const std::string list = dir + "/actors.txt";
  const Child c = RunChild(
      {"/bin/sh", "-c",
       absl::StrCat("cd ", ShellQuote(dir), " && exec /bin/sh -c ", ShellQuote(flags.program))},
      {{"TROUPE_CHAOS_ACTORS_LIST", list}, {"TMPDIR", dir + "/tmp"}}, dir + "/out.txt",
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::duration<double>(flags.timeout_s)));
  for (absl::string_view n : absl::StrSplit(Slurp(list), '\n', absl::SkipWhitespace())) {
    draw->actors.emplace_back(n);
  }
  if (draw->actors.empty()) {
    std::fprintf(stderr,
                 "troupe chaos actors: --actors not given and the program's runtime listed no "
                 "actor in a fault-free run (exit %d; %s/out.txt): give --actors\n",
                 c.exit_code, dir.c_str());
    return false;
  }
  std::printf("actors (from a fault-free run): %s\n", absl::StrJoin(draw->actors, ",").c_str());
  return true;
}

// Runs trial `t`; prints its line, shrinks it if it failed; its report entry (null: stopped).
json RunTrial(const Flags& flags, const Trials& trials, const Draw& draw, const std::string& report,
              int64_t t) {
  const std::vector<ActorFault> schedule = DrawSchedule(static_cast<uint64_t>(flags.seed), t, draw);
  const std::string dir = absl::StrCat(report, "/trial-", t);
  const Outcome o = trials.Execute(schedule, dir, t);
  if (o.interrupted || g_chaos_stop) return json();
  int64_t ok = 0;
  for (const json& f : o.fired) ok += f["result"] == "ok";
  std::printf("%-6lld %-64s %-8s %-7s %-5d %.1f\n", static_cast<long long>(t),
              Format(schedule).c_str(), o.Held() ? "held" : "FAILED",
              absl::StrCat(ok, "/", schedule.size()).c_str(), o.exit_code, o.seconds);
  json row = {{"trial", t},
              {"seed", flags.seed},
              {"schedule", Format(schedule)},
              {"faults", schedule.size()},
              {"outcome", o.Held() ? "held" : "failed"},
              {"exit_code", o.exit_code},
              {"fired", o.fired},
              {"seconds", o.seconds}};
  std::error_code ec;
  if (o.Held()) {
    fs::remove_all(dir, ec);  // its numbers are in the report
  } else {
    std::printf("       %s: %s\n", o.failure.c_str(), o.detail.c_str());
    row["failure"] = {{"kind", o.failure}, {"detail", o.detail}};
    row["dir"] = dir;
    int runs = 0;
    const std::vector<ActorFault> smallest = trials.Shrink(schedule, o, dir, t, &runs);
    row["shrunk"] =
        ShrunkEntry(runs, Format(smallest), smallest.size(), trials.Reproduce(smallest));
  }
  std::fflush(stdout);
  return row;
}

int RunActorChaos(const Flags& flags) {
  Draw draw;
  std::string report;
  if (!Prepare(flags, &draw, &report)) return 2;
  if (draw.actors.empty() && !DiscoverActors(flags, report, &draw)) return 2;
  std::printf(
      "troupe chaos actors: %s; actors %s; seed %lld, %s trials of 1..%lld faults (%s) within "
      "%lld ms; report in %s\n",
      flags.program.c_str(), absl::StrJoin(draw.actors, ",").c_str(),
      static_cast<long long>(flags.seed),
      flags.continuous ? "continuous" : std::to_string(flags.trials).c_str(),
      static_cast<long long>(flags.max_faults), flags.kinds.c_str(),
      static_cast<long long>(flags.window_ms), report.c_str());
  std::printf("%-6s %-64s %-8s %-7s %-5s %s\n", "trial", "schedule", "outcome", "fired", "exit",
              "seconds");
  std::fflush(stdout);
  json doc = {{"program", flags.program},       {"actors", draw.actors},
              {"kinds", json::array()},         {"seed", flags.seed},
              {"max_faults", flags.max_faults}, {"window_ms", flags.window_ms},
              {"max_for_ms", flags.max_for_ms}, {"invariant", flags.invariant}};
  for (ActorFault::Kind k : draw.kinds) doc["kinds"].push_back(runtime::ActorFaultKindName(k));
  const Trials trials(flags);
  return RunTrials(flags.continuous, flags.trials, report, std::move(doc),
                   [&](int64_t t) { return RunTrial(flags, trials, draw, report, t); });
}

}  // namespace

int RunChaosActors(const Args& args) {
  Flags flags;
  runtime::ConfigRegistry config;
  flags.Register(config);
  if (int rc = runtime::ParseCommandLine("chaos actors", kUsage, args, config); rc >= 0) return rc;
  CatchStopSignals();
  return RunActorChaos(flags);
}

}  // namespace troupe::tools
