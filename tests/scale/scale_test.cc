// ScaleTest: 32 real ranks (worker processes) on this machine train the tiny GPT, survive a kill -9
// and end bit-identical to 4 ranks on the same spec — with the control plane that lets a world
// grow: each rank's worker holds O(log W) TCP connections (the head, the coordinator's worker,
// its liveness watchers), not one per other worker (issue 45). On one host the collectives move
// data through shared memory, so every TCP connection of a worker is a control connection.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "job_harness.h"
#include "troupe/runtime/sim_cluster.h"

namespace {

using troupe::testing::JobRun;

constexpr int kWorld = 32;

// The socket inodes a process holds (/proc/PID/fd).
std::set<std::string> SocketInodes(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
  if (DIR* d = opendir(fd_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[256];
      const ssize_t n = readlink((fd_dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      unsigned long inode = 0;
      if (std::sscanf(target, "socket:[%lu]", &inode) == 1) inodes.insert(std::to_string(inode));
    }
    closedir(d);
  }
  return inodes;
}

struct TcpSocket {
  std::string local, remote, inode;  // addresses as /proc/net/tcp writes them (hex ip:port)
};

// The established TCP sockets of this network namespace (/proc/net/tcp{,6}, state 01), by inode.
// The kernel hands a table out a page per read(2) and resumes by position: while sockets open
// and close elsewhere, a line is repeated or skipped (a repeat counted twice made a worker's 8
// connections read 10). So each socket counts once, by inode, and the tables are read until two
// reads in a row agree (at most 5).
std::map<std::string, TcpSocket> EstablishedSockets() {
  auto read_once = [] {
    std::map<std::string, TcpSocket> out;
    for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
      std::ifstream in(table);
      std::string line;
      std::getline(in, line);  // the header
      while (std::getline(in, line)) {
        std::istringstream f(line);
        std::string sl, state, queues, timer, retr, uid, timeout;
        TcpSocket t;
        f >> sl >> t.local >> t.remote >> state >> queues >> timer >> retr >> uid >> timeout >>
            t.inode;
        if (state == "01") out[t.inode] = t;
      }
    }
    return out;
  };
  std::map<std::string, TcpSocket> last = read_once();
  for (int i = 0; i < 4; ++i) {
    std::map<std::string, TcpSocket> again = read_once();
    const bool same = std::equal(last.begin(), last.end(), again.begin(), again.end(),
                                 [](const auto& a, const auto& b) { return a.first == b.first; });
    last = std::move(again);
    if (same) break;
  }
  return last;
}

// The connections of process `pid` among `all`.
std::vector<TcpSocket> EstablishedTcp(pid_t pid, const std::map<std::string, TcpSocket>& all) {
  std::vector<TcpSocket> out;
  for (const std::string& inode : SocketInodes(pid)) {
    if (auto t = all.find(inode); t != all.end()) out.push_back(t->second);
  }
  return out;
}

// What is at the other end of each of `mine` (a process's connections, as counted), one line each
// ("local -> remote: argv > its stdout (pid)", "?" where the peer's end is gone by now), for a
// failure's message.
std::string DescribeConnections(const std::vector<TcpSocket>& mine) {
  std::map<std::string, std::string> owner;  // socket inode → its process
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      const pid_t p = static_cast<pid_t>(std::atoi(e->d_name));
      if (p <= 0) continue;
      std::ifstream cmd(absl::StrCat("/proc/", p, "/cmdline"));
      std::string arg, who;
      for (int i = 0; i < 6 && std::getline(cmd, arg, '\0'); ++i) absl::StrAppend(&who, " ", arg);
      char out[512];  // a worker's name is its stdout's: .../logs/n3-w0.out
      const ssize_t n = readlink(absl::StrCat("/proc/", p, "/fd/1").c_str(), out, sizeof(out) - 1);
      if (n > 0) {
        absl::StrAppend(&who, " > ",
                        std::filesystem::path(std::string(out, n)).filename().string());
      }
      absl::StrAppend(&who, " (", p, ")");
      for (const std::string& inode : SocketInodes(p)) owner[inode] = who;
    }
    closedir(d);
  }
  const std::map<std::string, TcpSocket> all = EstablishedSockets();
  std::string out;
  for (const TcpSocket& t : mine) {
    std::string peer = " ?";
    for (const auto& [inode, o] : all) {
      if (o.local == t.remote && o.remote == t.local) peer = owner[inode];
    }
    absl::StrAppend(&out, "  ", t.local, " -> ", t.remote, ":", peer, "\n");
  }
  return out;
}

