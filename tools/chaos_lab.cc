#include "chaos_lab.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace troupe::tools {

namespace fs = std::filesystem;

std::atomic<bool> g_chaos_stop{false};

void CatchStopSignals() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_chaos_stop = true; };
  sa.sa_flags = SA_RESETHAND;  // a second Ctrl-C ends the runner at once
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int RunTrials(bool continuous, int64_t trials, const std::string& report, nlohmann::json doc,
              const std::function<nlohmann::json(int64_t)>& trial) {
  using json = nlohmann::json;
  int failed = 0;
  doc["trials"] = json::array();
  const auto started = std::chrono::steady_clock::now();
  for (int64_t t = 0; (continuous || t < trials) && !g_chaos_stop; ++t) {
    json row = trial(t);
    if (row.is_null()) break;  // interrupted
    failed += row["outcome"] == "failed";
    std::ofstream(report + "/trials.jsonl", std::ios::app)
        << row.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    doc["trials"].push_back(std::move(row));
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  doc["failed"] = failed;
  doc["seconds"] = wall;
  std::ofstream(report + "/report.json")
      << doc.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  std::printf("summary: trials=%zu failed=%d wall_s=%.0f report=%s/report.json\n",
              doc["trials"].size(), failed, wall, report.c_str());
  return failed == 0 ? 0 : 1;
}

nlohmann::json ShrunkEntry(int runs, const std::string& schedule, size_t faults,
                           const std::string& command) {
  std::printf("       shrunk in %d runs to %s%s; reproduce with:\n       %s\n", runs,
              schedule.c_str(), faults == 0 ? " (it fails without any fault)" : "",
              command.c_str());
  return {{"schedule", schedule}, {"faults", faults}, {"runs", runs}, {"command", command}};
}

std::map<std::string, std::string> TrialEnvironment(const std::string& dir, bool clock_steps,
                                                    bool own_tmp) {
  std::map<std::string, std::string> env = {{kTrialMarker, dir}};
  if (own_tmp) env["TMPDIR"] = dir + "/tmp";
  if (clock_steps) env["TROUPE_CLOCK_STEP_DIR"] = dir + "/clocks";
  return env;
}

Child RunChild(std::vector<std::string> argv, const std::map<std::string, std::string>& env,
               const std::string& out_path, std::chrono::nanoseconds timeout, bool finish) {
  // Everything the child needs is built before fork: it only calls async-signal-safe functions.
  std::map<std::string, std::string> all;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) all[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : env) all[k] = v;
  std::vector<std::string> env_s;
  for (const auto& [k, v] : all) env_s.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  for (std::string& a : argv) args.push_back(a.data());
  for (std::string& e : env_s) envp.push_back(e.data());
  args.push_back(nullptr);
  envp.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  Child c;
  const pid_t pid = fork();
  if (pid < 0) return c;
  if (pid == 0) {
    setpgid(0, 0);
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out >= 0) dup2(out, 1), dup2(out, 2), close(out);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also here: no race with the kill below
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0) {
    const bool late = std::chrono::steady_clock::now() - start > timeout;
    if (late || (g_chaos_stop && !finish)) {
      kill(-pid, SIGTERM);
      for (int i = 0; i < 100 && (done = waitpid(pid, &status, WNOHANG)) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      kill(-pid, SIGKILL);
      if (done == 0) waitpid(pid, &status, 0);
      c.exit_code = late ? Child::kTimedOut : Child::kInterrupted;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (c.exit_code == Child::kNotStarted && done == pid) {
    c.exit_code = WIFEXITED(status)     ? WEXITSTATUS(status)
                  : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                        : Child::kNotStarted;
  }
  return c;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string LastLine(const std::string& path) {
  std::istringstream in(Slurp(path));
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  size_t cut = std::min<size_t>(last.size(), 200);
  while (cut > 0 && cut < last.size() && (static_cast<unsigned char>(last[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return last.substr(0, cut);
}

std::vector<pid_t> MarkedProcesses(const std::string& marker) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    int pid = 0;
    if (!absl::SimpleAtoi(name, &pid) || pid == getpid()) continue;
    const std::string env = Slurp(e.path().string() + "/environ");
    for (size_t at = 0; at < env.size();) {
      const size_t end = std::min(env.find('\0', at), env.size());
      if (env.compare(at, end - at, marker) == 0) {
        out.push_back(pid);
        break;
      }
      at = end + 1;
    }
  }
  return out;
}

namespace {

int64_t Lines(const std::string& path) {
  const std::string text = Slurp(path);
  return std::count(text.begin(), text.end(), '\n');
}

// `text` matched literally by an extended regular expression (pkill -f).
std::string RegexLiteral(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\.^$|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// A command line for `sh -c`, every word single-quoted.
std::string ShellWords(const std::vector<std::string>& argv) {
  std::vector<std::string> q;
  for (const std::string& a : argv)
    q.push_back("'" + absl::StrReplaceAll(a, {{"'", "'\\''"}}) + "'");
  return absl::StrJoin(q, " ");
}

}  // namespace

ChaosLab::ChaosLab(std::string script, std::string troupe, int workers)
    : script_(std::move(script)), troupe_(std::move(troupe)), workers_(workers) {
  // "trlab" and 4 of [a-z0-9] (scripts/lab's rule): "c" and three from this runner's pid, so two
  // runners (a test and a person's soak) never share a lab.
  constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  unsigned v = static_cast<unsigned>(getpid()) % (36 * 36 * 36);
  name_ = "trlabc";
  for (int i = 0; i < 3; ++i, v /= 36) name_ += kDigits[v % 36];
}

std::string ChaosLab::FindScript(const std::string& troupe) {
  std::error_code ec;
  if (const char* env = std::getenv("TROUPE_LAB_SCRIPT"); env != nullptr && *env != '\0') {
    return fs::exists(env, ec) ? env : "";
  }
  // <tree>/<build dir>/tools/troupe -> <tree>/scripts/lab
  const fs::path tree = fs::path(troupe).parent_path().parent_path().parent_path();
  const fs::path script = tree / "scripts" / "lab";
  return fs::exists(script, ec) ? script.string() : "";
}

std::string ChaosLab::Host(int i) const { return absl::StrCat(name_, "-h", i); }

int ChaosLab::Run(const std::vector<std::string>& argv, std::string* output) const {
  char path[] = "/tmp/troupe-chaos-lab-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return Child::kNotStarted;
  close(fd);
  const Child c = RunChild(argv, env_, path, std::chrono::seconds(30), /*finish=*/true);
  if (output != nullptr) *output = Slurp(path);
  unlink(path);
  return c.exit_code;
}

absl::Status ChaosLab::Up(const std::map<std::string, std::string>& env) {
  env_ = env;
  std::string out;
  const int hosts = workers_ + 1;
  if (Run({script_, "up", std::to_string(hosts), "--name", name_}, &out) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("`", script_, " up ", hosts, "` failed: ", absl::StripAsciiWhitespace(out)));
  }
  shared_ = std::string(
      absl::StripAsciiWhitespace(Slurp(absl::StrCat("/run/troupe-lab/", name_, "/shared"))));
  std::string address;
  Run({script_, "hosts", "--name", name_}, &out);
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() >= 2 && f[0] == Host(hosts)) address = f[1];
  }
  if (shared_.empty() || address.empty()) {
    return absl::InternalError(
        absl::StrCat("the lab ", name_, " has no shared directory or no ", Host(hosts), ": ", out));
  }
  head_ = address + ":7000";
  fs::create_directories(shared_ + "/logs");
  auto background = [&](const std::string& host, const std::vector<std::string>& argv,
                        const std::string& log) {
    return Run({script_, "exec", host, "/bin/sh", "-c",
                absl::StrCat("exec ", ShellWords(argv), " >", ShellWords({log}), " 2>&1 &")},
               nullptr) == 0;
  };
  bool ok = background(Host(hosts), HeadArgv(), shared_ + "/logs/head.txt");
  for (int i = 1; i <= workers_ && ok; ++i) {
    ok = background(Host(i),
                    // Spot machines of a (simulated) cloud: spot-notice flips their endpoint.
                    {troupe_, "node", "--head", head_, "--name", Host(i), "--workers", "1",
                     "--log_dir", shared_ + "/logs", "--preemption_source", "aws",
                     "--metadata_endpoint", "simulate", "--preemption_poll", "500ms"},
                    absl::StrCat(shared_, "/logs/node-", Host(i), ".txt"));
  }
  if (!ok || Run(OnHeadHost({troupe_, "status", "--head", head_, "--wait_workers",
                             std::to_string(workers_), "--timeout", "20s"}),
                 &out) != 0) {
    return absl::UnavailableError(
        absl::StrCat("the lab's cluster did not form: ", absl::StripAsciiWhitespace(out),
                     " (logs in ", shared_, "/logs)"));
  }
  return absl::OkStatus();
}

std::vector<std::string> ChaosLab::OnHeadHost(const std::vector<std::string>& argv) const {
  std::vector<std::string> full = {script_, "exec", Host(workers_ + 1)};
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

absl::Status ChaosLab::WorkersIdle(std::chrono::milliseconds within) const {
  const auto until = std::chrono::steady_clock::now() + within;
  std::string busy;
  do {
    std::string out;
    if (Run(OnHeadHost({troupe_, "status", "--head", head_}), &out) != 0) {
      busy = "`troupe status` failed: " + out;
    } else {
      busy.clear();
      for (absl::string_view line : absl::StrSplit(out, '\n')) {
        if (absl::StartsWith(line, "  worker ") && absl::StrContains(line, " alive ") &&
            !absl::EndsWith(line, " actors=-")) {
          absl::StrAppend(&busy, busy.empty() ? "" : "; ", absl::StripAsciiWhitespace(line));
        }
      }
    }
    if (busy.empty()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (std::chrono::steady_clock::now() < until);
  return absl::FailedPreconditionError("workers still busy after the job: " + busy);
}

absl::Status ChaosLab::HostTmpEmpty() const {
  // A checkout under /tmp is bound back into each host's own /tmp by scripts/lab (a clone anywhere
  // must work): its first directory there is the lab's, not a leftover.
  std::error_code ec;
  const fs::path checkout = fs::canonical(script_, ec).parent_path().parent_path();
  const fs::path under_tmp = checkout.lexically_relative("/tmp");
  const std::string lab_own =
      !ec && !under_tmp.empty() && *under_tmp.begin() != ".." ? under_tmp.begin()->string() : "";
  std::vector<std::string> left;
  for (int i = 1; i <= workers_ + 1; ++i) {
    std::string out;
    if (Run({script_, "exec", Host(i), "/bin/ls", "-A", "/tmp"}, &out) != 0) {
      return absl::UnavailableError(absl::StrCat("cannot list ", Host(i), ":/tmp: ", out));
    }
    for (absl::string_view f : absl::StrSplit(out, '\n', absl::SkipWhitespace())) {
      if (f != lab_own) left.push_back(absl::StrCat(Host(i), ":/tmp/", f));
    }
  }
  if (left.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError("temporary files left on the hosts: " +
                                       absl::StrJoin(left, " "));
}

std::vector<std::string> ChaosLab::HeadArgv() const {
  const std::string address = head_.substr(0, head_.rfind(':'));
  return {troupe_, "head", "--host", address, "--port", "7000", "--store", shared_ + "/head.db"};
}

absl::Status ChaosLab::SignalHead(const char* signal, std::string* out) const {
  // The head's process, found by its command line on its own host (the driver runs there too).
  return Run(OnHeadHost({"/usr/bin/pkill", signal, "-f",
                         absl::StrCat("^", RegexLiteral(troupe_), " head ")}),
             out) == 0
             ? absl::OkStatus()
             : absl::NotFoundError(absl::StrCat("pkill ", signal, " of the head: ", *out));
}

absl::Status ChaosLab::KillHead() {
  std::string out;
  if (absl::Status s = SignalHead("-KILL", &out); !s.ok()) return s;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Run({script_, "exec", Host(workers_ + 1), "/bin/sh", "-c",
       absl::StrCat("exec ", ShellWords(HeadArgv()), " >>",
                    ShellWords({shared_ + "/logs/head.txt"}), " 2>&1 &")},
      &out);
  // `troupe status` tries once: asked again until the new head listens, for 10 s at most.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Run(OnHeadHost({troupe_, "status", "--head", head_}), &out) != 0) {
    if (std::chrono::steady_clock::now() > until) {
      return absl::UnavailableError("the head did not come back within 10 s: " + out);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return absl::OkStatus();
}

absl::Status ChaosLab::StopHead(std::chrono::milliseconds stop_for) {
  std::string out;
  if (absl::Status s = SignalHead("-STOP", &out); !s.ok()) return s;
  std::this_thread::sleep_for(stop_for);
  return SignalHead("-CONT", &out);
}

HeadFaults::HeadFaults(ChaosLab* lab, std::vector<At> faults, std::string commits_log,
                       std::chrono::milliseconds stop_for)
    : lab_(lab),
      faults_(std::move(faults)),
      commits_log_(std::move(commits_log)),
      stop_for_(stop_for) {
  if (!faults_.empty()) thread_ = std::thread([this] { Run(); });
}

void HeadFaults::Join() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void HeadFaults::Run() {
  for (const At& f : faults_) {
    int64_t commits = 0;
    while ((commits = Lines(commits_log_)) < f.step && !stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (stop_) {  // the job is over: a fault now would change nothing it is judged on
      done_.push_back(absl::StrCat(f.kill ? "kill-head" : "stop-head", "@", f.step,
                                   ": not carried out, the job ended first"));
      continue;
    }
    const absl::Status s = f.kill ? lab_->KillHead() : lab_->StopHead(stop_for_);
    failed_ |= !s.ok();
    done_.push_back(absl::StrCat(f.kill ? "kill-head" : "stop-head", " after commit ", commits,
                                 ": ", s.ok() ? "done" : std::string(s.message())));
  }
}

absl::Status ChaosLab::Down() {
  std::string out;
  if (Run({script_, "down", "--name", name_}, &out) != 0) {
    return absl::InternalError(
        absl::StrCat("`", script_, " down` found things left: ", absl::StripAsciiWhitespace(out)));
  }
  return absl::OkStatus();
}

}  // namespace troupe::tools
