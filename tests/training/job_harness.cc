#include "job_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace troupe::testing {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Report ReadReport(const std::string& path) {
  Report r;
  std::istringstream rep(Slurp(path));
  std::string field;
  while (rep >> field) {
    auto eq = field.find('=');
    if (eq == std::string::npos) continue;
    std::string k = field.substr(0, eq), v = field.substr(eq + 1);
    if (k == "recovery_s") r.recovery_s = std::stod(v);
    if (k == "steps_lost") r.steps_lost = std::stoi(v);
    if (k == "steps") r.steps = std::stoi(v);
    if (k == "world") r.world = std::stoi(v);
    if (k == "crc32c") r.crc = v;
    if (k == "generations") r.generations = std::stoi(v);
    if (k == "val_loss") r.val_loss = std::stod(v);
    if (k == "step_s") r.step_s = std::stod(v);
    if (k == "compute_s") r.compute_s = std::stod(v);
    if (k == "exposed_s") r.exposed_s = std::stod(v);
    if (k == "update_s") r.update_s = std::stod(v);
    if (k == "overlap") r.overlap = std::stod(v);
    if (k == "delta_share") r.delta_share = std::stod(v);
  }
  return r;
}

std::vector<SupervisionEvent> ReadEvents(const std::string& path) {
  std::vector<SupervisionEvent> out;
  std::istringstream in(Slurp(path));
  std::string line;
  while (std::getline(in, line)) {
    SupervisionEvent e;
    if (base::ParseEvent(line, &e)) out.push_back(e);
  }
  return out;
}

std::string FieldOf(const SupervisionEvent& e, const std::string& key) {
  if (key == "child") return e.child;
  if (key == "supervisor") return e.supervisor;
  if (key == "gen") return std::to_string(e.generation);
  if (key == "pid") return std::to_string(e.pid);
  if (key == "signal") return std::to_string(e.signal);
  if (key == "cause") return base::ExitCauseName(e.cause);
  return e.Field(key);
}

std::vector<SupervisionEvent> FindEvents(const std::vector<SupervisionEvent>& events,
                                         const std::string& name, const Fields& fields) {
  std::vector<SupervisionEvent> out;
  for (const SupervisionEvent& e : events) {
    bool match = e.event == name;
    for (const auto& [k, v] : fields) match = match && FieldOf(e, k) == v;
    if (match) out.push_back(e);
  }
  return out;
}

namespace fs = std::filesystem;
using std::chrono::milliseconds;

void JobTest::SetUp() {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string suite = t->test_suite_name();
  for (char& c : suite) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  base_ = fs::temp_directory_path() / absl::StrCat("troupe_", suite, "_", getpid(), "_", t->name());
  fs::remove_all(base_);
  fs::create_directories(base_);
  // One prepared corpus for every job of every test binary (tokenizing takes seconds).
  data_ = fs::temp_directory_path() / "troupe_training_test_data";
  spec_ = base_ + "/job.toml";
  std::ofstream(spec_) << "[job]\nname = \"t\"\nsteps = " << steps_
                       << "\n[model]\nmicrobatches = " << microbatches_ << "\ndata_dir = \""
                       << data_ << "\"\n[elastic]\nmin_workers = 1\nmax_workers = " << max_workers_
                       << "\n"
                       << "[checkpoint]\nevery = 5\nkeep_last = 3\n"
                       << spec_extra_;
}

void JobTest::TearDown() {
  if (!HasFailure() && std::getenv("TROUPE_KEEP_TEST_DIRS") == nullptr) fs::remove_all(base_);
}

pid_t JobTest::Start(const std::string& dir, const std::vector<std::string>& extra) {
  // Its own TMPDIR (the embedded cluster's directory), inside the run's: a job a test kills
  // with SIGKILL leaves nothing in /tmp.
  fs::create_directories(dir + "/tmp");
  std::vector<std::string> args = {"/usr/bin/env", "TMPDIR=" + dir + "/tmp",
                                   TROUPE_BINARY,  "train",
                                   "--spec",       spec_,
                                   "--work_dir",   dir,
                                   "--report",     dir + "/report"};
  args.insert(args.end(), extra.begin(), extra.end());
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    int fd = open((dir + "/out.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

namespace {

// Every thread's backtrace of `pid` (gdb, installed by scripts/setup) into
// /tmp/troupe-hung-<pid>.stacks, and a line on stderr naming that file.
void DumpStacks(pid_t pid) {
  const std::string file = absl::StrCat("/tmp/troupe-hung-", pid, ".stacks");
  const std::string cmd =
      absl::StrCat("gdb -batch -p ", pid, " -ex 'thread apply all bt' >", file, " 2>&1");
  const int rc = std::system(cmd.c_str());
  std::cerr << "job " << pid << " hung; its stacks (gdb rc " << rc << ", " << file << "):\n"
            << Slurp(file) << std::endl;
}

}  // namespace

int JobTest::Wait(pid_t pid, milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      // A job that hangs is a bug: keep every thread's stack of the driver for the report, then
      // kill its process group.
      DumpStacks(pid);
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

JobRun JobTest::Train(const std::string& name, const std::vector<std::string>& extra,
                      milliseconds timeout) {
  const std::string dir = base_ + "/" + name;
  JobRun r;
  r.exit_code = Wait(Start(dir, extra), timeout);
  r.output = Slurp(dir + "/out.txt");
  r.report = ReadReport(dir + "/report");
  return r;
}

const std::string& JobTest::Reference() {
  static std::string crc;
  if (!crc.empty()) return crc;
  // One fault-free run per binary and spec, shared by every test process (CTest runs each test
  // in its own): keyed by the troupe binary (size, mtime) and the spec's text.
  struct stat b {};
  stat(TROUPE_BINARY, &b);
  const std::string key = absl::StrCat(b.st_size, "-", b.st_mtim.tv_sec, ".", b.st_mtim.tv_nsec,
                                       "-", std::hash<std::string>{}(Slurp(spec_)));
  const std::string cached = absl::StrCat(data_, "/reference-", key, ".crc");
  crc = Slurp(cached);
  if (!crc.empty()) return crc;
  JobRun r = Train("reference", {"--workers", "4"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  crc = r.report.crc;
  if (r.exit_code == 0 && !crc.empty()) {
    const std::string tmp = absl::StrCat(cached, ".", getpid());
    std::ofstream(tmp) << crc;
    std::rename(tmp.c_str(), cached.c_str());
  }
  return crc;
}

void JobTest::ExpectExactlyOnce(const std::string& name, int steps, int64_t steps_lost) {
  EXPECT_EQ(
      ExactlyOnceDefects(base_ + "/" + name, steps < 0 ? steps_ : steps, microbatches_, steps_lost),
      "");
}

std::vector<SupervisionEvent> JobTest::Events(const std::string& name) {
  return ReadEvents(base_ + "/" + name + "/logs/events.log");
}

std::string JobTest::EventLogText(const std::string& name) {
  return Slurp(base_ + "/" + name + "/logs/events.log");
}

bool JobTest::HasEvent(const std::string& run, const std::string& event, const Fields& fields) {
  return !FindEvents(Events(run), event, fields).empty();
}

bool JobTest::WaitForEvent(const std::string& run, const std::string& event, const Fields& fields,
                           std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!HasEvent(run, event, fields)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

int JobTest::Commits(const std::string& dir) {
  std::istringstream log(Slurp(dir + "/commits.log"));
  int n = 0;
  for (std::string line; std::getline(log, line);) ++n;
  return n;
}

}  // namespace troupe::testing
