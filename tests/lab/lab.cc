#include "lab.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "troupe/base/status_macros.h"

#ifndef TROUPE_LAB_SCRIPT
#error "TROUPE_LAB_SCRIPT must name scripts/lab"
#endif

namespace troupe::lab {
namespace {

// The namespaces a process joins to be "on" a host, in nsenter's order; mnt last, so /proc of
// the machine stays reachable while the others are opened.
constexpr const char* kNamespaces[] = {"ipc", "uts", "net", "pid", "mnt"};
constexpr int kForwarded[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};

volatile sig_atomic_t g_program = 0;  // in a proxy: the program it relays signals to

void ForwardSignal(int sig) {
  if (g_program > 0) kill(g_program, sig);
}

void RedirectStdio(int out_fd) {
  int null_fd = open("/dev/null", O_RDWR);
  if (null_fd >= 0) dup2(null_fd, 0);
  if (out_fd >= 0) {
    dup2(out_fd, 1);
    dup2(out_fd, 2);
  }
}

// In the forked child: the process in the machine's PID namespace that the caller holds. It
// joins the host's namespaces, forks the program (the PID namespace applies to children only),
// relays signals to it and exits as it did. Only async-signal-safe calls: the caller may have
// threads.
[[noreturn]] void RunProxy(pid_t parent, const int (&ns_fds)[5], const char* wd, char** argv,
                           int out_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  RedirectStdio(out_fd);
  for (int fd : ns_fds) {
    if (setns(fd, 0) != 0) {
      static const char msg[] = "lab: setns failed\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(126);
    }
  }
  if (chdir(wd) != 0 && chdir("/") != 0) _exit(126);
  pid_t program = fork();
  if (program < 0) _exit(126);
  if (program == 0) {
    // If the proxy dies (SIGKILL from the caller, or the caller itself died), so does this.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execvp(argv[0], argv);
    _exit(127);
  }
  g_program = program;
  struct sigaction sa = {};
  sa.sa_handler = ForwardSignal;
  for (int sig : kForwarded) sigaction(sig, &sa, nullptr);
  int status = 0;
  while (waitpid(program, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
  int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
  signal(sig, SIG_DFL);
  kill(getpid(), sig);
  _exit(128 + sig);
}

// Starts argv on `host` (nullptr: on this machine); out_fd < 0 keeps the caller's stdout.
absl::StatusOr<pid_t> Launch(const LabHost* host, const std::vector<std::string>& args,
                             int out_fd) {
  if (args.empty()) return absl::InvalidArgumentError("empty argv");
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int ns_fds[5] = {-1, -1, -1, -1, -1};
  auto close_all = [&] {
    for (int& fd : ns_fds) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  };
  if (host != nullptr) {
    for (int i = 0; i < 5; ++i) {
      std::string path = absl::StrCat("/proc/", host->init_pid, "/ns/", kNamespaces[i]);
      ns_fds[i] = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (ns_fds[i] < 0) {
        close_all();
        return absl::UnavailableError(absl::StrCat("host ", host->name, " is down: cannot open ",
                                                   path, ": ", strerror(errno)));
      }
    }
  }
  char wd_buf[4096];
  const char* wd = getcwd(wd_buf, sizeof wd_buf) ? wd_buf : "/";
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close_all();
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    if (host != nullptr) RunProxy(parent, ns_fds, wd, argv.data(), out_fd);
    RedirectStdio(out_fd);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  close_all();
  return pid;
}

// Runs `host`'s (or this machine's) argv to completion, collecting its output.
absl::StatusOr<ExecResult> RunAndCollect(const LabHost* host,
                                         const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  auto pid = Launch(host, argv, fds[1]);
  close(fds[1]);
  if (!pid.ok()) {
    close(fds[0]);
    return pid.status();
  }
  ExecResult r;
  char buf[4096];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof buf)) != 0) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    r.output.append(buf, static_cast<size_t>(got));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

absl::StatusOr<ExecResult> RunHere(const std::vector<std::string>& argv) {
  return RunAndCollect(nullptr, argv);
}

Lab::Lab(std::string name) : name_(std::move(name)) {}

Lab::~Lab() {
  if (!up_) return;
  absl::Status st = Down();
  if (!st.ok())
    fprintf(stderr, "Lab %s: teardown failed: %s\n", name_.c_str(), st.ToString().c_str());
}

std::string Lab::state_dir() const { return absl::StrCat("/run/troupe-lab/", name_); }

absl::Status Lab::Up(int n) {
  up_ = true;  // from here on the destructor tears down whatever part came up
  hosts_.clear();
  auto r = RunHere({TROUPE_LAB_SCRIPT, "up", std::to_string(n), "--name", name_});
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("scripts/lab up ", n, " --name ", name_, " failed (exit ", r->exit_code,
                     "); the lab needs root and network/PID/mount namespaces: ", r->output));
  }
  for (absl::string_view line :
       absl::StrSplit(ReadFile(state_dir() + "/hosts"), '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() != 3) return absl::InternalError(absl::StrCat("bad hosts line: ", line));
    hosts_.push_back(LabHost{f[0], f[1], static_cast<pid_t>(std::stol(f[2]))});
  }
  std::string shared = ReadFile(state_dir() + "/shared");
  shared_dir_ = shared.substr(0, shared.find('\n'));
  if (static_cast<int>(hosts_.size()) != n || shared_dir_.empty()) {
    return absl::InternalError(absl::StrCat("lab ", name_, " came up with ", hosts_.size(),
                                            " hosts of ", n, " (state in ", state_dir(), ")"));
  }
  return absl::OkStatus();
}

absl::Status Lab::Down() {
  auto r = RunHere({TROUPE_LAB_SCRIPT, "down", "--name", name_, "--no-wait"});
  // Reap what Spawn started and nobody waited for (every one of them is dead by now).
  for (pid_t pid : spawned_) {
    for (int i = 0; i < 100 && waitpid(pid, nullptr, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  spawned_.clear();
  hosts_.clear();
  up_ = false;
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::InternalError(absl::StrCat("scripts/lab down --name ", name_, ": ", r->output));
  }
  return absl::OkStatus();
}

const LabHost* Lab::Find(const std::string& host) const {
  for (const LabHost& h : hosts_)
    if (h.name == host) return &h;
  return nullptr;
}

absl::Status Lab::PullPlug(const std::string& host) {
  const LabHost* h = Find(host);
  if (!h) return absl::NotFoundError(absl::StrCat("no host ", host, " in lab ", name_));
  if (kill(h->init_pid, SIGKILL) != 0) {
    return absl::InternalError(
        absl::StrCat("kill of ", host, "'s init ", h->init_pid, ": ", std::strerror(errno)));
  }
  // The init is not our child: wait until it is gone or a zombie (its host is empty then).
  for (int i = 0; i < 500; ++i) {
    // read(2), not a stream: the init may be reaped between open and read, and the read then
    // fails with ESRCH, which libstdc++'s streambuf iterators throw as an exception.
    std::string text(4096, '\0');
    const int fd = open(absl::StrCat("/proc/", h->init_pid, "/stat").c_str(), O_RDONLY);
    const ssize_t n = fd < 0 ? -1 : read(fd, text.data(), text.size());
    if (fd >= 0) close(fd);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos || text.compare(paren + 1, 3, " Z ") == 0) {
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(host, "'s init outlived SIGKILL for 5 s"));
}

namespace {

absl::Status RunLabScript(const std::vector<std::string>& argv) {
  if (*TROUPE_LAB_BINARY) setenv("TROUPE_BINARY", TROUPE_LAB_BINARY, /*overwrite=*/0);
  // Ahead of the jobs under test (nice -10): a fault's timing is part of the test, and on a loaded
  // machine a script of a dozen short processes could otherwise hold a 1 s cut for seconds.
  std::vector<std::string> full = {"nice", "-n", "-10", TROUPE_LAB_SCRIPT};
  full.insert(full.end(), argv.begin(), argv.end());
  TROUPE_ASSIGN_OR_RETURN(auto r, RunHere(full));
  if (r.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat("scripts/lab ", absl::StrJoin(argv, " "), ": ", r.output));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Lab::Cut(const std::string& host, const std::string& direction,
                      const std::string& peer) {
  for (const std::string& h : {host, peer}) {
    if (!h.empty() && !Find(h)) {
      return absl::NotFoundError(absl::StrCat("no host ", h, " in lab ", name_));
    }
  }
  std::vector<std::string> argv = {"cut", host, direction};
  if (!peer.empty()) argv.insert(argv.end(), {"--peer", peer});
  return RunLabScript(argv);
}

absl::Status Lab::Shape(const std::string& host, double loss_percent, int rate_mbit,
                        const std::vector<std::string>& peers) {
  if (!Find(host)) return absl::NotFoundError(absl::StrCat("no host ", host, " in lab ", name_));
  if (loss_percent < 0 || loss_percent > 100 || rate_mbit < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shape %s: want loss in [0, 100] %% and rate >= 0 Mbit/s, got %g %% and %d",
                        host, loss_percent, rate_mbit));
  }
  std::vector<std::string> argv = {"shape", host};
  if (loss_percent > 0) argv.insert(argv.end(), {"--loss", absl::StrFormat("%g", loss_percent)});
  if (rate_mbit > 0) argv.insert(argv.end(), {"--rate", absl::StrCat(rate_mbit)});
  for (const std::string& p : peers) argv.insert(argv.end(), {"--peer", p});
  return RunLabScript(argv);
}

absl::Status Lab::Delay(const std::string& host, double ms, double jitter_ms,
                        const std::vector<std::string>& peers) {
  if (!Find(host)) return absl::NotFoundError(absl::StrCat("no host ", host, " in lab ", name_));
  if (ms < 0 || jitter_ms < 0 || jitter_ms > ms) {
    return absl::InvalidArgumentError(
        absl::StrFormat("delay %s: want 0 <= jitter <= delay, got delay %g ms and jitter %g ms",
                        host, ms, jitter_ms));
  }
  std::vector<std::string> argv = {"delay", host, absl::StrFormat("%g", ms), "--jitter",
                                   absl::StrFormat("%g", jitter_ms)};
  for (const std::string& p : peers) argv.insert(argv.end(), {"--peer", p});
  return RunLabScript(argv);
}

absl::Status Lab::Undelay(const std::string& host) {
  if (!Find(host)) return absl::NotFoundError(absl::StrCat("no host ", host, " in lab ", name_));
  return RunLabScript({"undelay", host});
}

absl::Status Lab::Unshape(const std::string& host) {
  if (!Find(host)) return absl::NotFoundError(absl::StrCat("no host ", host, " in lab ", name_));
  return RunLabScript({"unshape", host});
}

absl::StatusOr<ProbeResult> Lab::Probe(const std::string& from, const std::string& to, int count,
                                       int payload) {
  const std::string address = Address(to);
  if (address.empty()) return absl::NotFoundError(absl::StrCat("no host ", to, " in lab ", name_));
  if (count < 1 || payload < 16) {
    // Under 16 bytes an echo carries no timestamp and its reply line no round trip.
    return absl::InvalidArgumentError(
        absl::StrFormat("probe %s -> %s: want count >= 1 and payload >= 16, got %d and %d", from,
                        to, count, payload));
  }
  // An echo counts when its reply comes back before the deadline, however late: with `-c` alone,
  // ping stops listening 2 x the slowest round trip after its last echo, so a late reply (a vCPU
  // of this 2-vCPU VM stalled for ~50 ms under the suite, or the delay relay waiting on one)
  // read as a lost packet. With `-w`, ping sends on until `count` replies came or the deadline;
  // the echoes counted are the first `count` by sequence number (ping sends a few more where
  // some are lost: those are not counted). It also stops at the first ICMP error (an unreachable
  // host); a Cut drops silently, so none comes from the lab's rules.
  // Echoes of more than one packet go 40 ms apart, not 10. iputils sizes ping's receive buffer
  // for about two of them (a 60000-byte reply is 41 fragments, ~94 KB of buffer): a third reply
  // that arrives while ping is not reading is dropped. 10 ms apart on a 50 Mbit/s link with 10 ms
  // of delay each way (rtt ~38 ms), up to four are in flight, and a vCPU stalled under the suite
  // lost one of 20 (LabTest.ShapedAndCutLinksLoseSlowAndDropWhatTheyClaim). Shown by stopping
  // ping for 60 ms with five in flight: two replies lost, the socket's drop count 2. 40 ms apart,
  // no more than two are in flight on any round trip under 80 ms.
  const bool fragmented = payload > 1472;
  const int deadline_s = 3 + count / 50 + (fragmented ? count / 25 : 0);
  TROUPE_ASSIGN_OR_RETURN(
      ExecResult r,
      Exec(from, absl::StrCat("ping -n -c ", count, " -w ", deadline_s, " -i ",
                              fragmented ? "0.04" : "0.01", " -s ", payload, " ", address)));
  if (r.output.find(" packets transmitted, ") == std::string::npos) {
    return absl::InternalError(absl::StrCat("ping from ", from, " to ", to, ": ", r.output));
  }
  // One line per reply: "64 bytes from 10.77.1.2: icmp_seq=3 ttl=63 time=0.031 ms" (a duplicate
  // ends in "(DUP!)" and is not counted twice).
  std::vector<bool> replied(count + 1, false);
  ProbeResult p;
  p.sent = count;
  double rtt_sum = 0;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    const size_t seq_at = line.find("icmp_seq=");
    const size_t time_at = line.find(" time=");
    if (seq_at == absl::string_view::npos || time_at == absl::string_view::npos) continue;
    int seq = 0;
    double ms = 0;
    if (std::sscanf(std::string(line.substr(seq_at)).c_str(), "icmp_seq=%d", &seq) != 1 ||
        std::sscanf(std::string(line.substr(time_at)).c_str(), " time=%lf", &ms) != 1 || seq < 1 ||
        seq > count || replied[seq]) {
      continue;
    }
    replied[seq] = true;
    ++p.received;
    rtt_sum += ms;
  }
  p.loss = 1.0 - static_cast<double>(p.received) / p.sent;
  p.rtt_ms = p.received > 0 ? rtt_sum / p.received : 0;
  return p;
}

std::string ProbeResult::Describe() const {
  return absl::StrFormat("rtt %.3f ms, loss %.1f%% (%d of %d)", rtt_ms, 100 * loss, sent - received,
                         sent);
}

absl::Status Lab::Heal(const std::string& host) {
  if (!Find(host)) return absl::NotFoundError(absl::StrCat("no host ", host, " in lab ", name_));
  return RunLabScript({"heal", host});
}

std::string Lab::Address(const std::string& host) const {
  const LabHost* h = Find(host);
  return h ? h->address : std::string();
}

absl::StatusOr<ExecResult> Lab::Exec(const std::string& host, const std::string& cmd) {
  const LabHost* h = Find(host);
  if (!h) return absl::NotFoundError(absl::StrCat("no host ", host, " in lab ", name_));
  return RunAndCollect(h, {"sh", "-c", cmd});
}

absl::StatusOr<pid_t> Lab::Spawn(const std::string& host, const std::vector<std::string>& argv) {
  const LabHost* h = Find(host);
  if (!h) return absl::NotFoundError(absl::StrCat("no host ", host, " in lab ", name_));
  auto pid = Launch(h, argv, -1);
  if (pid.ok()) spawned_.push_back(*pid);
  return pid;
}

}  // namespace troupe::lab
