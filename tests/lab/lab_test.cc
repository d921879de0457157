// The lab's promise: its hosts share the network (through the router) and the shared
// directory, and nothing else a process could use to notice a neighbour on the same machine;
// and Down() leaves no namespace, link, mount or process behind. Needs root, as CI has; when
// namespaces cannot be made the test fails with the reason (a skipped test counts as failed).
#include "lab.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace troupe::lab {
namespace {

// Runs cmd on `host`, failing the test unless it exits 0; returns its output.
std::string MustExec(Lab& lab, const std::string& host, const std::string& cmd) {
  auto r = lab.Exec(host, cmd);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return "";
  EXPECT_EQ(r->exit_code, 0) << host << ": " << cmd << ":\n" << r->output;
  return r->output;
}

int ExitCode(Lab& lab, const std::string& host, const std::string& cmd) {
  auto r = lab.Exec(host, cmd);
  return r.ok() ? r->exit_code : -1;
}

ino_t Inode(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Pids of this machine whose namespace `kind` (net, pid, ...) is one of `inodes`.
std::vector<std::string> ProcessesIn(const char* kind, const std::set<ino_t>& inodes) {
  std::vector<std::string> found;
  DIR* d = opendir("/proc");
  if (!d) return found;
  while (dirent* e = readdir(d)) {
    int pid;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    ino_t ino = Inode(absl::StrCat("/proc/", pid, "/ns/", kind));
    if (ino != 0 && inodes.count(ino)) {
      std::string cmd = Slurp(absl::StrCat("/proc/", pid, "/cmdline"));
      std::replace(cmd.begin(), cmd.end(), '\0', ' ');
      found.push_back(absl::StrCat(pid, " ", cmd));
    }
  }
  closedir(d);
  return found;
}

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Pings `to` from `from`; returns "min/avg/max/mdev" in ms and checks the reply crossed one
// router (TTL 64 - 1).
std::string PingRtt(Lab& lab, const std::string& from, const std::string& to) {
  std::string out = MustExec(lab, from, absl::StrCat("ping -n -c 10 -i 0.02 -W 2 ", to));
  EXPECT_TRUE(absl::StrContains(out, "ttl=63")) << "not one routed hop:\n" << out;
  EXPECT_TRUE(absl::StrContains(out, " 0% packet loss")) << out;
  size_t at = out.find("rtt min/avg/max/mdev = ");
  if (at == std::string::npos) return "?";
  std::string rtt = out.substr(at + 23);
  return rtt.substr(0, rtt.find('\n'));
}

constexpr char kLab[] = "trlabt";
constexpr char kH1[] = "trlabt-h1", kH2[] = "trlabt-h2", kH3[] = "trlabt-h3";

// Each host has its own UTS namespace: its hostname is its own name.
void ExpectOwnHostNames(Lab& lab) {
  std::set<std::string> names;
  for (const LabHost& h : lab.hosts()) {
    std::string name(absl::StripTrailingAsciiWhitespace(MustExec(lab, h.name, "hostname")));
    EXPECT_EQ(name, h.name);
    names.insert(name);
  }
  EXPECT_EQ(names.size(), lab.hosts().size());
}

// /dev/shm and /tmp are private: each host's mount namespace has its own tmpfs on them.
void ExpectPrivateShmAndTmp(Lab& lab) {
  MustExec(lab, kH1, "echo a >/dev/shm/trlab-probe && echo a >/tmp/trlab-probe");
  EXPECT_EQ(ExitCode(lab, kH1, "test -e /dev/shm/trlab-probe && test -e /tmp/trlab-probe"), 0);
  EXPECT_NE(ExitCode(lab, kH2, "test -e /dev/shm/trlab-probe"), 0);
  EXPECT_NE(ExitCode(lab, kH2, "test -e /tmp/trlab-probe"), 0);
  EXPECT_NE(access("/dev/shm/trlab-probe", F_OK), 0) << "a host's /dev/shm leaked to the machine";
  EXPECT_NE(access("/tmp/trlab-probe", F_OK), 0) << "a host's /tmp leaked to the machine";
}

// SysV IPC is private (own IPC namespace): h1's segment is listed nowhere else.
void ExpectPrivateSysV(Lab& lab) {
  std::string made = MustExec(lab, kH1, "ipcmk -M 4096");
  ASSERT_TRUE(absl::StrContains(made, "Shared memory id")) << made;
  std::string key(absl::StripTrailingAsciiWhitespace(
      MustExec(lab, kH1, "ipcs -m | awk '$1 ~ /^0x/ { print $1 }'")));
  ASSERT_FALSE(key.empty());
  EXPECT_FALSE(absl::StrContains(MustExec(lab, kH2, "ipcs -m"), key));
  auto here = RunHere({"ipcs", "-m"});
  ASSERT_TRUE(here.ok());
  EXPECT_FALSE(absl::StrContains(here->output, key)) << "h1's segment is on the machine";
}

// Polls `host`'s process list until it does (or does not) show `args`.
bool WaitForProcess(Lab& lab, const std::string& host, const std::string& args, bool present) {
  for (int i = 0; i < 200; ++i) {
    if (absl::StrContains(MustExec(lab, host, "ps -eo pid,args"), args) == present) return true;
    usleep(10000);
  }
  return false;
}

// One host cannot see another's processes (own PID namespace, own /proc); the pid Spawn
// returns is the program's: SIGKILL to it ends the program inside the host.
void ExpectPrivatePids(Lab& lab) {
  auto sleeper = lab.Spawn(kH1, {"sleep", "31.7"});
  ASSERT_TRUE(sleeper.ok()) << sleeper.status();
  EXPECT_TRUE(WaitForProcess(lab, kH1, "sleep 31.7", true));
  std::string ps2 = MustExec(lab, kH2, "ps -eo pid,args");
  EXPECT_FALSE(absl::StrContains(ps2, "sleep 31.7")) << ps2;
  EXPECT_FALSE(absl::StrContains(ps2, kH1)) << "h2 sees h1's init:\n" << ps2;
  EXPECT_TRUE(absl::StrContains(ps2, absl::StrCat("__init ", kLab, " ", kH2))) << ps2;
  ASSERT_EQ(kill(*sleeper, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(*sleeper, &status, 0), *sleeper);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(WaitForProcess(lab, kH1, "sleep 31.7", false)) << "the killed program lives on";
}

// Hosts reach each other through the router, by address and by name; prints the RTT.
void ExpectRoutedPings(Lab& lab) {
  for (auto [from, to] : std::vector<std::pair<std::string, std::string>>{
           {kH1, lab.Address(kH2)}, {kH2, kH3}, {kH3, lab.Address(kH1)}}) {
    std::string rtt = PingRtt(lab, from, to);
    printf("lab: rtt %s -> %s min/avg/max/mdev = %s\n", from.c_str(), to.c_str(), rtt.c_str());
  }
}

// A cut host is unreachable both ways until healed; a one-way cut drops only one direction
// (seen in the router's counters); the cut leaves every other pair alone.
void ExpectCutAndHeal(Lab& lab) {
  const std::string ping = "ping -n -c 3 -i 0.05 -W 1 ";
  ASSERT_TRUE(lab.Cut(kH2).ok());
  EXPECT_NE(ExitCode(lab, kH1, ping + lab.Address(kH2)), 0) << "h1 still reaches a cut h2";
  EXPECT_NE(ExitCode(lab, kH2, ping + lab.Address(kH3)), 0) << "a cut h2 still reaches h3";
  EXPECT_EQ(ExitCode(lab, kH1, ping + lab.Address(kH3)), 0) << "h1-h3 suffers from h2's cut";
  ASSERT_TRUE(lab.Heal(kH2).ok());
  EXPECT_EQ(ExitCode(lab, kH1, ping + lab.Address(kH2)), 0) << "h2 still cut after heal";
  // One way: requests reach h3, its replies do not.
  ASSERT_TRUE(lab.Cut(kH3, "out").ok());
  EXPECT_NE(ExitCode(lab, kH1, ping + lab.Address(kH3)), 0);
  auto rules = RunHere({"ip", "netns", "exec", absl::StrCat(kLab, "-router"), "iptables", "-w",
                        "-L", "FORWARD", "-v", "-n", "-x"});
  ASSERT_TRUE(rules.ok());
  EXPECT_TRUE(absl::StrContains(rules->output, absl::StrCat(kH3, " "))) << rules->output;
  ASSERT_TRUE(lab.Heal(kH3).ok());
  EXPECT_EQ(ExitCode(lab, kH1, ping + lab.Address(kH3)), 0);
  EXPECT_FALSE(lab.Cut(kH1, "sideways").ok()) << "a bad direction is refused";
}

// The shared directory is the same, and writable, on every host and on the machine.
void ExpectSharedDir(Lab& lab) {
  const std::string& dir = lab.shared_dir();
  for (const LabHost& h : lab.hosts())
    MustExec(lab, h.name, absl::StrCat("echo ", h.name, " >", dir, "/from-", h.name));
  for (const LabHost& h : lab.hosts()) {
    std::string all = MustExec(lab, h.name, absl::StrCat("cat ", dir, "/from-*"));
    EXPECT_EQ(all, absl::StrCat(kH1, "\n", kH2, "\n", kH3, "\n")) << "on " << h.name;
  }
  EXPECT_EQ(Slurp(absl::StrCat(dir, "/from-", kH2)), absl::StrCat(kH2, "\n"));
}

// The lines of a helper's DESCRIBE output for `from` -> `to`: from its "rank F -> T (...)" line
// to the next "rank" line.
std::string Lanes(const std::string& out, int from, int to) {
  const std::string head = absl::StrCat("DESCRIBE rank ", from, " -> ", to, " ");
  size_t at = out.find(head);
  if (at == std::string::npos) return "";
  size_t end = out.find("DESCRIBE rank ", at + head.size());
  return out.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

// Waits up to `limit` for a Spawn()ed pid; its wait status, or -1 if it is still running.
int WaitFor(pid_t pid, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    usleep(20000);
  }
  return -1;
}

// Collectives choose their lanes per peer with no UCX_* variable anywhere: shared memory between
// the two ranks of h1, tcp over the host's link between h1 and h2; and the sums come out right
// on both (the matrix scenario checks every algorithm).
void ExpectUcxLanesPerPeer(Lab& lab) {
  for (char** e = environ; *e != nullptr; ++e) {
    ASSERT_FALSE(absl::StartsWith(*e, "UCX_")) << "the lab's processes would inherit " << *e;
  }
  const std::string dir = lab.shared_dir();
  const std::string boot = absl::StrCat(lab.Address(kH1), ":29517");
  const std::vector<std::pair<std::string, std::string>> ranks = {
      {kH1, "listen:" + boot}, {kH1, boot}, {kH2, boot}};
  std::vector<pid_t> pids;
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto pid =
        lab.Spawn(ranks[r].first,
                  {"sh", "-c",
                   absl::StrCat("exec ", COLLECTIVES_UCX_HELPER, " ", ranks[r].second, " ", r, " ",
                                ranks.size(), " matrix 65537 >", dir, "/rank", r, ".txt 2>&1")});
    ASSERT_TRUE(pid.ok()) << pid.status();
    pids.push_back(*pid);
  }
  std::vector<std::string> out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int status = WaitFor(pids[r], std::chrono::seconds(90));
    out.push_back(Slurp(absl::StrCat(dir, "/rank", r, ".txt")));
    EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << " (status " << status << "):\n"
        << out[r];
    EXPECT_TRUE(absl::StrContains(out[r], absl::StrCat("OK rank ", r))) << out[r];
  }
  const std::string same = Lanes(out[0], 0, 1), other = Lanes(out[0], 0, 2),
                    back = Lanes(out[2], 2, 1);
  printf("lab: lanes of rank 0:\n%s%s", same.c_str(), other.c_str());
  EXPECT_TRUE(absl::StrContains(same, "(this host)")) << out[0];
  EXPECT_TRUE(absl::StrContains(same, "posix/memory") || absl::StrContains(same, "sysv/memory"))
      << same;
  EXPECT_FALSE(absl::StrContains(same, "tcp/")) << same;
  EXPECT_TRUE(absl::StrContains(other, "(another host)")) << out[0];
  EXPECT_TRUE(absl::StrContains(other, "tcp/eth0")) << other;
  EXPECT_FALSE(absl::StrContains(other, "posix/memory") || absl::StrContains(other, "sysv/memory"))
      << other;
  EXPECT_TRUE(absl::StrContains(back, "(another host)") && absl::StrContains(back, "tcp/eth0"))
      << out[2];
}

// Holds the lab's network and PID namespaces open (by fd) across Down(), so that their inode
// numbers cannot be reused by namespaces made meanwhile by someone else: a process found in
// one of them after Down() is truly the lab's.
class HeldNamespaces {
 public:
  explicit HeldNamespaces(const Lab& lab) {
    Hold(absl::StrCat("/run/netns/", lab.name(), "-router"), &net_);
    for (const LabHost& h : lab.hosts()) {
      Hold(absl::StrCat("/proc/", h.init_pid, "/ns/net"), &net_);
      Hold(absl::StrCat("/proc/", h.init_pid, "/ns/pid"), &pid_);
    }
  }
  ~HeldNamespaces() {
    for (int fd : fds_) close(fd);
  }
  const std::set<ino_t>& net() const { return net_; }
  const std::set<ino_t>& pid() const { return pid_; }

