// chaos_lab.h — what `troupe chaos run` needs beyond the job: its child processes, and for --lab N
// a cluster on the lab's hosts (scripts/lab: each host its own network, PID, mount and UTS
// namespace on this machine), so that the network faults have links to act on.
//
//   ChaosLab lab(script, self, /*workers=*/4);   // hosts trlabcXYZ-h1..h5; the head on h5
//   if (absl::Status s = lab.Up(marker_env); !s.ok()) ...   // a node agent with one worker on
//                                                            // each of h1..h4, all joined
//   RunChild(lab.OnHeadHost({self, "train", "--head", lab.head(), ...}), env, out, timeout);
//   lab.WorkersIdle(...); lab.HostTmpEmpty(); lab.Down();   // each a leftover check
#ifndef TROUPE_TOOLS_CHAOS_LAB_H_
#define TROUPE_TOOLS_CHAOS_LAB_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace troupe::tools {

// Set by the runner's SIGINT/SIGTERM handler: a running child is stopped (its process group).
extern std::atomic<bool> g_chaos_stop;
// Installs that handler; a second signal ends the runner at once.
void CatchStopSignals();

// Runs trials 0, 1, ... through `trial` (its row; null once interrupted): all `trials`, or
// until stopped when `continuous`. Each row goes to <report>/trials.jsonl as its trial ends (a
// soak stopped hard keeps every finished trial), then `doc` with the rows ("trials"), the count
// whose "outcome" is "failed" and the wall time to <report>/report.json, then the summary line.
// 0 when no trial failed, else 1.
int RunTrials(bool continuous, int64_t trials, const std::string& report, nlohmann::json doc,
              const std::function<nlohmann::json(int64_t)>& trial);
// A failed trial's shrunk schedule: printed with the command that reproduces it, and its row's
// "shrunk" entry.
nlohmann::json ShrunkEntry(int runs, const std::string& schedule, size_t faults,
                           const std::string& command);

// A child process's end: its exit status, or kTimedOut / kInterrupted / kNotStarted.
struct Child {
  static constexpr int kTimedOut = -1, kInterrupted = -2, kNotStarted = -3;
  int exit_code = kNotStarted;
  double seconds = 0;
};

// Runs `argv` (argv[0] a path) with `env` added to this process's environment, in a process
// group of its own (a terminal's Ctrl-C reaches the runner only), stdout and stderr to
// `out_path`; killed (its group: TERM, then KILL) after `timeout`, or once g_chaos_stop is set
// unless `finish` (a clean-up that must run to its end, as removing a lab).
// The environment variable that marks every process of one trial (the driver, and through it
// the head, node agents and workers, which inherit it): its value is the trial's directory.
inline constexpr char kTrialMarker[] = "TROUPE_CHAOS_TRIAL";

// What a trial's processes inherit: the marker, a TMPDIR of its own (`own_tmp`: one machine),
// and with `clock_steps` where clock-step's offsets go (node agents then preload
// libtroupe_clock_step.so into their workers: runtime/node.cc).
std::map<std::string, std::string> TrialEnvironment(const std::string& dir, bool clock_steps,
                                                    bool own_tmp);

Child RunChild(std::vector<std::string> argv, const std::map<std::string, std::string>& env,
               const std::string& out_path, std::chrono::nanoseconds timeout, bool finish = false);

// A file's text ("" when it cannot be read).
std::string Slurp(const std::string& path);

// The last non-empty line of a file, at most 200 bytes (not cut inside a UTF-8 character).
std::string LastLine(const std::string& path);

// Live processes other than this one whose environment carries `marker` ("NAME=VALUE") exactly.
std::vector<pid_t> MarkedProcesses(const std::string& marker);

// A cluster on a fresh lab, for one trial: made by Up, removed by Down.
class ChaosLab {
 public:
  // `script`: scripts/lab; `troupe`: this binary; `workers`: worker hosts (the head gets one more).
  ChaosLab(std::string script, std::string troupe, int workers);

  // scripts/lab: $TROUPE_LAB_SCRIPT, else scripts/lab of the source tree this binary was built in
  // (<tree>/build*/tools/troupe); "" when neither exists.
  static std::string FindScript(const std::string& troupe);

  // Starts the lab (a stale one of its name removed first), a head on the last host and a node
  // agent with one worker on each other, every process with `env`; returns once every worker
  // has joined. The lab's shared directory is empty.
  absl::Status Up(const std::map<std::string, std::string>& env);
  // The lab's hosts and namespaces removed; an error names what was left (a leftover).
  absl::Status Down();

  // argv run on the head's host (scripts/lab exec).
  std::vector<std::string> OnHeadHost(const std::vector<std::string>& argv) const;
  // Every alive worker hosts no actor (`troupe status`), within `within` of the job's end.
  absl::Status WorkersIdle(std::chrono::milliseconds within) const;
  // No host has a file left in its /tmp.
  absl::Status HostTmpEmpty() const;
  // The head killed (-9) and started again from its store (on the shared directory) 0.3 s later,
  // as systemd would; or stopped (SIGSTOP) for `stop_for`, then continued.
  absl::Status KillHead();
  absl::Status StopHead(std::chrono::milliseconds stop_for);

  const std::string& name() const { return name_; }      // "trlabc" and three of [a-z0-9]
  const std::string& head() const { return head_; }      // "ADDRESS:PORT"
  const std::string& shared() const { return shared_; }  // the same path on every host and here

 private:
  // Runs `argv` here and waits (30 s at most; a Ctrl-C does not cut it short: the lab is made and
  // removed whole); its exit code and output.
  int Run(const std::vector<std::string>& argv, std::string* output) const;
  std::string Host(int i) const;  // i in 1..workers+1

  std::vector<std::string> HeadArgv() const;
  // pkill `signal` ("-KILL", ...) of the head's process on its host; `out` is pkill's output.
  absl::Status SignalHead(const char* signal, std::string* out) const;

  std::string script_, troupe_, name_, head_, shared_;
  int workers_;
  std::map<std::string, std::string> env_;
};

// Carries out the head's faults, each once `step` commits are recorded (lines in `commits_log`;
// a step committed again after a rollback counts again), from a thread of its own; stops
// (joins) when destroyed.
class HeadFaults {
 public:
  struct At {
    int64_t step = 0;
    bool kill = true;  // else a stop
  };
  HeadFaults(ChaosLab* lab, std::vector<At> faults, std::string commits_log,
             std::chrono::milliseconds stop_for);
  ~HeadFaults() { Join(); }
  void Join();  // the faults not carried out yet never will be (the job is over)
  bool failed() const { return failed_; }  // a fault could not be carried out
  HeadFaults(const HeadFaults&) = delete;
  HeadFaults& operator=(const HeadFaults&) = delete;
  // What was done: "kill-head after commit 12: ok", one line each (after the destructor's join).
  const std::vector<std::string>& done() const { return done_; }

 private:
  void Run();

  ChaosLab* lab_;
  std::vector<At> faults_;
  std::string commits_log_;
  std::chrono::milliseconds stop_for_;
  std::atomic<bool> stop_{false};
  std::vector<std::string> done_;
  bool failed_ = false;
  std::thread thread_;
};

}  // namespace troupe::tools

#endif  // TROUPE_TOOLS_CHAOS_LAB_H_
