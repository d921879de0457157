#include "internal/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace troupe::runtime::internal {

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

absl::StatusOr<pid_t> StartProcess(const ProcessSpec& spec) {
  std::string path = spec.path.empty() ? SelfExe() : spec.path;
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> argv_s = {path};
  argv_s.insert(argv_s.end(), spec.args.begin(), spec.args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::map<std::string, std::string> env_map;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env_map[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : spec.env) env_map[k] = v;
  std::vector<std::string> env_s;
  for (const auto& [k, v] : env_map) env_s.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  int out_fd = -1, err_fd = -1;
  auto open_log = [&spec](const std::string& p) {
    return p.empty()
               ? -1
               : ::open(p.c_str(),
                        O_WRONLY | O_CREAT | (spec.append ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0644);
  };
  out_fd = open_log(spec.stdout_path);
  err_fd = open_log(spec.stderr_path);
  if ((!spec.stdout_path.empty() && out_fd < 0) || (!spec.stderr_path.empty() && err_fd < 0)) {
    if (out_fd >= 0) ::close(out_fd);
    if (err_fd >= 0) ::close(err_fd);
    return absl::UnavailableError(absl::StrCat("cannot open log files ", spec.stdout_path, ", ",
                                               spec.stderr_path, ": ", std::strerror(errno)));
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    if (spec.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    }
    if (out_fd >= 0) dup2(out_fd, 1);
    if (err_fd >= 0) dup2(err_fd, 2);
    execve(path.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  if (out_fd >= 0) ::close(out_fd);
  if (err_fd >= 0) ::close(err_fd);
  return pid;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("wait status ", status);
}

std::string TailFile(const std::string& path, int lines) {
  std::ifstream in(path);
  if (!in) return "";
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) absl::StrAppend(&out, l, "\n");
  return out;
}

namespace {

// A "SigPnd:" / "ShdPnd:" line of /proc/<pid>/task/<tid>/status holds SIGKILL.
bool KillPending(const std::string& line) {
  for (const char* key : {"SigPnd:", "ShdPnd:"}) {
    if (line.rfind(key, 0) != 0) continue;
    uint64_t mask = std::strtoull(line.c_str() + std::strlen(key), nullptr, 16);
    return (mask >> (SIGKILL - 1)) & 1;
  }
  return false;
}

// The task's flags (field 9 of its stat) hold PF_EXITING, or its state is Z or X.
bool TaskExiting(const std::string& stat_path) {
  std::ifstream in(stat_path);
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return false;
  std::istringstream fields(stat.substr(paren + 1));
  std::string state, field;
  fields >> state;
  for (int i = 4; i < 9; ++i) fields >> field;  // ppid pgrp session tty_nr tpgid
  unsigned long flags = 0;                      // NOLINT(runtime/int): the kernel's type
  fields >> flags;
  constexpr unsigned long kPfExiting = 0x4;  // NOLINT(runtime/int)
  return state == "Z" || state == "X" || (flags & kPfExiting) != 0;
}

}  // namespace

bool AlreadyDying(pid_t pid) {
  const std::string task_dir = absl::StrCat("/proc/", pid, "/task");
  DIR* dir = opendir(task_dir.c_str());
  if (dir == nullptr) return false;
  // A group exit puts SIGKILL on every thread still running; the thread that began it, and one
  // that has finished, is exiting. A leader that left by pthread_exit alone is exiting too, so
  // "every thread exiting" — not "one" — is the other sign.
  bool kill_pending = false, all_exiting = true, any = false;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string task = absl::StrCat(task_dir, "/", entry->d_name);
    std::ifstream status(task + "/status");
    for (std::string line; !kill_pending && std::getline(status, line);)
      kill_pending = KillPending(line);
    all_exiting = all_exiting && TaskExiting(task + "/stat");
    any = true;
  }
  closedir(dir);
  return kill_pending || (any && all_exiting);
}

namespace {

// Runs argv[0] with argv and waits for it; its exit code, 128 + N for signal N, -1 if it could not
// start. Only async-signal-safe calls: it runs in a child forked from a threaded process.
int RunAndWait(char* const argv[]) {
  const pid_t pid = fork();
  if (pid == 0) {
    execv(argv[0], argv);
    _exit(127);
  }
  if (pid < 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// argv for execv: pointers into `args`, which must outlive it.
std::vector<char*> Argv(std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

// Starts `troupe relay` (argv `relay`) with a pipe on fd 4 it writes a byte to once its queue is
// bound; its pid once that byte came (within 10 s), or -1 (it is killed then).
pid_t StartRelay(std::vector<char*>& relay) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(ready[1], 4);
    close_range(5, ~0U, 0);
    close(3);
    execv(relay[0], relay.data());
    _exit(127);
  }
  close(ready[1]);
  char byte = 0;
  pollfd p{ready[0], POLLIN, 0};
  const bool bound = pid > 0 && poll(&p, 1, 10000) == 1 && read(ready[0], &byte, 1) == 1;
  close(ready[0]);
  if (bound) return pid;
  if (pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  return -1;
}

// Sleeps `ms` (async-signal-safe).
void SleepMs(int64_t ms) {
  timespec left{static_cast<time_t>(ms / 1000), static_cast<long>((ms % 1000) * 1000000)};
  while (nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
}

int64_t MonotonicMs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
}

// The network fault's helper, in a grandchild of the agent (after fork, setsid, fork): starts the
// relay (a delay only), adds the rules, writes the first failure's index (add.size() for the
// relay; -1 for none) to `report`, waits out the fault (the relay runs for it; a flap takes the
// rules out and puts them back every `period_ms`), removes them.
[[noreturn]] void NetworkFaultHelper(std::vector<std::vector<char*>>& add,
                                     std::vector<std::vector<char*>>& remove,
                                     std::vector<char*>& relay, int report, int64_t duration_ms,
                                     int64_t period_ms) {
  dup2(report, 3);  // the report pipe on fd 3; every other descriptor of the agent closed
  close_range(4, ~0U, 0);
  int failed = -1;
  pid_t relay_pid = -1;
  if (!relay.empty() && (relay_pid = StartRelay(relay)) < 0) failed = static_cast<int>(add.size());
  for (size_t i = 0; i < add.size() && failed < 0; ++i) {
    if (RunAndWait(add[i].data()) != 0) failed = static_cast<int>(i);
  }
  [[maybe_unused]] ssize_t n = write(3, &failed, sizeof failed);
  close(3);
  const int64_t end = MonotonicMs() + duration_ms;
  bool in = true;  // the rules are in place
  if (failed < 0 && relay_pid > 0) {
    while (waitpid(relay_pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  } else if (failed < 0 && period_ms > 0) {
    for (;;) {
      const int64_t left = end - MonotonicMs();
      if (left <= 0) break;
      SleepMs(left < period_ms ? left : period_ms);
      if (MonotonicMs() >= end) break;
      for (auto& argv : in ? remove : add) RunAndWait(argv.data());
      in = !in;
    }
  } else if (failed < 0) {
    SleepMs(duration_ms);
  } else if (relay_pid > 0) {
    kill(relay_pid, SIGTERM);
    waitpid(relay_pid, nullptr, 0);
  }
  // Every rule out, however the flaps went (a failed command may have left a copy in or out): each
  // deleted until iptables finds none.
  for (size_t i = 0; i < remove.size() && (in || period_ms > 0); ++i) {
    for (int tries = 0; tries < 8 && RunAndWait(remove[i].data()) == 0; ++tries) {
    }
  }
  _exit(failed < 0 ? 0 : 1);
}

// What the fault's iptables rules match beyond the interface, and do.
std::vector<std::string> FaultRuleTail(const NodeFault& f) {
  std::vector<std::string> tail;
  if (f.kind == NodeFaultKind::kDrop) {
    tail = {"-m",     "statistic",     "--mode",
            "random", "--probability", absl::StrCat(f.drop_percent / 100.0)};
  }
  tail.insert(tail.end(), {"-m", "comment", "--comment", "troupe-chaos", "-j"});
  if (f.kind == NodeFaultKind::kDelay) {
    // A packet the relay is not there for passes (--queue-bypass): never a partition by accident.
    tail.insert(tail.end(),
                {"NFQUEUE", "--queue-num", std::to_string(kChaosDelayQueue), "--queue-bypass"});
  } else {
    tail.push_back("DROP");
  }
  return tail;
}

}  // namespace

absl::Status StartNetworkFault(const NodeFault& f) {
  std::string iptables;
  for (const char* p : {"/usr/sbin/iptables", "/sbin/iptables", "/usr/bin/iptables"}) {
    if (access(p, X_OK) == 0) iptables = p;
  }
  if (iptables.empty()) {
    return absl::FailedPreconditionError("network fault: iptables not found (Debian's iptables)");
  }
  // Everything the helper needs is built here: after fork it may only make system calls.
  std::vector<std::vector<std::string>> add_args, remove_args;
  for (const char* chain : {"INPUT", "OUTPUT"}) {
    if (f.kind == NodeFaultKind::kOneWay && chain[0] == 'I') continue;  // what it sends, only
    std::vector<std::string> rule = {"!", chain[0] == 'I' ? "-i" : "-o", "lo"};
    for (std::string& word : FaultRuleTail(f)) rule.push_back(std::move(word));
    add_args.push_back({iptables, "-w", "-I", chain, "1"});
    add_args.back().insert(add_args.back().end(), rule.begin(), rule.end());
    remove_args.push_back({iptables, "-w", "-D", chain});
    remove_args.back().insert(remove_args.back().end(), rule.begin(), rule.end());
  }
  std::vector<std::string> relay_args;
  if (f.kind == NodeFaultKind::kDelay) {
    relay_args = {SelfExe(),    "relay",
                  "--queue",    std::to_string(kChaosDelayQueue),
                  "--delay",    absl::StrCat(f.delay_us, "us"),
                  "--jitter",   absl::StrCat(f.jitter_us, "us"),
                  "--run_for",  absl::StrCat(f.duration_ms, "ms"),
                  "--ready_fd", "4"};
  }
  std::vector<std::vector<char*>> add, remove;
  for (auto& a : add_args) add.push_back(Argv(a));
  for (auto& a : remove_args) remove.push_back(Argv(a));
  std::vector<char*> relay;
  if (!relay_args.empty()) relay = Argv(relay_args);
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("network fault: pipe: ", std::strerror(errno)));
  }
  const pid_t child = fork();
  if (child == 0) {
    setsid();
    if (fork() == 0) {
      NetworkFaultHelper(add, remove, relay, report[1], f.duration_ms,
                         f.kind == NodeFaultKind::kFlap ? std::max<int64_t>(1, f.period_ms) : 0);
    }
    _exit(0);
  }
  close(report[1]);
  if (child > 0) waitpid(child, nullptr, 0);  // may have been reaped by the agent's reaper: fine
  int failed = -2;
  pollfd pfd{report[0], POLLIN, 0};
  if (child > 0 && poll(&pfd, 1, 30000) == 1 && read(report[0], &failed, sizeof failed) != 4) {
    failed = -2;
  }
  close(report[0]);
  if (failed == -1) return absl::OkStatus();
  std::string what = "its helper process did not start";
  if (failed >= 0 && failed < static_cast<int>(add_args.size())) {
    what = absl::StrCat("`", absl::StrJoin(add_args[failed], " "), "` failed");
  } else if (failed >= 0) {
    what = absl::StrCat("`", absl::StrJoin(relay_args, " "), "` did not bind its queue");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "network fault: ", what, " (it needs CAP_NET_ADMIN in this host's network namespace)"));
}

}  // namespace troupe::runtime::internal
