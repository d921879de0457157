// MultihostTest: elastic training across hosts that behave like separate machines (tests/lab:
// own network, IPC, mount, PID and UTS namespaces, linked through a router). A head on h1, a node
// agent with one worker on each of 4 hosts, `troupe train --head` from h1; the job's directory
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

  void SetUp() override {
    absl::Status up = lab_.Up(kHosts);
    ASSERT_TRUE(up.ok()) << up;
    dir_ = lab_.shared_dir() + "/t";
    fs::create_directories(dir_ + "/logs");
    spec_ = dir_ + "/job.toml";
    std::ofstream(spec_) << "[job]\nname = \"t\"\nsteps = " << kSteps
                         << "\n[model]\nmicrobatches = " << kMicrobatches << "\ndata_dir = \""
                         << dir_ << "/data\"\n[elastic]\nmin_workers = 2\nmax_workers = 6\n"
                         << "[checkpoint]\nevery = 5\nkeep_last = 3\n";
    head_ = absl::StrCat(lab_.Address(Host(1)), ":", kPort);
    Run(Host(1), {TROUPE_BINARY, "head", "--host", lab_.Address(Host(1)), "--port", kPort},
        dir_ + "/logs/head.txt");
    for (int i = 1; i <= kHosts; ++i) {
      Run(Host(i),
          {TROUPE_BINARY, "node", "--head", head_, "--name", Host(i), "--workers", "1",
           "--log_dir", dir_ + "/logs", "--grace", "5s"},
          absl::StrCat(dir_, "/logs/node-", Host(i), ".txt"));
    }
    // The node agents keep trying until the head listens; every worker carries the address its
    // node advertises (the interface on the route to the head).
    auto status = lab_.Exec(Host(1), Quote({TROUPE_BINARY, "status", "--head", head_,
                                             "--wait_workers", std::to_string(kHosts)}));
    ASSERT_TRUE(status.ok()) << status.status();
    ASSERT_EQ(status->exit_code, 0) << status->output << Logs();
    for (int i = 1; i <= kHosts; ++i) {
      EXPECT_TRUE(absl::StrContains(
          status->output, absl::StrCat(Host(i), "/w0 worker alive ", Host(i), " ",
                                       lab_.Address(Host(i)), " ", Host(i), " ")))
          << status->output;
    }
  }

  void TearDown() override {
    absl::Status down = lab_.Down();
    EXPECT_TRUE(down.ok()) << down;
  }

  // Starts argv on `host`, output to `log`.
  pid_t Run(const std::string& host, const std::vector<std::string>& argv, const std::string& log) {
    auto pid = lab_.Spawn(host, {"sh", "-c", absl::StrCat("exec ", Quote(argv), " >", log, " 2>&1")});
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.ok() ? *pid : -1;
  }

  // `troupe train --head` from h1 on the lab's cluster, in <shared>/t/<name>.
  pid_t StartJob(const std::string& name, const std::vector<std::string>& extra) {
    const std::string work = dir_ + "/" + name;
    fs::create_directories(work);
    std::vector<std::string> args = {TROUPE_BINARY, "train",  "--spec",   spec_,  "--head",
                                     head_,         "--work_dir", work, "--report", work + "/report"};
    args.insert(args.end(), extra.begin(), extra.end());
    return Run(Host(1), args, work + "/out.txt");
  }

  JobRun Finish(const std::string& name, pid_t pid) {
    JobRun r;
    r.exit_code = WaitFor(pid, seconds(240));
    r.output = Slurp(dir_ + "/" + name + "/out.txt");
    r.report = ReadReport(dir_ + "/" + name + "/report");
    return r;
  }

  // The same job on one host (the embedded cluster, 4 workers), run here: its final weights
  // (computed once per test binary).
  std::string OneHostCrc() {
    static std::string crc;
    if (!crc.empty()) return crc;
    const std::string work = dir_ + "/onehost";
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
    EXPECT_EQ(ExactlyOnceDefects(dir_ + "/" + name, kSteps, kMicrobatches), "");
  }

  std::vector<SupervisionEvent> Events(const std::string& name) {
    return ReadEvents(dir_ + "/" + name + "/logs/events.log");
  }

  lab::Lab lab_{LabName()};
  std::string dir_, spec_, head_;
};

TEST_F(MultihostTest, FourHostsTrainToTheWeightsOfOneHost) {
  JobRun r = Finish("plain", StartJob("plain", {}));
  ASSERT_EQ(r.exit_code, 0) << r.output << Logs();
  EXPECT_EQ(r.report.world, kHosts) << r.output;
  EXPECT_EQ(r.report.steps, kSteps) << r.output;
  EXPECT_EQ(r.report.crc, OneHostCrc()) << "4 hosts vs one host\n" << r.output;
  ExpectExactlyOnce("plain");
}

TEST_F(MultihostTest, KillDashNineOfOneHostsWorkerFinishesOnThree) {
  JobRun r = Finish("kill", StartJob("kill", {"--chaos", "kill-worker@7"}));
  ASSERT_EQ(r.exit_code, 0) << r.output << Logs();
  const std::vector<SupervisionEvent> fired =
      FindEvents(Events("kill"), "fault_fired", {{"kind", "kill-worker"}, {"step", "7"}});
  ASSERT_EQ(fired.size(), 1u) << Slurp(dir_ + "/kill/logs/events.log");
  // The next generation restored step 7 on the three others (the killed rank may have hosted
  // the coordinator too: then its restart formed that generation).
  const std::vector<SupervisionEvent> next =
      FindEvents(Events("kill"), "generation", {{"world", "3"}, {"step", "7"}});
  ASSERT_EQ(next.size(), 1u) << Slurp(dir_ + "/kill/logs/events.log");
  EXPECT_FALSE(absl::StrContains(next[0].Field("workers"), fired[0].child))
      << Slurp(dir_ + "/kill/logs/events.log");
  EXPECT_EQ(r.report.world, kHosts - 1) << r.output;
  EXPECT_EQ(r.report.steps_lost, 0) << r.output;
  EXPECT_EQ(r.report.crc, OneHostCrc()) << r.output;
  ExpectExactlyOnce("kill");
}

TEST_F(MultihostTest, AHostThatLosesPowerIsLeftBehind) {
  pid_t job = StartJob("plug", {});
  const auto until = std::chrono::steady_clock::now() + seconds(120);
  while (Commits("plug") < 3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(Commits("plug"), 3) << Slurp(dir_ + "/plug/out.txt") << Logs();
  // Every process of h3 (its node agent and worker) dies at once.
  absl::Status pulled = lab_.PullPlug(Host(3));
  ASSERT_TRUE(pulled.ok()) << pulled;
  JobRun r = Finish("plug", job);
  ASSERT_EQ(r.exit_code, 0) << r.output << Logs();
  EXPECT_EQ(r.report.world, kHosts - 1) << r.output;
  EXPECT_EQ(r.report.crc, OneHostCrc()) << r.output;
  ExpectExactlyOnce("plug");
  // The head saw the node go.
  bool node_dead = false;
  for (const SupervisionEvent& e : FindEvents(Events("plug"), "process_exit")) {
    node_dead |= e.child == Host(3);
  }
  EXPECT_TRUE(node_dead) << Slurp(dir_ + "/plug/logs/events.log");
}

}  // namespace
}  // namespace troupe::testing