// The worker processes of the run in `dir`, by the name of their log (<dir>/logs/NODE-wI.out,
// their stdout): "n3-w0" → pid.
std::map<std::string, pid_t> Workers(const std::string& dir) {
  std::map<std::string, pid_t> out;
  const std::string logs = dir + "/logs/";
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream cmd(absl::StrCat("/proc/", pid, "/cmdline"));
    std::string argv0, argv1;
    std::getline(cmd, argv0, '\0');
    std::getline(cmd, argv1, '\0');
    if (argv1 != "worker") continue;
    char target[512];
    const ssize_t n =
        readlink(absl::StrCat("/proc/", pid, "/fd/1").c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    const std::string out_file(target, static_cast<size_t>(n));
    if (!absl::StartsWith(out_file, logs) || !absl::EndsWith(out_file, ".out")) continue;
    out[out_file.substr(logs.size(), out_file.size() - logs.size() - 4)] = pid;
  }
  closedir(d);
  return out;
}

class ScaleTest : public troupe::testing::JobTest {
 protected:
  ScaleTest() {
    steps_ = 12;
    microbatches_ = kWorld;
    max_workers_ = kWorld;
  }

  // Every rank's worker (not the coordinator's, which talks to all of them) has fewer than
  // 2·log2(W) control connections; prints the counts.
  void ExpectFewConnections(const std::string& dir, const std::string& when) {
    const std::map<std::string, pid_t> workers = Workers(dir);
    const std::map<std::string, TcpSocket> all = EstablishedSockets();  // one snapshot for all
    const int bound = 2 * static_cast<int>(std::log2(kWorld));
    int ranks = 0, most = 0, coordinator = -1;
    std::map<int, int> histogram;
    for (const auto& [name, pid] : workers) {
      const std::vector<TcpSocket> connections = EstablishedTcp(pid, all);
      const int n = static_cast<int>(connections.size());
      if (absl::StartsWith(name, "coord-")) {
        coordinator = n;
        continue;
      }
      ++ranks;
      ++histogram[n];
      most = std::max(most, n);
      EXPECT_LT(n, bound) << name << " (pid " << pid << ") " << when << ", its connections:\n"
                          << DescribeConnections(connections);
    }
    std::string counts;
    for (const auto& [n, k] : histogram) absl::StrAppend(&counts, " ", k, "×", n);
    std::printf(
        "%s: %d rank workers, TCP connections each:%s (most %d, bound %d); the "
        "coordinator's worker: %d\n",
        when.c_str(), ranks, counts.c_str(), most, bound, coordinator);
    EXPECT_GE(ranks, kWorld - 1) << when;
  }
};

