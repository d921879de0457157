// Private test harness: fork/exec one collectives_ucx_helper process per rank, with the TCP
// bootstrap served from the test process, and read each rank's stdout line by line.
#ifndef TROUPE_COLLECTIVES_PROCESS_HARNESS_H_
#define TROUPE_COLLECTIVES_PROCESS_HARNESS_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "troupe/collectives/bootstrap.h"

namespace troupe::collectives {

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// One helper process per rank, with its stdout read line by line.
struct Proc {
  pid_t pid = -1;
  FILE* out = nullptr;
  std::vector<std::string> lines;
  int status = -1;

  bool ReadLine(std::string* line) {
    char buf[4096];
    if (std::fgets(buf, sizeof(buf), out) == nullptr) return false;
    *line = buf;
    if (!line->empty() && line->back() == '\n') line->pop_back();
    lines.push_back(*line);
    return true;
  }
  int Wait() {
    std::string l;
    while (ReadLine(&l)) {
    }
    waitpid(pid, &status, 0);
    fclose(out);
    return status;
  }
  std::string Output() const { return absl::StrJoin(lines, "\n"); }
};

class Ranks {
 public:
  Ranks(int n, const std::vector<std::string>& args) {
    auto server = TcpBootstrapServer::Start();
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    for (int r = 0; r < n; ++r) {
      int fds[2];
      EXPECT_EQ(pipe(fds), 0);
      std::vector<std::string> argv = {COLLECTIVES_UCX_HELPER, std::to_string(server_->port()),
                                       std::to_string(r), std::to_string(n)};
      argv.insert(argv.end(), args.begin(), args.end());
      pid_t pid = fork();
      if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        std::vector<char*> a;
        for (auto& s : argv) a.push_back(s.data());
        a.push_back(nullptr);
        execv(a[0], a.data());
        _exit(127);
      }
      close(fds[1]);
      procs_.push_back(Proc{pid, fdopen(fds[0], "r"), /*lines=*/{}});
    }
  }
  ~Ranks() {
    for (auto& p : procs_) {
      if (p.status == -1) {
        kill(p.pid, SIGKILL);
        p.Wait();
      }
    }
  }
  Proc& operator[](int r) { return procs_[r]; }
  int size() const { return static_cast<int>(procs_.size()); }

 private:
  std::unique_ptr<TcpBootstrapServer> server_;
  std::vector<Proc> procs_;
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_PROCESS_HARNESS_H_
