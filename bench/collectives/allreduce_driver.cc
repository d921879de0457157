// bench_collectives_allreduce: troupe-UCX all-reduce latency and bus bandwidth across real
// processes, plus this machine's single-threaded memcpy bandwidth. Used by
// bench/compare-collectives, which runs it alternately with OpenMPI and Gloo.
//
//   bench_collectives_allreduce --np 2 [--sizes 8,1024,...] [--transports]
//   bench_collectives_allreduce --memcpy
// Prints one line per size: "allreduce np=<n> bytes=<b> iters=<k> us=<t> busbw_gbps=<g>"
// (time is the slowest rank's mean per operation; busbw = algbw * 2(n-1)/n).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "troupe/collectives/bootstrap.h"
#include "troupe/collectives/ucx_communicator.h"

extern char** environ;

namespace tc = troupe::collectives;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<size_t> ParseSizes(const std::string& s) {
  std::vector<size_t> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    out.push_back(std::strtoull(s.substr(pos, end - pos).c_str(), nullptr, 10));
    pos = end + 1;
  }
  return out;
}

constexpr int kStartupWarmup = 100000;  // 8-byte all-reduces before the first size

int Iters(size_t bytes) {
  const double budget = 64.0 * (1 << 20) * 8;  // ~512 MiB moved per size
  return static_cast<int>(std::clamp(budget / std::max<size_t>(bytes, 1024), 3.0, 20000.0));
}

int Worker(int port, int rank, int np, const std::vector<size_t>& sizes, bool transports) {
  auto boot = tc::TcpBootstrapClient::Connect("127.0.0.1", port);
  if (!boot.ok()) return std::fprintf(stderr, "%s\n", boot.status().ToString().c_str()), 2;
  tc::UcxOptions o;
  o.rank = rank;
  o.size = np;
  o.key_prefix = "bench";
  auto comm = tc::CreateUcxCommunicator(boot->get(), o);
  if (!comm.ok()) return std::fprintf(stderr, "%s\n", comm.status().ToString().c_str()), 2;
  tc::Communicator& c = **comm;
  size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  std::vector<float> buf(max_bytes / 4 + 1, 1.0f);
  tc::CollectiveOptions opts;
  // Start-up warm-up, as the OpenMPI and Gloo programs of compare-collectives do: the first
  // ~200 ms after a launch run slower (threads starting, pages faulting in, CPUs waking).
  for (int i = 0; i < kStartupWarmup; ++i) {
    if (!c.AllReduce(tc::Buffer::F32(buf.data(), 2), tc::Buffer::F32(buf.data(), 2),
                     tc::ReduceOp::kMax, opts)
             .Wait()
             .ok()) {
      return 3;
    }
  }
  for (size_t bytes : sizes) {
    const size_t count = std::max<size_t>(bytes / 4, 1);
    tc::Buffer b = tc::Buffer::F32(buf.data(), count);
    const int iters = Iters(bytes);
    for (int i = 0; i < std::min(iters, 200); ++i) {  // warm-up (wires up, registers memory)
      if (!c.AllReduce(b, b, tc::ReduceOp::kSum, opts).Wait().ok()) return 3;
    }
    if (!c.Barrier(opts).Wait().ok()) return 3;
    const double t0 = Now();
    for (int i = 0; i < iters; ++i) {
      absl::Status st = c.AllReduce(b, b, tc::ReduceOp::kSum, opts).Wait();
      if (!st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 3;
    }
    float us = static_cast<float>((Now() - t0) / iters * 1e6);
    if (!c.AllReduce(tc::Buffer::F32(&us, 1), tc::Buffer::F32(&us, 1), tc::ReduceOp::kMax, opts)
             .Wait()
             .ok()) {
      return 3;
    }
    std::fill(buf.begin(), buf.begin() + count, 1.0f);  // keep values finite
    if (rank == 0) {
      const double algbw = static_cast<double>(count * 4) / (us * 1e-6) / 1e9;
      std::printf("allreduce np=%d bytes=%zu iters=%d us=%.3f busbw_gbps=%.3f\n", np, count * 4,
                  iters, us, algbw * 2.0 * (np - 1) / np);
      std::fflush(stdout);
    }
  }
  if (transports && rank == 0) {
    std::printf("%s", tc::DescribeUcxTransports(&c).c_str());
    std::fflush(stdout);
  }
  return 0;
}

int Memcpy() {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const double t0 = Now();
    std::memcpy(b.data(), a.data(), bytes);
    const double t = Now() - t0;
    best = std::max(best, bytes / t / 1e9);
    std::swap(a, b);
  }
  std::printf("memcpy bytes=%zu gbps=%.3f\n", bytes, best);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int np = 2, port = 0, rank = -1;
  bool transports = false;
  std::vector<size_t> sizes = {8, 1024, size_t{1} << 20, size_t{64} << 20};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--memcpy") return Memcpy();
    if (a == "--np" && i + 1 < argc) np = std::atoi(argv[++i]);
    if (a == "--sizes" && i + 1 < argc) sizes = ParseSizes(argv[++i]);
    if (a == "--transports") transports = true;
    if (a == "--worker" && i + 2 < argc) port = std::atoi(argv[++i]), rank = std::atoi(argv[++i]);
  }
  if (rank >= 0) return Worker(port, rank, np, sizes, transports);
  auto server = tc::TcpBootstrapServer::Start();
  if (!server.ok()) return std::fprintf(stderr, "%s\n", server.status().ToString().c_str()), 2;
  std::vector<pid_t> pids;
  std::string sz;
  for (size_t s : sizes) sz += (sz.empty() ? "" : ",") + std::to_string(s);
  for (int r = 0; r < np; ++r) {
    std::vector<std::string> args = {argv[0],
                                     "--np",
                                     std::to_string(np),
                                     "--sizes",
                                     sz,
                                     "--worker",
                                     std::to_string((*server)->port()),
                                     std::to_string(r)};
    if (transports) args.push_back("--transports");
    std::vector<char*> av;
    for (auto& s : args) av.push_back(s.data());
    av.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, av.data(), environ) != 0) return 2;
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