 private:
  void Hold(const std::string& path, std::set<ino_t>* into) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      ADD_FAILURE() << "cannot open " << path;
      return;
    }
    fds_.push_back(fd);
    into->insert(st.st_ino);
  }
  std::vector<int> fds_;
  std::set<ino_t> net_, pid_;
};

// Down leaves nothing: no process in any of the lab's namespaces, no named namespace, no
// mount, no link in this namespace, no state or shared directory.
void DownAndExpectNothingLeft(Lab& lab) {
  const std::string state = lab.state_dir(), dir = lab.shared_dir();
  HeldNamespaces held(lab);
  ASSERT_EQ(held.net().size(), lab.hosts().size() + 1);
  ASSERT_EQ(held.pid().size(), lab.hosts().size());
  auto t0 = std::chrono::steady_clock::now();
  absl::Status down = lab.Down();
  ASSERT_TRUE(down.ok()) << down;
  printf("lab: down in %.0f ms\n", MsSince(t0));
  EXPECT_EQ(ProcessesIn("net", held.net()), std::vector<std::string>{});
  EXPECT_EQ(ProcessesIn("pid", held.pid()), std::vector<std::string>{});
  auto netns = RunHere({"ip", "netns", "list"});
  ASSERT_TRUE(netns.ok());
  EXPECT_FALSE(absl::StrContains(netns->output, absl::StrCat(kLab, "-"))) << netns->output;
  auto links = RunHere({"ip", "-o", "link", "show"});
  ASSERT_TRUE(links.ok());
  EXPECT_FALSE(absl::StrContains(links->output, kLab)) << links->output;
  std::string mounts = Slurp("/proc/self/mountinfo");
  EXPECT_FALSE(absl::StrContains(mounts, kLab)) << mounts;
  EXPECT_NE(access(state.c_str(), F_OK), 0) << state;
  EXPECT_NE(access(dir.c_str(), F_OK), 0) << dir;
}

