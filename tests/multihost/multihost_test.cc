// MultihostTest: elastic training across hosts that behave like separate machines (tests/lab:
// own network, IPC, mount, PID and UTS namespaces, linked through a router). A head on h5, a node
// agent with one worker on each of h1..h4, `troupe train --head` from h5; the job's directory
// and data on the lab's shared directory (the stand-in for NFS). Every run must end with the
// final weights of the same job trained on one host, every step committed once and every
// microbatch served once; the lab must leave nothing behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "job_harness.h"
#include "lab.h"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

constexpr int kHosts = 4, kSteps = 24, kMicrobatches = 8;
constexpr char kPort[] = "17100";

struct JobRun {
  int exit_code = -1;
  double seconds = 0;  // from its start to its exit
  std::string output;
  Report report;
};

// A SIGKILL-safe shell command line: every argument single-quoted.
std::string Quote(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) absl::StrAppend(&out, out.empty() ? "'" : " '", a, "'");
  return out;
}

// Waits up to `limit` for a child; its exit code (128+N for signal N), or -1 if it still runs (it
// is killed then).
int WaitFor(pid_t pid, seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A lab name of this test's own ("trlabm" plus its index in the suite), so that ctest may run
// the suite's tests side by side.
std::string LabName() {
  const ::testing::TestInfo* me = ::testing::UnitTest::GetInstance()->current_test_info();
  const ::testing::TestSuite* suite = ::testing::UnitTest::GetInstance()->current_test_suite();
  for (int i = 0; i < suite->total_test_count(); ++i) {
    if (suite->GetTestInfo(i) == me) return absl::StrCat("trlabm", i);
  }
  return "trlabm";
}

class MultihostTest : public ::testing::Test {
 protected:
  std::string Host(int i) const { return absl::StrCat(lab_.name(), "-h", i); }
  // The head's host: no node agent, no worker; the driver runs here too.
  std::string HeadHost() const { return Host(kHosts + 1); }

  void SetUp() override {
    absl::Status up = lab_.Up(kHosts + 1);
    ASSERT_TRUE(up.ok()) << up;
    dir_ = lab_.shared_dir() + "/t";
    fs::create_directories(dir_ + "/logs");
    SetSteps(kSteps);
    head_ = absl::StrCat(lab_.Address(HeadHost()), ":", kPort);
    std::vector<std::string> head = {TROUPE_BINARY, "head", "--host", lab_.Address(HeadHost()),
                                     "--port",      kPort};
    // The grace tests give the head a longer heartbeat timeout: the window in which a host the
    // head cannot hear from is not yet declared dead. (TCP's retransmission backoff stretches a
    // 1 s cut into up to ~1.5 s of silence: the 200, 400, 800 ms retries.)
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    if (absl::StartsWith(test, "TheHeadUnreachableFromOneHostWithin")) {
      head.insert(head.end(), {"--heartbeat_timeout", "5s"});
    }
    // The stall test: a handler running 1 s is reported hung (the stall lasts 3 s).
    if (absl::StartsWith(test, "AStalledCoordinator")) {
      head.insert(head.end(), {"--hung_timeout", "1s"});
    }
    if (absl::StartsWith(test, "MutualTls")) MakeCertificates();
    // The head-loss test: a head with a store, started again on its host after a kill -9.
    if (absl::StartsWith(test, "TheHeadKilled")) {
      head.insert(head.end(), {"--store", dir_ + "/head.db"});
    }
    // The failure-domain tests: two workers on each of h1 and h2, nothing on h3 and h4.
    if (absl::StartsWith(test, "TwoWorkersPerHost")) workers_ = {2, 2, 0, 0};
    Append(head, Tls("head"));
    head_argv_ = head;
    head_pid_ = Run(HeadHost(), head, dir_ + "/logs/head.txt");
    int total = 0;
    for (int i = 1; i <= kHosts; ++i) {
      const int n = workers_[i - 1];
      total += n;
      if (n == 0) continue;
      std::vector<std::string> node = {TROUPE_BINARY, "node",
                                       "--head",      head_,
                                       "--name",      Host(i),
                                       "--workers",   std::to_string(n),
                                       "--log_dir",   dir_ + "/logs",
                                       "--grace",     "5s",
                                       "--resources", absl::StrCat("cpu=", n)};
      Run(Host(i), Append(node, Tls(Host(i))), absl::StrCat(dir_, "/logs/node-", Host(i), ".txt"));
    }
    // The node agents keep trying until the head listens; every worker carries the address its
    // node advertises (the interface on the route to the head) and its host's name.
    std::vector<std::string> wait = {TROUPE_BINARY, "status",         "--head",
                                     head_,         "--wait_workers", std::to_string(total)};
    auto status = lab_.Exec(HeadHost(), Quote(Append(wait, Tls("driver"))));
    ASSERT_TRUE(status.ok()) << status.status();
    ASSERT_EQ(status->exit_code, 0) << status->output << Logs();
    for (int i = 1; i <= kHosts; ++i) {
      if (workers_[i - 1] == 0) continue;  // no node on this host
      EXPECT_TRUE(absl::StrContains(
          status->output, absl::StrCat("node ", Host(i), " alive address=", lab_.Address(Host(i)),
                                       " host=", Host(i), " ")))
          << status->output;
      for (int w = 0; w < workers_[i - 1]; ++w) {
        EXPECT_TRUE(absl::StrContains(status->output,
                                      absl::StrCat("  worker ", Host(i), "/w", w, " alive pid=")))
            << status->output;
      }
    }
  }

  // `troupe certs` for the head, each host's node agent and the driver, each naming the address
  // of its host; every process of the test then runs with mutual TLS (Tls()).
  void MakeCertificates() {
    certs_ = dir_ + "/certs";
    std::string members =
        absl::StrCat("head=", lab_.Address(HeadHost()), ",driver=", lab_.Address(HeadHost()));
    for (int i = 1; i <= kHosts; ++i)
      absl::StrAppend(&members, ",", Host(i), "=", lab_.Address(Host(i)));
    auto made = lab_.Exec(HeadHost(),
                          Quote({TROUPE_BINARY, "certs", "--dir", certs_, "--members", members}));
    ASSERT_TRUE(made.ok() && made->exit_code == 0)
        << (made.ok() ? made->output : made.status().ToString());
  }
  // `who`'s TLS options, or none when the test runs without TLS.
  std::vector<std::string> Tls(const std::string& who) const {
    if (certs_.empty()) return {};
    return {"--tls_ca",  certs_ + "/ca.pem",         "--tls_cert", certs_ + "/" + who + ".pem",
            "--tls_key", certs_ + "/" + who + ".key"};
  }
  static std::vector<std::string>& Append(std::vector<std::string>& to,
                                          const std::vector<std::string>& more) {
    to.insert(to.end(), more.begin(), more.end());
    return to;
  }

  // The job (and the one-host run it is compared with) trains `steps` steps.
  void SetSteps(int steps) {
    steps_ = steps;
    spec_ = absl::StrCat(dir_, "/job-", steps, ".toml");
    std::ofstream(spec_) << "[job]\nname = \"t\"\nsteps = " << steps
                         << "\n[model]\nmicrobatches = " << kMicrobatches << "\ndata_dir = \""
                         << dir_ << "/data\"\n[elastic]\nmin_workers = 2\nmax_workers = 6\n"
                         << "[checkpoint]\nevery = 5\nkeep_last = 3\n[chaos]\nstall = \"3s\"\n"
                         << "delay = \"20ms\"\njitter = \"2ms\"\n[timeouts]\njoin_wait = \"20s\"\n";
  }

  void TearDown() override {
    absl::Status down = lab_.Down();
    EXPECT_TRUE(down.ok()) << down;
  }

  // Starts argv on `host`, output to `log`.
  pid_t Run(const std::string& host, const std::vector<std::string>& argv, const std::string& log) {
    auto pid =
        lab_.Spawn(host, {"sh", "-c", absl::StrCat("exec ", Quote(argv), " >", log, " 2>&1")});
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.ok() ? *pid : -1;
  }

  // `troupe train --head` from the head's host on the lab's cluster, in <shared>/t/<name>.
  pid_t StartJob(const std::string& name, const std::vector<std::string>& extra) {
    const std::string work = dir_ + "/" + name;
    fs::create_directories(work);
    std::vector<std::string> args = {TROUPE_BINARY, "train",         "--spec",     spec_,
                                     "--head",      head_,           "--work_dir", work,
                                     "--report",    work + "/report"};
    Append(Append(args, extra), Tls("driver"));
    started_[name] = std::chrono::steady_clock::now();
    return Run(HeadHost(), args, work + "/out.txt");
  }

  JobRun Finish(const std::string& name, pid_t pid) {
    JobRun r;
    r.exit_code = WaitFor(pid, seconds(240));
    r.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_[name]).count();
    r.output = Slurp(dir_ + "/" + name + "/out.txt");
    r.report = ReadReport(dir_ + "/" + name + "/report");
    return r;
  }

  // The same job on one host (the embedded cluster, 4 workers), run here: its final weights
  // (computed once per test binary and job length).
  std::string OneHostCrc() {
    static std::map<int, std::string> crcs;
    std::string& crc = crcs[steps_];
    if (!crc.empty()) return crc;
    const std::string work = absl::StrCat(dir_, "/onehost-", steps_);
    fs::create_directories(work);
    pid_t pid = fork();
    if (pid == 0) {
      const std::string out = work + "/out.txt";
      freopen(out.c_str(), "w", stdout);
      dup2(1, 2);
      execl(TROUPE_BINARY, TROUPE_BINARY, "train", "--spec", spec_.c_str(), "--workers", "4",
            "--work_dir", work.c_str(), "--report", (work + "/report").c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    EXPECT_EQ(WaitFor(pid, seconds(240)), 0) << Slurp(work + "/out.txt");
    crc = ReadReport(work + "/report").crc;
    EXPECT_FALSE(crc.empty()) << Slurp(work + "/out.txt");
    return crc;
  }

  // Lines in the job's commit record.
  int Commits(const std::string& name) {
    std::istringstream log(Slurp(dir_ + "/" + name + "/commits.log"));
    int n = 0;
    for (std::string line; std::getline(log, line);) ++n;
    return n;
  }

  // The cluster's logs and every job's event log, for a failure message.
  std::string Logs() {
    std::string out;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      const std::string p = e.path().string();
      if (absl::StrContains(p, "/logs/") && e.is_regular_file()) {
        absl::StrAppend(&out, "--- ", p, "\n", Slurp(p));
      }
    }
    return out;
  }

  void ExpectExactlyOnce(const std::string& name) {
    EXPECT_EQ(ExactlyOnceDefects(dir_ + "/" + name, steps_, kMicrobatches), "")
        << Slurp(dir_ + "/" + name + "/out.txt") << Logs();
  }

  std::vector<SupervisionEvent> Events(const std::string& name) {
    return ReadEvents(dir_ + "/" + name + "/logs/events.log");
  }
  bool HasEvent(const std::string& name, const std::string& event, const Fields& fields) {
    return !FindEvents(Events(name), event, fields).empty();
  }
  // Job `name`'s log says `host`'s first worker was declared dead for missed heartbeats (its own
  // or its node's).
  bool DeclaredSilent(const std::string& name, int host) {
    for (const SupervisionEvent& e :
         FindEvents(Events(name), "process_exit", {{"child", Host(host) + "/w0"}})) {
      if (absl::StrContains(e.reason, "no heartbeat")) return true;
    }
    return false;
  }

  JobRun RunWithChaos(const std::string& name, const std::string& chaos) {
    return Finish(name, StartJob(name, {"--chaos", chaos}));
  }

  // Starts job `name` and returns once 3 steps are committed.
  pid_t StartAndWaitForCommits(const std::string& name,
                               const std::vector<std::string>& extra = {}) {
    pid_t job = StartJob(name, extra);
    const auto until = std::chrono::steady_clock::now() + seconds(120);
    while (Commits(name) < 3 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_GE(Commits(name), 3) << Slurp(dir_ + "/" + name + "/out.txt") << Logs();
    return job;
  }

  // The heal-and-rejoin tests: the job holds before step `step` until a worker joins
  // (`join-worker@step`: the driver of a job on a cluster it did not start starts none, so the one
  // that joins is the healed host's new worker). `step` comes a few steps after the cut (while a
  // host is cut off no step commits, so it is reached only once the job goes on without it), so
  // the job cannot end before the rejoin, however fast its steps; [timeouts] join_wait (20 s)
  // bounds the hold if the worker was folded in before it.
  static constexpr int kRejoinSteps = 40;
  static std::vector<std::string> HoldForRejoin(int step) {
    return {"--chaos", absl::StrCat("join-worker@", step)};
  }

  // Starts job `name`, and once 3 steps are committed kills every process of `hosts` at once.
  JobRun PullPlugsMidRun(const std::string& name, const std::vector<int>& hosts) {
    pid_t job = StartAndWaitForCommits(name);
    for (int h : hosts) {
      absl::Status pulled = lab_.PullPlug(Host(h));
      EXPECT_TRUE(pulled.ok()) << pulled;
    }
    return Finish(name, job);
  }

  // The host (1..kHosts) whose worker runs job `name`'s first coordinator (its job supervisor's
  // first start event says where).
  int CoordinatorHost(const std::string& name) {
    for (const SupervisionEvent& e : FindEvents(Events(name), "start")) {
      for (int i = 1; i <= kHosts; ++i) {
        if (absl::StrContains(e.decision, Host(i) + "/")) return i;
      }
    }
    return 0;
  }

  // The job ended well: exit 0, every step, the one-host weights, on `world` workers and with
  // `steps_lost` (each unchecked when < 0), and every step committed and served exactly once.
  void ExpectFinished(const std::string& name, const JobRun& r, int world, int steps_lost,
                      bool exactly_once = true) {
    ASSERT_EQ(r.exit_code, 0) << r.output << Logs();
    EXPECT_EQ(r.report.steps, steps_) << r.output;
    if (world >= 0) {
      EXPECT_EQ(r.report.world, world) << r.output;
    }
    if (steps_lost >= 0) {
      EXPECT_EQ(r.report.steps_lost, steps_lost) << r.output;
    }
    EXPECT_EQ(r.report.crc, OneHostCrc()) << "final weights differ from one host's\n" << r.output;
    if (exactly_once) ExpectExactlyOnce(name);
  }

  lab::Lab lab_{LabName()};
  std::string dir_, spec_, head_, certs_;
  std::vector<std::string> head_argv_;  // how SetUp started the head (pid head_pid_)
  pid_t head_pid_ = -1;
  std::vector<int> workers_ = std::vector<int>(kHosts, 1);  // node agent h<i>'s workers
  int steps_ = kSteps;
  std::map<std::string, std::chrono::steady_clock::time_point> started_;
};

TEST_F(MultihostTest, FourHostsTrainToTheWeightsOfOneHost) {
  ExpectFinished("plain", Finish("plain", StartJob("plain", {})), kHosts, 0);
}

TEST_F(MultihostTest, KillDashNineOfOneHostsWorkerFinishesOnThree) {
  ExpectFinished("kill", RunWithChaos("kill", "kill-worker@7"), kHosts - 1, 0);
  const std::vector<SupervisionEvent> fired =
      FindEvents(Events("kill"), "fault_fired", {{"kind", "kill-worker"}, {"step", "7"}});
  ASSERT_EQ(fired.size(), 1u) << Logs();
  // The next generation restored step 7 on the three others (the killed rank may have hosted
  // the coordinator too: then its restart formed that generation).
  const std::vector<SupervisionEvent> next =
      FindEvents(Events("kill"), "generation", {{"world", "3"}, {"step", "7"}});
  ASSERT_EQ(next.size(), 1u) << Logs();
  EXPECT_FALSE(absl::StrContains(next[0].Field("workers"), fired[0].child)) << Logs();
}

TEST_F(MultihostTest, AHostThatLosesPowerIsLeftBehind) {
  ExpectFinished("plug", PullPlugsMidRun("plug", {3}), kHosts - 1, -1);
  // The head saw the node go.
  EXPECT_TRUE(HasEvent("plug", "process_exit", {{"child", Host(3)}})) << Logs();
}

TEST_F(MultihostTest, TwoHostsThatLosePowerAtOnceAreLeftBehind) {
  ExpectFinished("plug2", PullPlugsMidRun("plug2", {2, 4}), kHosts - 2, -1);
}

// A host cut off both ways (no FIN, no RST: its packets vanish) is a silent one: its worker is
// declared dead for missed heartbeats and the job goes on without it, with the same weights.
// After the heal the host is heard from again: the head tells its node agent to join again, which
// kills its fenced worker and starts a new one (a new member, h<k>/w1), folded in at a step
// boundary; the job ends on all four hosts.
TEST_F(MultihostTest, APartitionedWorkerHostIsLeftBehindAndRejoinsAfterTheHeal) {
  SetSteps(kRejoinSteps);
  pid_t job = StartAndWaitForCommits("cut", HoldForRejoin(12));
  const int coordinator = CoordinatorHost("cut");
  ASSERT_GT(coordinator, 0) << Logs();
  // Not the coordinator's host.
  const int victim = coordinator == kHosts ? kHosts - 1 : kHosts;
  ASSERT_TRUE(lab_.Cut(Host(victim)).ok());
  // Its worker is declared dead for its (or its node's) missed heartbeats. Two processes log
  // that, in no set order: the coordinator its next generation, the driver the head's verdict.
  const auto until = std::chrono::steady_clock::now() + seconds(30);
  while ((FindEvents(Events("cut"), "generation", {{"world", "3"}}).empty() ||
          !DeclaredSilent("cut", victim)) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(DeclaredSilent("cut", victim)) << Logs();
  ASSERT_TRUE(lab_.Heal(Host(victim)).ok());
  JobRun r = Finish("cut", job);
  for (const SupervisionEvent& e : Events("cut")) {
    if (e.event == "join_folded" || e.event == "join_timeout" || e.event == "fault_fired" ||
        e.event == "generation") {
      printf("%s\n", base::FormatEvent(e).c_str());
    }
  }
  ExpectFinished("cut", r, kHosts, -1);
  EXPECT_TRUE(HasEvent("cut", "join_folded", {{"child", Host(victim) + "/w1"}})) << Logs();
}

// The job spec's network faults, carried out by the node agents on their own hosts (iptables in
// each host's network namespace, not the lab's router): rank 1's host loses 5% of its packets
// each way for 3 s from step 4; rank 2's host is cut off from step 10 for 3 s — its worker is
// declared dead, the job goes on, and after the heal its node joins again with a new worker,
// folded in at a step boundary. No rule is left behind.
TEST_F(MultihostTest, NetworkFaultsOfTheJobSpecAreCarriedOutByTheNodeAgents) {
  SetSteps(kRejoinSteps);
  std::vector<std::string> chaos = {"--chaos", "drop-node@4:1", "--chaos", "partition-node@10:2"};
  JobRun r = Finish("net", StartJob("net", Append(chaos, HoldForRejoin(16))));
  ExpectFinished("net", r, kHosts, -1);
  std::map<std::string, std::string> node_of;  // fault kind -> node
  for (const SupervisionEvent& e : FindEvents(Events("net"), "fault_armed")) {
    node_of[e.Field("kind")] = e.Field("node");
  }
  ASSERT_TRUE(node_of.count("drop-node") && node_of.count("partition-node")) << Logs();
  const std::string cut = node_of["partition-node"];
  EXPECT_TRUE(DeclaredSilent("net", cut.back() - '0')) << Logs();
  EXPECT_TRUE(HasEvent("net", "join_folded", {{"child", cut + "/w1"}})) << Logs();
  for (const char* kind : {"drop-node", "partition-node"}) {
    const std::string& node = node_of[kind];
    const std::string said =
        absl::StrCat("chaos: ", kind == std::string("drop-node") ? "drop" : "partition",
                     " of this host's links for 3000 ms");
    EXPECT_TRUE(absl::StrContains(Slurp(absl::StrCat(dir_, "/logs/node-", node, ".txt")), said))
        << kind << " on " << node << "\n"
        << Logs();
  }
  for (int i = 1; i <= kHosts; ++i) {
    auto rules = lab_.Exec(Host(i), "iptables -S");
    ASSERT_TRUE(rules.ok()) << rules.status();
    EXPECT_FALSE(absl::StrContains(rules->output, "troupe-chaos")) << Host(i) << rules->output;
  }
}

// A delay on one host's links from the job spec (`delay-node@4:2`, [chaos] delay 20 ms ± 2 ms each
// way for network_fault, 3 s), carried out by that host's node agent with `troupe relay` on an
// NFQUEUE rule (this kernel has no netem): meanwhile a ping from the head's host to it takes at
// least twice the delay. Nobody is declared dead, the job ends on four hosts with the one-host
// weights, and once the fault is over neither the rules nor the relay are left on the host.
TEST_F(MultihostTest, ADelayOnOneHostsLinksFromTheJobSpecChangesNoWeight) {
  pid_t job = StartJob("delay", {"--chaos", "delay-node@4:2"});
  std::string node;  // the delayed host, once its agent says the delay is on
  const auto until = std::chrono::steady_clock::now() + seconds(60);
  while (node.empty() && std::chrono::steady_clock::now() < until) {
    for (int i = 1; i <= kHosts && node.empty(); ++i) {
      if (absl::StrContains(Slurp(absl::StrCat(dir_, "/logs/node-", Host(i), ".txt")),
                            "chaos: delay of this host's links for 3000 ms (20 ms ± 2 ms")) {
        node = Host(i);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(node.empty()) << Logs();
  absl::StatusOr<lab::ProbeResult> probe = lab_.Probe(HeadHost(), node, 10);
  ASSERT_TRUE(probe.ok()) << probe.status();
  printf("lab: head -> %s with its links delayed 20 ms ± 2 ms: %s\n", node.c_str(),
         probe->Describe().c_str());
  EXPECT_GE(probe->rtt_ms, 36) << "the delay did not hold the packets";
  const JobRun r = Finish("delay", job);
  ExpectFinished("delay", r, kHosts, 0);
  printf("the job with the delay: %.1f s\n", r.seconds);
  ASSERT_EQ(
      FindEvents(Events("delay"), "fault_armed", {{"kind", "delay-node"}, {"node", node}}).size(),
      1u)
      << Logs();
  EXPECT_TRUE(absl::StrContains(Slurp(absl::StrCat(dir_, "/logs/node-", node, ".txt")),
                                "troupe relay: queue 7117"))
      << Logs();
  // The heal: 3 s after the fault began, no rule and no relay are left.
  std::string left;
  const auto healed_by = std::chrono::steady_clock::now() + seconds(15);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto seen = lab_.Exec(node, "iptables -S | grep troupe-chaos; pgrep -fa '[r]elay --queue'");
    ASSERT_TRUE(seen.ok()) << seen.status();
    left = seen->output;
  } while (!left.empty() && std::chrono::steady_clock::now() < healed_by);
  EXPECT_EQ(left, "") << "left on " << node;
}

// The coordinator's host cut off both ways: no split brain. The head stops renewing the cut-off
// coordinator's lease, so it records, commits and checkpoints nothing more and stops (lease_lost);
// the head declares its worker dead and the job supervisor starts another coordinator, whose
// lease's later epoch claims the checkpoint store. After the heal the host joins again with a new
// worker. Every step is committed once, and the job ends with the one-host weights.
TEST_F(MultihostTest, ACoordinatorCutOffFromTheHeadStopsAndAnotherFinishesTheJob) {
  SetSteps(kRejoinSteps);
  pid_t job = StartAndWaitForCommits("cutc", HoldForRejoin(12));
  const int coordinator = CoordinatorHost("cutc");
  ASSERT_GT(coordinator, 0) << Logs();
  ASSERT_TRUE(lab_.Cut(Host(coordinator)).ok());
  // The cut-off incarnation gives up its lease within seconds of the cut.
  std::vector<SupervisionEvent> lost;
  const auto until = std::chrono::steady_clock::now() + seconds(30);
  while ((lost = FindEvents(Events("cutc"), "lease_lost")).empty() &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(lost.size(), 1u) << Logs();
  printf("the cut-off side: %s\n", base::FormatEvent(lost[0]).c_str());
  EXPECT_TRUE(absl::StrContains(lost[0].reason, "the head did not grant or renew it")) << Logs();
  ASSERT_TRUE(lab_.Heal(Host(coordinator)).ok());
  JobRun r = Finish("cutc", job);
  ExpectFinished("cutc", r, kHosts, -1);
  EXPECT_TRUE(HasEvent("cutc", "coordinator_restarted", {})) << Logs();
  EXPECT_TRUE(HasEvent("cutc", "join_folded", {{"child", Host(coordinator) + "/w1"}})) << Logs();
  // Its epoch is below the one that holds the store now.
  const std::string fence = Slurp(dir_ + "/cutc/ckpt/FENCE");
  EXPECT_LT(std::stoull(lost[0].Field("epoch")), std::stoull(fence)) << fence << Logs();
}

// 1% loss each way on every host's link and a 100 Mbit/s cap: TCP and UCX retransmit, heartbeats
// arrive late, and the job still ends on four hosts with the one-host weights. Prints what the
// network achieved and the slowdown against the same job on the clear network.
TEST_F(MultihostTest, OnePercentLossAndA100MbitCapOnEveryLinkChangeNoWeight) {
  const JobRun clear = Finish("clear", StartJob("clear", {}));
  ExpectFinished("clear", clear, kHosts, 0);
  for (int i = 1; i <= kHosts; ++i) ASSERT_TRUE(lab_.Shape(Host(i), 1, 100).ok());
  absl::StatusOr<lab::ProbeResult> probe = lab_.Probe(Host(2), Host(3), 500);
  ASSERT_TRUE(probe.ok()) << probe.status();
  printf("lab: h2 -> h3 across two links with 1%% loss each way: %s\n", probe->Describe().c_str());
  EXPECT_GT(probe->loss, 0) << "no loss achieved";
  const JobRun shaped = Finish("shaped", StartJob("shaped", {}));
  ExpectFinished("shaped", shaped, kHosts, 0);
  printf("job: %.2f s on the clear network, %.2f s with loss and the cap (%.2fx)\n", clear.seconds,
         shaped.seconds, shaped.seconds / clear.seconds);
}

// The head (h5) unreachable from the coordinator's host, and only from it, for a second, within
// the head's grace window (its 5 s heartbeat timeout): the host's worker trains on with the others,
// the coordinator's actions that need its lease wait for the renewal and go on. Nothing is
// regenerated.
TEST_F(MultihostTest, TheHeadUnreachableFromOneHostWithinTheGraceWindowChangesNothing) {
  SetSteps(60);
  pid_t job = StartAndWaitForCommits("grace");
  const int coordinator = CoordinatorHost("grace");
  ASSERT_GT(coordinator, 0) << Logs();
  const auto cut = std::chrono::steady_clock::now();
  ASSERT_TRUE(lab_.Cut(Host(coordinator), "both", HeadHost()).ok());
  std::this_thread::sleep_for(seconds(1));
  ASSERT_TRUE(lab_.Heal(Host(coordinator)).ok());
  // TCP's retransmission backoff stretches a cut of D seconds to up to ~2D of silence on the
  // connections that lost packets, so the cut must stay well inside half the grace window.
  printf("the head cut off from its host for at most %.2f s (cut and heal included)\n",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count());
  JobRun r = Finish("grace", job);
  ExpectFinished("grace", r, kHosts, 0);
  EXPECT_EQ(r.report.generations, 1) << r.output << Logs();
  EXPECT_FALSE(HasEvent("grace", "lease_lost", {})) << Logs();
}

// The head unreachable from one worker host (the others reach both) for longer than its grace
// window (the default 1 s heartbeat timeout): the job's own messages do not pass through the head,
// so it trains on with that host until the head declares the host's worker silent; then the worker
// is fenced like a partitioned host's, and the job ends on the others.
TEST_F(MultihostTest, TheHeadUnreachableFromOneHostBeyondTheGraceWindowFencesIt) {
  SetSteps(150);
  pid_t job = StartAndWaitForCommits("nohead");
  const int coordinator = CoordinatorHost("nohead");
  const int victim = coordinator == kHosts ? kHosts - 1 : kHosts;
  ASSERT_TRUE(lab_.Cut(Host(victim), "both", HeadHost()).ok());
  JobRun r = Finish("nohead", job);
  ExpectFinished("nohead", r, kHosts - 1, -1);
  EXPECT_TRUE(DeclaredSilent("nohead", victim)) << Logs();
}

// kill -9 of the head (on its own host) mid-run, started again there from its store 0.3 s later
// as systemd would: the job's processes on the four worker hosts talk over their own
// connections, rejoin the new head, and the job ends on all four with nothing lost and the
// one-host weights.
TEST_F(MultihostTest, TheHeadKilledAndRestartedMidRunLosesNothing) {
  SetSteps(60);
  pid_t job = StartAndWaitForCommits("headkill");
  ASSERT_GT(head_pid_, 0);
  ASSERT_EQ(kill(head_pid_, SIGKILL), 0);
  waitpid(head_pid_, nullptr, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  head_pid_ = Run(HeadHost(), head_argv_, dir_ + "/logs/head2.txt");
  JobRun r = Finish("headkill", job);
  ExpectFinished("headkill", r, kHosts, 0);
  EXPECT_TRUE(HasEvent("headkill", "head_lost", {})) << Logs();
  EXPECT_TRUE(HasEvent("headkill", "head_back", {})) << Logs();
  EXPECT_FALSE(HasEvent("headkill", "lease_lost", {})) << Logs();
  EXPECT_EQ(r.report.generations, 1) << r.output << Logs();
}

// A flapping link: one worker host's link down and up every 1.5 s, four times, mid-run. Each cut
// may get its worker declared dead and the host joining again with a new one; the job ends with
// the one-host weights and every step committed and served once.
TEST_F(MultihostTest, AFlappingLinkEndsWithTheOneHostWeights) {
  SetSteps(150);
  pid_t job = StartAndWaitForCommits("flap");
  const int coordinator = CoordinatorHost("flap");
  const int victim = coordinator == kHosts ? kHosts - 1 : kHosts;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(lab_.Cut(Host(victim)).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ASSERT_TRUE(lab_.Heal(Host(victim)).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  JobRun r = Finish("flap", job);
  ExpectFinished("flap", r, -1, -1);
  printf("flapping: %d generations, final world %d\n", r.report.generations, r.report.world);
}

// The link between two worker hosts cut, both ways; each still reaches the head and the
// coordinator. Only the collectives notice: the failed generations all name the pair, and after
// three the later-ranked of the two is left out. The job ends on three hosts.
TEST_F(MultihostTest, ACutLinkBetweenTwoWorkerHostsLeavesOneOfThemOut) {
  pid_t job = StartAndWaitForCommits("link");
  const int coordinator = CoordinatorHost("link");
  ASSERT_GT(coordinator, 0) << Logs();
  std::vector<int> others;
  for (int i = 1; i <= kHosts; ++i) {
    if (i != coordinator) others.push_back(i);
  }
  ASSERT_TRUE(lab_.Cut(Host(others[0]), "both", Host(others[1])).ok());
  JobRun r = Finish("link", job);
  ExpectFinished("link", r, kHosts - 1, -1);
  bool left_out = false;
  for (const SupervisionEvent& e :
       FindEvents(Events("link"), "generation", {{"trigger", "worker_down"}})) {
    left_out |= absl::StrContains(e.reason, "unreachable: its peers' collectives failed on it");
  }
  EXPECT_TRUE(left_out) << Logs();
}

// 5 ms ± 1 ms of round trip and about 1% loss each way between any two worker hosts (a packet is
// held 2.5 ms ± 0.5 ms once, and each of the two links it crosses drops 0.5%): the job ends with
// the one-host weights; prints what the network achieved and the slowdown.
TEST_F(MultihostTest, LatencyJitterAndLossBetweenHostsChangeNoWeight) {
  const JobRun clear = Finish("clear", StartJob("clear", {}));
  ExpectFinished("clear", clear, kHosts, 0);
  for (int i = 1; i <= kHosts; ++i) {
    ASSERT_TRUE(lab_.Delay(Host(i), 2.5, 0.5).ok());
    ASSERT_TRUE(lab_.Shape(Host(i), 0.5, 0).ok());
  }
  absl::StatusOr<lab::ProbeResult> probe = lab_.Probe(Host(2), Host(3), 300);
  ASSERT_TRUE(probe.ok()) << probe.status();
  printf("lab: h2 -> h3, held 2.5 ms ± 0.5 ms, 0.5%% loss on each link, each way: %s\n",
         probe->Describe().c_str());
  EXPECT_GT(probe->rtt_ms, 4);
  EXPECT_LT(probe->rtt_ms, 7);
  const JobRun slow = Finish("slow", StartJob("slow", {}));
  ExpectFinished("slow", slow, kHosts, 0);
  printf("job: %.2f s on the clear network, %.2f s with latency, jitter and loss (%.2fx)\n",
         clear.seconds, slow.seconds, slow.seconds / clear.seconds);
}

// A one-way partition: what one worker host sends is dropped, what is sent to it arrives. The
// head stops hearing from the host and declares its worker (or its whole node) dead; its fence
// gets there, so the worker is killed rather than left running on stale state. The job ends on
// the other three.
TEST_F(MultihostTest, AOneWayPartitionIsFencedLikeAFullOne) {
  pid_t job = StartAndWaitForCommits("oneway");
  const int coordinator = CoordinatorHost("oneway");
  const int victim = coordinator == kHosts ? kHosts - 1 : kHosts;
  ASSERT_TRUE(lab_.Cut(Host(victim), "out").ok());
  JobRun r = Finish("oneway", job);
  ExpectFinished("oneway", r, kHosts - 1, -1);
  EXPECT_TRUE(DeclaredSilent("oneway", victim)) << Logs();
  // The node agent, which still hears the head, killed it as fenced (its own log says so).
  const std::string agent_log = lab_.shared_dir() + "/t/logs/node-" + Host(victim) + ".txt";
  const auto until = std::chrono::steady_clock::now() + seconds(10);
  while (!absl::StrContains(Slurp(agent_log), "cause=fenced") &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(absl::StrContains(Slurp(agent_log), "cause=fenced")) << Slurp(agent_log);
}

// Every process with a certificate that names its host's address (`troupe certs --members
// NAME=ADDR`): the cluster forms across hosts over mutual TLS and a job loses a worker to kill -9.
TEST_F(MultihostTest, MutualTlsAcrossHostsTrainsThroughAKill) {
  ASSERT_FALSE(certs_.empty());
  const std::string head_log = Slurp(dir_ + "/logs/head.txt");
  EXPECT_TRUE(absl::StrContains(head_log, "mutual TLS")) << head_log;
  JobRun r = RunWithChaos("tls", "kill-worker@6");
  ExpectFinished("tls", r, kHosts - 1, -1);
}

TEST_F(MultihostTest, StoppedWorkerOnOneHostIsFencedAndLeftBehind) {
  ExpectFinished("stop", RunWithChaos("stop", "stop-worker@7"), kHosts - 1, 0);
  EXPECT_TRUE(HasEvent("stop", "fault_fired", {{"kind", "stop-worker"}})) << Logs();
}

TEST_F(MultihostTest, SigtermDrainsOneHostAtAStepBoundary) {
  ExpectFinished("drain", RunWithChaos("drain", "sigterm-node@6"), kHosts - 1, 0);
  EXPECT_TRUE(HasEvent("drain", "generation", {{"trigger", "drain"}, {"world", "3"}})) << Logs();
}

TEST_F(MultihostTest, KilledCoordinatorIsRestartedOnAnotherHost) {
  // On a running cluster the coordinator shares a worker with a rank: that rank goes with it.
  ExpectFinished("coord", RunWithChaos("coord", "kill-coordinator@6"), kHosts - 1, 0);
  EXPECT_TRUE(HasEvent("coord", "coordinator_restarted", {{"step", "6"}})) << Logs();
}

TEST_F(MultihostTest, CrashInACheckpointWriteOnSharedStorageLeavesLatestComplete) {
  ExpectFinished("ckpt", RunWithChaos("ckpt", "crash-in-checkpoint@10"), -1, -1);
  EXPECT_TRUE(HasEvent("ckpt", "coordinator_restarted", {{"checkpoint_step", "5"}})) << Logs();
}

TEST_F(MultihostTest, TwoWorkersPerHostMirrorOnTheOtherHostSoAHostLossLosesNoStep) {
  // Ranks h1/w0 h1/w1 h2/w0 h2/w1: each rank's buddy is two ranks on, on the other host. Losing
  // all of h2 at once (both owners of two ranges) restores from their mirrors on h1.
  const JobRun r = PullPlugsMidRun("domain", {2});
  ExpectFinished("domain", r, 2, 0);
  EXPECT_TRUE(HasEvent("domain", "generation",
                       {{"world", "4"}, {"buddy", "2"}, {"buddies_in_owner_domain", "0"}}))
      << Logs();
  EXPECT_TRUE(HasEvent("domain", "generation", {{"world", "2"}, {"source", "mirrors"}})) << Logs();
}

TEST_F(MultihostTest, AStalledCoordinatorIsReportedHungAndTakesNoRankOut) {
  // Found by an until-fail run: the coordinator's actor, stalled 10 s on a loaded disk, was
  // reported hung by the head, and the coordinator took that report for its host's rank.
  ExpectFinished("stall", RunWithChaos("stall", "stall-coordinator@6"), kHosts, 0);
  EXPECT_TRUE(HasEvent("stall", "fault_fired", {{"kind", "stall-coordinator"}})) << Logs();
  const std::string head = Slurp(dir_ + "/logs/head.txt");
  EXPECT_TRUE(absl::StrContains(head, "event=actor_hung subject=t.") &&
              absl::StrContains(head, ".coordinator "))
      << "the head did not report the stalled coordinator hung\n"
      << head;
  EXPECT_TRUE(FindEvents(Events("stall"), "generation", {{"trigger", "worker_down"}}).empty())
      << Logs();
}

TEST_F(MultihostTest, ShardOwnerAndBuddyOnTwoHostsKilledTogetherRestoreFromDisk) {
  // Step 10's checkpoint, killed in step 12: two steps are trained again (and served again).
  ExpectFinished("both", RunWithChaos("both", "kill-shard-and-buddy@12"), -1, 2,
                 /*exactly_once=*/false);
  EXPECT_TRUE(HasEvent("both", "generation", {{"source", "checkpoint"}, {"step", "10"}})) << Logs();
}

}  // namespace
}  // namespace troupe::testing
