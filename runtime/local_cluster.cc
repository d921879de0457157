#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "internal/process.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime {

std::vector<std::string> LocalCluster::RoleArgs() const {
  const ClusterOptions& c = options_.cluster;
  std::vector<std::string> a = {"--heartbeat_interval",
                                FormatDuration(c.heartbeat_interval),
                                "--heartbeat_timeout",
                                FormatDuration(c.heartbeat_timeout),
                                "--hung_timeout",
                                FormatDuration(c.hung_timeout),
                                "--head_grace",
                                FormatDuration(c.head_grace),
                                "--log_dir",
                                c.log_dir};
  a.insert(a.end(), options_.extra_args.begin(), options_.extra_args.end());
  return a;
}

std::string LocalCluster::LogDir() const {
  return options_.cluster.log_dir.empty() ? dir_ : options_.cluster.log_dir;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(Options options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->options_ = std::move(options);
  std::error_code ec;
  std::string tmpl = (std::filesystem::temp_directory_path(ec) / "troupe-cluster-XXXXXX").string();
  if (ec || !mkdtemp(tmpl.data())) {
    return absl::UnavailableError(absl::StrCat("mkdtemp(", tmpl, "): ", std::strerror(errno)));
  }
  c->dir_ = tmpl;
  // The head's and node agents' logs sit beside the workers' (<log_dir>), where an operator
  // looks: they hold the membership changes and every reaped worker's process_exit event.
  std::filesystem::create_directories(c->LogDir(), ec);
  TROUPE_RETURN_IF_ERROR(c->StartHead(0));
  if (c->options_.keep_head) c->keeper_ = std::thread([raw = c.get()] { raw->KeepHead(); });
  if (c->options_.workers > 0) {
    auto node = c->AddNode("local", c->options_.workers,  // a cpu slot per worker
                           absl::StrCat("cpu=", std::max(1, c->options_.workers)));
    if (!node.ok()) return node.status();
  }
  return c;
}

absl::Status LocalCluster::StartHead(uint16_t port) {
  ++head_starts_;
  const std::string port_file = absl::StrCat(dir_, "/head-", head_starts_, ".port");
  internal::ProcessSpec head;
  head.path = options_.binary;
  const std::string http_file = absl::StrCat(dir_, "/head-", head_starts_, ".http");
  head.args = {"head",        "--port",      absl::StrCat(port),
               "--port_file", port_file,     "--http_port_file",
               http_file,     "--http_port", absl::StrCat(http_port_)};
  if (options_.head_store) head.args.insert(head.args.end(), {"--store", dir_ + "/head.db"});
  for (auto& a : RoleArgs()) head.args.push_back(a);
  for (auto& a : options_.head_args) head.args.push_back(a);
  // Appended: a restarted head's lines follow its predecessor's.
  head.stdout_path = LogDir() + "/head.out";
  head.stderr_path = LogDir() + "/head.err";
  head.append = true;
  TROUPE_ASSIGN_OR_RETURN(auto pid, internal::StartProcess(head));
  head_pid_ = pid;
  uint16_t bound = 0;
  for (int i = 0; i < 1000 && bound == 0; ++i) {
    std::ifstream in(port_file);
    int p = 0;
    if (in >> p) bound = static_cast<uint16_t>(p);
    int status;
    if (bound == 0 && waitpid(head_pid_, &status, WNOHANG) == head_pid_) {
      head_pid_ = 0;
      return absl::UnavailableError(
          absl::StrCat("head exited: ", internal::DescribeWaitStatus(status),
                       "; stderr: ", internal::TailFile(head.stderr_path, 10)));
    }
    if (bound == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (bound == 0) return absl::DeadlineExceededError("head did not report its port in 10s");
  port_ = bound;
  std::ifstream http(http_file);  // written before the port file
  int h = 0;
  if (http >> h) http_port_ = h;
  return absl::OkStatus();
}

void LocalCluster::KeepHead() {
  while (true) {
    int status = 0;
    const pid_t pid = head_pid_.load();
    if (pid <= 0 || waitpid(pid, &status, 0) != pid) return;
    std::lock_guard<std::mutex> lock(head_mu_);
    head_pid_ = 0;
    if (stopping_) return;
    const std::string why = internal::DescribeWaitStatus(status);
    // A head that cannot start again (its port taken meanwhile): tried again shortly; the
    // members wait out their head_grace meanwhile.
    absl::Status started = StartHead(port_);
    for (int i = 0; !started.ok() && i < 50 && !stopping_; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      started = StartHead(port_);
    }
    std::ofstream(LogDir() + "/head.err", std::ios::app)
        << "troupe local cluster: the head " << why << "; "
        << (started.ok() ? absl::StrCat("started again, pid ", head_pid_.load())
                         : absl::StrCat("cannot start it again: ", started.message()))
        << std::endl;
    if (!started.ok()) return;
  }
}

absl::Status LocalCluster::RestartHead() {
  if (head_pid_ > 0) {
    // A head just killed may take a moment to finish dying.
    int status;
    pid_t done = 0;
    for (int i = 0; i < 500 && done == 0; ++i) {
      done = waitpid(head_pid_, &status, WNOHANG);
      if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (done != head_pid_) {
      return absl::FailedPreconditionError(
          absl::StrCat("RestartHead: the head (pid ", head_pid_.load(), ") is still running"));
    }
    head_pid_ = 0;
  }
  return StartHead(port_);
}

absl::StatusOr<pid_t> LocalCluster::AddNode(const std::string& name, int workers,
                                            const std::string& resources, const std::string& labels,
                                            const std::vector<std::string>& extra_args,
                                            const std::map<std::string, std::string>& env) {
  internal::ProcessSpec node;
  node.env = env;
  node.path = options_.binary;
  node.args = {"node",
               "--head",
               absl::StrCat("127.0.0.1:", port_),
               "--name",
               name,
               "--workers",
               absl::StrCat(workers),
               "--resources",
               resources};
  if (!labels.empty()) node.args.insert(node.args.end(), {"--labels", labels});
  for (auto& a : RoleArgs()) node.args.push_back(a);
  node.args.insert(node.args.end(), extra_args.begin(), extra_args.end());
  node.stdout_path = absl::StrCat(LogDir(), "/node-", name, ".out");
  node.stderr_path = absl::StrCat(LogDir(), "/node-", name, ".err");
  auto pid = internal::StartProcess(node);
  if (pid.ok()) nodes_[name] = *pid;
  return pid;
}

void LocalCluster::SignalNode(const std::string& name, int sig) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return;
  kill(it->second, sig);
  if (sig == SIGKILL || sig == SIGTERM) {
    waitpid(it->second, nullptr, 0);
    nodes_.erase(it);
  }
}

LocalCluster::~LocalCluster() {
  // SIGKILL a node agent and its workers follow it (PR_SET_PDEATHSIG): nothing is orphaned.
  for (auto& [name, pid] : nodes_) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  if (keeper_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(head_mu_);
      stopping_ = true;
      if (head_pid_ > 0) kill(head_pid_, SIGTERM);
    }
    keeper_.join();  // it reaps the head
  } else if (head_pid_ > 0) {
    kill(head_pid_, SIGTERM);
    waitpid(head_pid_, nullptr, 0);
  }
  std::error_code ec;  // nothing is left in /tmp: the port files, the head's store
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace troupe::runtime