TEST(LabTest, HostsShareOnlyTheNetwork) {
  Lab lab(kLab);
  auto t0 = std::chrono::steady_clock::now();
  absl::Status up = lab.Up(3);
  ASSERT_TRUE(up.ok()) << up;
  printf("lab: up 3 hosts in %.0f ms\n", MsSince(t0));
  ASSERT_EQ(lab.hosts().size(), 3u);
  ExpectOwnHostNames(lab);
  ExpectPrivateShmAndTmp(lab);
  ExpectPrivateSysV(lab);
  ExpectPrivatePids(lab);
  ExpectRoutedPings(lab);
  ExpectCutAndHeal(lab);
  ExpectSharedDir(lab);
  ExpectUcxLanesPerPeer(lab);
  DownAndExpectNothingLeft(lab);
}

// Loss, a rate cap and a cut between two hosts only: each does what it claims, measured, and is
// gone after Unshape / Heal (and with the router, after Down).
TEST(LabTest, ShapedAndCutLinksLoseSlowAndDropWhatTheyClaim) {
  Lab lab("trlabs");
  ASSERT_TRUE(lab.Up(3).ok());
  const std::string h1 = "trlabs-h1", h2 = "trlabs-h2", h3 = "trlabs-h3";
  // 10% each way: about 19% of round trips lost (200 echoes: 5 standard deviations is ±14%).
  ASSERT_TRUE(lab.Shape(h2, 10, 0).ok());
  absl::StatusOr<ProbeResult> lossy = lab.Probe(h1, h2);
  ASSERT_TRUE(lossy.ok()) << lossy.status();
  printf("lab: h1 -> h2 with 10%% loss each way: %s\n", lossy->Describe().c_str());
  EXPECT_GT(lossy->loss, 0.05);
  EXPECT_LT(lossy->loss, 0.35);
  // 50 Mbit/s each way: a 60000-byte echo takes ~19 ms there and back on the wire.
  ASSERT_TRUE(lab.Shape(h2, 0, 50).ok());
  absl::StatusOr<ProbeResult> capped = lab.Probe(h1, h2, 20, 60000);
  ASSERT_TRUE(capped.ok()) << capped.status();
  const double mbit = 2 * 60000 * 8 / (capped->rtt_ms * 1000);
  printf("lab: h1 -> h2 capped at 50 Mbit/s: %s, %.1f Mbit/s\n", capped->Describe().c_str(), mbit);
  EXPECT_EQ(capped->loss, 0);
  EXPECT_GT(mbit, 30);
  EXPECT_LT(mbit, 60);
  ASSERT_TRUE(lab.Unshape(h2).ok());
  absl::StatusOr<ProbeResult> clear = lab.Probe(h1, h2, 20, 60000);
  ASSERT_TRUE(clear.ok()) << clear.status();
  EXPECT_EQ(clear->loss, 0);
  EXPECT_LT(clear->rtt_ms, 5) << clear->Describe();
  // 5 ms ± 1 ms each way on h2's link: round trips of 8 to 12 ms (plus scheduling), and a cut
  // still cuts while the delay is on (it comes first in the router's chain).
  ASSERT_TRUE(lab.Delay(h2, 5, 1).ok());
  absl::StatusOr<ProbeResult> slow = lab.Probe(h1, h2, 100);
  ASSERT_TRUE(slow.ok()) << slow.status();
  printf("lab: h1 -> h2 delayed 5 ms ± 1 ms each way: %s\n", slow->Describe().c_str());
  EXPECT_EQ(slow->loss, 0);
  EXPECT_GT(slow->rtt_ms, 8);
  EXPECT_LT(slow->rtt_ms, 14);
  ASSERT_TRUE(lab.Cut(h2).ok());
  EXPECT_EQ(lab.Probe(h1, h2, 10)->received, 0);
  ASSERT_TRUE(lab.Heal(h2).ok());
  EXPECT_GT(lab.Probe(h1, h2, 10)->rtt_ms, 8);
  ASSERT_TRUE(lab.Undelay(h2).ok());
  EXPECT_LT(lab.Probe(h1, h2, 10)->rtt_ms, 2);
  EXPECT_FALSE(lab.Delay(h2, 1, 2).ok()) << "a jitter above the delay is refused";
  // h2 cut off from h1 only: h3 still reaches both.
  ASSERT_TRUE(lab.Cut(h2, "both", h1).ok());
  EXPECT_EQ(lab.Probe(h1, h2, 10)->received, 0);
  EXPECT_EQ(lab.Probe(h2, h3, 10)->loss, 0);
  EXPECT_EQ(lab.Probe(h3, h1, 10)->loss, 0);
  ASSERT_TRUE(lab.Heal(h2).ok());
  EXPECT_EQ(lab.Probe(h1, h2, 10)->loss, 0);
  EXPECT_FALSE(lab.Shape(h2, -1, 0).ok()) << "a negative loss is refused";
  EXPECT_FALSE(lab.Cut(h2, "both", "trlabs-h9").ok()) << "an unknown peer is refused";
  // Two zones' link (as bench/compare-lowcomm makes it): h1 -- h3 delayed 10 ms each way and
  // capped at 50 Mbit/s; h1 -- h2 and h2 -- h3 untouched.
  ASSERT_TRUE(lab.Delay(h1, 10, 0, {h3}).ok());
  ASSERT_TRUE(lab.Shape(h1, 0, 50, {h3}).ok());
  absl::StatusOr<ProbeResult> far = lab.Probe(h1, h3, 20, 60000);
  ASSERT_TRUE(far.ok()) << far.status();
  const double far_mbit = 2 * 60000 * 8 / ((far->rtt_ms - 20) * 1000);
  printf("lab: h1 -> h3 delayed 10 ms, capped at 50 Mbit/s: %s, %.1f Mbit/s\n",
         far->Describe().c_str(), far_mbit);
  EXPECT_EQ(far->loss, 0);
  EXPECT_GT(far->rtt_ms, 35);
  EXPECT_GT(far_mbit, 30);
  EXPECT_LT(far_mbit, 60);
  for (const auto& [a, b] : {std::pair{h1, h2}, std::pair{h2, h3}}) {
    absl::StatusOr<ProbeResult> near = lab.Probe(a, b, 20, 60000);
    ASSERT_TRUE(near.ok()) << near.status();
    EXPECT_LT(near->rtt_ms, 5) << a << " -> " << b << ": " << near->Describe();
  }
  // Undoing h3's own faults leaves h1's rules with h3 as their peer in place.
  ASSERT_TRUE(lab.Undelay(h3).ok());
  ASSERT_TRUE(lab.Unshape(h3).ok());
  ASSERT_TRUE(lab.Heal(h3).ok());
  EXPECT_GT(lab.Probe(h1, h3, 10)->rtt_ms, 18);
  EXPECT_FALSE(lab.Delay(h1, 10, 0, {"trlabs-h9"}).ok()) << "an unknown peer is refused";
  ASSERT_TRUE(lab.Undelay(h1).ok());
  ASSERT_TRUE(lab.Unshape(h1).ok());
  EXPECT_LT(lab.Probe(h1, h3, 20, 60000)->rtt_ms, 5);
  absl::Status down = lab.Down();
  EXPECT_TRUE(down.ok()) << down;
}

}  // namespace
}  // namespace troupe::lab