TEST_F(ScaleTest, ThirtyTwoRanksSurviveAKillWithLogarithmicConnectionsAndEndAsFour) {
  const std::string want = Reference();
  ASSERT_FALSE(want.empty());
  const std::string dir = base_ + "/w32";
  const auto start = std::chrono::steady_clock::now();
  const pid_t job = Start(dir, {"--workers", std::to_string(kWorld), "--chaos", "kill-worker@6"});
  bool before = false, after = false;
  while (!after && std::chrono::steady_clock::now() - start < std::chrono::seconds(100)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int commits = Commits(dir);
    if (!before && commits >= 2) {
      before = true;
      ExpectFewConnections(dir, "step 2, 32 ranks");
    }
    if (!after && commits >= 10) {
      after = true;
      ExpectFewConnections(dir, "step 10, after the kill");
    }
  }
  const int code = Wait(job, std::chrono::seconds(110));
  JobRun r{code, troupe::testing::Slurp(dir + "/out.txt"),
           troupe::testing::ReadReport(dir + "/report")};
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(before && after) << "the job ended before it could be looked at:\n" << r.output;
  EXPECT_EQ(r.report.crc, want) << "32 ranks with a kill vs 4 ranks:\n" << r.output;
  EXPECT_EQ(r.report.world, kWorld - 1) << r.output;
  EXPECT_EQ(r.report.steps_lost, 0) << r.output;
  std::printf("32 ranks: recovery %.2f s, %d generations, %.1f s in all\n", r.report.recovery_s,
              r.report.generations,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  ExpectExactlyOnce("w32");
}

// 256 members (32 node agents with 7 workers each) simulated over the real protocol
// (sim_cluster.h) join a real head; one worker's exit is known in this process (the head's event
// reached its subscriber) within a second, a silent one's within the heartbeat timeout and a
// second.
// A real `troupe head` (200 ms heartbeats, 1 s timeout, build id "sim") for simulated members;
// killed, its directory removed, whatever the test's outcome.
struct SimHead {
  pid_t pid = -1;
  std::string dir;
  int port = 0;
  SimHead() {
    char tmpl[] = "/tmp/troupe_scale_sim_XXXXXX";
    dir = mkdtemp(tmpl);
    pid = fork();
    if (pid == 0) {
      const std::string out = dir + "/head.log";
      FILE* f = std::fopen(out.c_str(), "w");
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
      execl(TROUPE_BINARY, TROUPE_BINARY, "head", "--port", "0", "--port_file",
            (dir + "/port").c_str(), "--heartbeat_interval", "200ms", "--heartbeat_timeout", "1s",
            "--build_id", "sim", "--http_port", "-1", "--log_dir", dir.c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 500 && port == 0; ++i) {
      std::ifstream(dir + "/port") >> port;
      if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~SimHead() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    std::filesystem::remove_all(dir);
  }
  std::string Log() const { return troupe::testing::Slurp(dir + "/head.log"); }
  troupe::runtime::testing::SimClusterOptions Options(int nodes, int workers_per_node) const {
    troupe::runtime::testing::SimClusterOptions o;
    o.head_port = static_cast<uint16_t>(port);
    o.build_id = "sim";
    o.nodes = nodes;
    o.workers_per_node = workers_per_node;
    o.heartbeat_interval = std::chrono::milliseconds(200);
    return o;
  }
};

TEST(ScaleSimTest, TwoHundredFiftySixMembersJoinAndLearnOfADeathWithinTheirTimeout) {
  const SimHead head;
  ASSERT_GT(head.port, 0) << head.Log();
  {
    const troupe::runtime::testing::SimClusterOptions o = head.Options(32, 7);
    auto c = troupe::runtime::testing::SimCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status() << head.Log();
    EXPECT_EQ((*c)->member_ids().size(), 256u);
    std::printf("256 members joined in %.3f s\n",
                static_cast<double>((*c)->joined_ns() - (*c)->started_ns()) / 1e9);
    auto heard = [&](const std::string& id, int64_t since, std::chrono::milliseconds within) {
      const auto deadline = std::chrono::steady_clock::now() + within;
      while (std::chrono::steady_clock::now() < deadline) {
        if (std::optional<int64_t> t = (*c)->DeathSeen(id)) return (*t - since) / 1000000;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return int64_t{-1};
    };
    const int64_t exit_ms = heard("s3/w6", (*c)->Exit("s3/w6"), std::chrono::milliseconds(1000));
    EXPECT_GE(exit_ms, 0) << "an exit not known within 1 s";
    const int64_t quiet_ms =
        heard("s9/w2", (*c)->Silence("s9/w2"), std::chrono::milliseconds(2000));
    ASSERT_GE(quiet_ms, 0) << "a silent member not known within its timeout + 1 s";
    // Its last beat was at most one interval (and the sim's timer drift) before it fell silent.
    EXPECT_GE(quiet_ms, 1000 - 2 * 200) << "declared before its heartbeat timeout";
    for (const std::string& id : (*c)->member_ids()) {
      if (id == "s3/w6" || id == "s9/w2") continue;
      EXPECT_FALSE((*c)->DeathSeen(id)) << id << " declared dead";
    }
    std::printf("death known: by exit %lld ms, by silence %lld ms (timeout 1 s)\n",
                static_cast<long long>(exit_ms), static_cast<long long>(quiet_ms));
  }
}

// A member that cannot handle one of the head's messages answers with an error: the head logs it
// and goes on. (A node that ignored a fence once ended the head's actor; every later silence went
// unnoticed while its process lived on.)
TEST(ScaleSimTest, AnErrorFromAMemberLeavesTheHeadWatching) {
  const SimHead head;
  ASSERT_GT(head.port, 0) << head.Log();
  troupe::runtime::testing::SimClusterOptions o = head.Options(4, 2);
  o.nodes_kill_fenced = false;
  auto c = troupe::runtime::testing::SimCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const char* id : {"s1/w0", "s2/w0"}) {  // the first fence is answered with an error
    (*c)->Silence(id);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (!(*c)->DeathSeen(id) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE((*c)->DeathSeen(id)) << id << " never declared dead\n" << head.Log();
  }
}

}  // namespace
