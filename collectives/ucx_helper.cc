// A rank of a multi-process UCX test: the test driver fork/execs one per rank.
//   ucx_helper <bootstrap> <rank> <size> <scenario> [args...]
// Scenarios: matrix <max count> [no-mailboxes]; paths <operations>; chaos <victim> <liveness ms>
// [count [no-mailboxes]]; compress; churn; events (root). <bootstrap>: PORT (a bootstrap server on
// 127.0.0.1), HOST:PORT, or listen:HOST:PORT (this rank also serves the bootstrap there: for ranks
// on several hosts). Prints result lines on stdout ("OK ...", "FAIL ...", "PROGRESS", "ERROR
// <mono_ns> ...") and exits 0 only if the scenario passed.
#include <dirent.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "test_util.h"
#include "troupe/collectives/ucx_communicator.h"

namespace troupe::collectives {
namespace {

using testing::HostBuf;
using testing::Input;

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

int result_fd = 1;  // results go here; UCX's own log lines (stdout) are sent to stderr

void Say(const std::string& line) {
  std::string l = line + "\n";
  (void)!write(result_fd, l.data(), l.size());
}

struct Ctx {
  int port, rank, size;
  std::unique_ptr<Bootstrap> boot;
};

std::unique_ptr<Communicator> Make(Ctx& c, int rank, int size, uint64_t gen,
                                   absl::Duration liveness = absl::Seconds(5),
                                   bool mailboxes = true, std::string address = "") {
  UcxOptions o;
  o.address = std::move(address);
  o.mailboxes = mailboxes;
  o.rank = rank;
  o.size = size;
  o.generation = gen;
  o.liveness_timeout = liveness;
  o.heartbeat_interval = absl::Milliseconds(50);
  auto comm = CreateUcxCommunicator(c.boot.get(), o);
  if (!comm.ok()) {
    Say(absl::StrCat("FAIL create: ", comm.status().ToString()));
    std::exit(2);
  }
  return std::move(*comm);
}

// All-reduce / reduce-scatter of `count` elements checked against the plain reference.
bool CheckReduce(Communicator& comm, bool scatter, size_t count, DType dt, ReduceOp op,
                 Algorithm alg, uint32_t salt) {
  const int n = comm.size(), r = comm.rank();
  const size_t total = scatter ? count * n : count;
  HostBuf in(dt, Input(r, total, dt, salt)), out(dt, scatter ? count : total);
  CollectiveOptions o;
  o.algorithm = alg;
  absl::Status st = scatter ? comm.ReduceScatter(in.buf(), out.buf(), op, o).Wait()
                            : comm.AllReduce(in.buf(), in.buf(), op, o).Wait();
  if (!st.ok()) {
    Say(absl::StrCat("FAIL rank ", r, " count ", count, ": ", st.ToString()));
    return false;
  }
  std::vector<float> got = scatter ? out.values() : in.values();
  const size_t base = scatter ? r * count : 0;
  std::vector<float> ref(count, 0.0f), sum_abs(count, 0.0f);
  for (int q = 0; q < n; ++q) {
    std::vector<float> v = Input(q, total, dt, salt);
    for (size_t i = 0; i < count; ++i) {
      const float x = v[base + i];
      ref[i] = q == 0 ? x : (op == ReduceOp::kMax ? std::max(ref[i], x) : ref[i] + x);
      sum_abs[i] += std::fabs(x);
    }
  }
  for (size_t i = 0; i < count; ++i) {
    float want = op == ReduceOp::kAvg ? ref[i] / n : ref[i];
    float tol = op == ReduceOp::kMax ? 0.0f : testing::Tolerance(dt, want, sum_abs[i], n);
    if (!(std::fabs(got[i] - want) <= tol)) {
      Say(absl::StrCat("FAIL rank ", r, (scatter ? " reduce-scatter" : " all-reduce"), " count ",
                       count, " element ", i, " got ", got[i], " want ", want));
      return false;
    }
  }
  return true;
}

// The communicator's transports: DESCRIBE lines, and SINGLE_COPY / STAGED / MAILBOXES on|off.
void SayTransports(Communicator* comm) {
  const std::string transports = DescribeUcxTransports(comm);
  for (absl::string_view line : absl::StrSplit(transports, '\n')) {
    if (!line.empty()) Say(absl::StrCat("DESCRIBE ", line));
  }
  for (absl::string_view line : absl::StrSplit(transports, '\n')) {
    for (const auto& [prefix, name] :
         {std::pair<const char*, const char*>{"single copy (", "SINGLE_COPY"},
          {"staged all-reduce (", "STAGED"},
          {"shared-memory mailboxes (", "MAILBOXES"}}) {
      if (absl::StartsWith(line, prefix)) {
        Say(absl::StrCat(name, absl::EndsWith(line, ": on") ? " on" : " off"));
      }
    }
  }
}

// `ops` all-reduces and as many reduce-scatters of about 1 MiB, interleaved, each on new inputs,
// through the same-host paths (Algorithm::kSingleCopy): staged or single copy as the ranks measure
// and agree (StagingCopy), both run in the first kMeasureEvery operations of a kind. Then as many
// of just over 4 KiB, 8 KiB and just under 64 KiB with Algorithm::kAuto, which takes those paths
// above CollectiveOptions::same_host_small_bytes. Every result must be the bits of the rank-order
// sum both paths compute: a segment's owner's value, then the others' in rank order (recursive
// doubling adds in another order).
int Paths(Ctx& c, int ops) {
  auto comm = Make(c, c.rank, c.size, 0);
  SayTransports(comm.get());  // first: a failure below shows whether staging was on
  const int n = c.size, r = c.rank;
  // The rank-order sum of element i of every rank's input, segment `owner` first.
  auto want = [&](const std::vector<std::vector<float>>& in, int owner, size_t i) {
    float acc = in[owner][i];
    for (int q = 0; q < n; ++q) {
      if (q != owner) acc += in[q][i];
    }
    return acc;
  };
  struct Case {
    size_t count, block;
    Algorithm algorithm;
  };
  for (const Case& how :
       {Case{(size_t{1} << 18) + 5, (size_t{1} << 16) + 3, Algorithm::kSingleCopy},
        Case{1025, 257, Algorithm::kAuto}, Case{2051, 515, Algorithm::kAuto},
        Case{16381, 4093, Algorithm::kAuto}}) {
    const size_t count = how.count, block = how.block;
    CollectiveOptions o;
    o.algorithm = how.algorithm;
    for (int k = 0; k < ops; ++k) {
      for (bool scatter : {false, true}) {
        const size_t total = scatter ? block * n : count;
        const uint32_t salt = 2 * k + (scatter ? 1 : 0);
        std::vector<std::vector<float>> in(n);
        for (int q = 0; q < n; ++q) in[q] = Input(q, total, DType::kF32, salt);
        std::vector<float> mine = in[r], out(block);
        const absl::Status st =
            scatter
                ? comm->ReduceScatter(Buffer::F32(mine), Buffer::F32(out), ReduceOp::kSum, o).Wait()
                : comm->AllReduce(Buffer::F32(mine), Buffer::F32(mine), ReduceOp::kSum, o).Wait();
        if (!st.ok()) {
          Say(absl::StrCat("FAIL rank ", r, " count ", count, " operation ", k, ": ",
                           st.ToString()));
          return 1;
        }
        // All-reduce segments as the engine cuts them (EvenSegments); rank r's block scattered.
        for (int q = scatter ? r : 0; q < (scatter ? r + 1 : n); ++q) {
          const size_t lo = scatter ? q * block : count * q / n;
          const size_t hi = scatter ? lo + block : count * (q + 1) / n;
          for (size_t at = lo; at < hi; ++at) {
            const float w = want(in, q, at), got = scatter ? out[at - lo] : mine[at];
            if (std::memcmp(&w, &got, sizeof(float)) != 0) {
              uint32_t got_bits, want_bits;
              std::memcpy(&got_bits, &got, 4);
              std::memcpy(&want_bits, &w, 4);
              Say(absl::StrCat("FAIL rank ", r, " count ", count,
                               scatter ? " reduce-scatter " : " all-reduce ", k, " element ", at,
                               " got ", got, " (bits ", absl::Hex(got_bits), ") want ", w,
                               " (bits ", absl::Hex(want_bits), ")"));
              return 1;
            }
          }
        }
      }
    }
  }
  Say(absl::StrCat("OK rank ", r));
  return 0;
}

int Matrix(Ctx& c, size_t max_count, bool mailboxes) {
  auto comm = Make(c, c.rank, c.size, 0, absl::Seconds(5), mailboxes);
  const int n = c.size, r = c.rank;
  bool ok = true;
  for (size_t count : {size_t{1}, size_t{7}, size_t{4099}, size_t{65537}, size_t{262147},
                       size_t{1} << 20, size_t{16} << 20}) {
    if (count > max_count) break;
    const bool large = count > (size_t{1} << 20);
    ok &= CheckReduce(*comm, false, count, DType::kF32, ReduceOp::kSum, Algorithm::kAuto, 1);
    if (large) continue;
    ok &= CheckReduce(*comm, false, count, DType::kBF16, ReduceOp::kAvg, Algorithm::kRing, 2);
    ok &= CheckReduce(*comm, false, count, DType::kF32, ReduceOp::kMax,
                      Algorithm::kRecursiveDoubling, 3);
    ok &= CheckReduce(*comm, false, count, DType::kF32, ReduceOp::kSum, Algorithm::kOrdered, 4);
    ok &= CheckReduce(*comm, true, count / n + 1, DType::kF32, ReduceOp::kSum, Algorithm::kRing, 5);
    ok &=
        CheckReduce(*comm, false, count, DType::kBF16, ReduceOp::kSum, Algorithm::kSingleCopy, 10);
    ok &= CheckReduce(*comm, true, count / n + 1, DType::kF32, ReduceOp::kAvg,
                      Algorithm::kSingleCopy, 11);
    // All-gather and broadcast.
    HostBuf mine(DType::kF32, Input(r, count, DType::kF32, 6)), all(DType::kF32, count * n);
    ok &= comm->AllGather(mine.buf(), all.buf(), {}).Wait().ok();
    for (int q = 0; q < n && ok; ++q) {
      auto want = Input(q, count, DType::kF32, 6);
      ok &= std::equal(want.begin(), want.end(), all.f.begin() + q * count);
    }
    HostBuf b(DType::kF32,
              r == n - 1 ? Input(n - 1, count, DType::kF32, 7) : std::vector<float>(count, 0.0f));
    ok &= comm->Broadcast(b.buf(), n - 1, {}).Wait().ok();
    ok &= b.f == Input(n - 1, count, DType::kF32, 7);
    ok &= comm->Barrier({}).Wait().ok();
    if (!ok) Say(absl::StrCat("FAIL rank ", r, " gather/broadcast/barrier count ", count));
  }
  if (n > 1) {  // point-to-point around the ring
    auto v = Input(r, 3001, DType::kF32, 8);
    std::vector<float> got(3001);
    Work s = comm->Send(Buffer::F32(v), (r + 1) % n, 11, {});
    Work w = comm->Recv(Buffer::F32(got), (r + n - 1) % n, 11, {});
    ok &= s.Wait().ok() && w.Wait().ok() && got == Input((r + n - 1) % n, 3001, DType::kF32, 8);
  }
  if (ok) Say(absl::StrCat("OK rank ", r));
  SayTransports(comm.get());
  return ok ? 0 : 1;
}

// Loops all-reduces of `count` floats until one fails; reports when and how; then rebuilds a
// communicator over the survivors (generation 1) and checks an all-reduce there.
int Chaos(Ctx& c, int victim, absl::Duration liveness, size_t count, bool mailboxes) {
  auto comm = Make(c, c.rank, c.size, 0, liveness, mailboxes);
  std::vector<float> buf(count, 1.0f);
  std::atomic<bool> stop{false};
  std::thread watch([&] {
    // At least one 1 MiB piece of data (not only the small control messages) has arrived, or
    // a thousand small all-reduces' worth.
    const size_t enough = std::min(size_t{1} << 20, count * sizeof(float) * 1000);
    while (!stop && comm->stats().bytes_received < enough) usleep(200);
    if (!stop) Say("PROGRESS");
  });
  CollectiveOptions o;
  o.timeout = absl::Seconds(60);
  absl::Status st;
  for (int i = 0; st.ok(); ++i) {
    st = comm->AllReduce(Buffer::F32(buf), Buffer::F32(buf), ReduceOp::kAvg, o).Wait();
  }
  const int64_t t = MonoNs();
  stop = true;
  watch.join();
  Say(absl::StrCat("ERROR ", t, " ", absl::StatusCodeToString(st.code()),
                   " blamed=", BlamedPeer(st).value_or(-1), " ", std::string(st.message())));
  comm.reset();
  const int new_rank = c.rank - (c.rank > victim ? 1 : 0);
  auto next = Make(c, new_rank, c.size - 1, 1, liveness);
  if (!CheckReduce(*next, false, 262147, DType::kF32, ReduceOp::kSum, Algorithm::kRing, 9)) {
    return 1;
  }
  Say("REBUILT OK");
  return 0;
}

// 8-byte all-reduces for `seconds`, ended by all ranks together (each all-reduces whether its
// time is up). The test stops every rank at once past the liveness timeout, as a paused VM would,
// and continues them: no rank may be reported dead.
int Freeze(Ctx& c, absl::Duration liveness, int seconds) {
  auto comm = Make(c, c.rank, c.size, 0, liveness);
  const int64_t end = MonoNs() + int64_t{seconds} * 1000000000;
  absl::Status st;
  for (int64_t n = 1; st.ok(); ++n) {
    float done[2] = {MonoNs() >= end ? 1.0f : 0.0f, 0.0f};
    st = comm->AllReduce(Buffer::F32(done, 2), Buffer::F32(done, 2), ReduceOp::kMax, {}).Wait();
    // Early (not after 1,000): a loaded machine may do fewer than 1,000 in the whole run, and
    // the test stops the ranks only once every one of them has said it is in the loop.
    if (n == 10) Say("PROGRESS");
    if (st.ok() && done[0] == 1.0f) {
      Say(absl::StrCat("FREEZE OK ", n));
      return 0;
    }
  }
  Say(absl::StrCat("ERROR ", MonoNs(), " ", absl::StatusCodeToString(st.code()), " ",
                   std::string(st.message())));
  return 1;
}

// Two ranks that see each other on another host — each unshares its IPC and mount namespaces
// (root) — over tcp on 127.0.0.1. Rank 1's receive of a 4 MiB message is pending 300 ms on the
// executor thread (posted, not waited for), then waited for; rank 0 posts the send 600 ms in and
// does not wait for it. Prints whether the ranks block on events, the context switches (the whole
// process') and milliseconds of each of rank 1's waits, and when the message left and arrived.
int Events(Ctx& c) {
  if (unshare(CLONE_NEWIPC | CLONE_NEWNS) != 0) {
    Say(absl::StrCat("FAIL unshare: ", std::strerror(errno)));
    return 2;
  }
  auto comm = Make(c, c.rank, c.size, 0, absl::Seconds(5), true, "127.0.0.1");
  const bool events = absl::StrContains(DescribeUcxTransports(comm.get()),
                                        "idle waits: block on the network lane's events");
  Say(events ? "EVENTS on" : "EVENTS off");
  auto switches = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_nvcsw + u.ru_nivcsw;
  };
  constexpr size_t kCount = size_t{1} << 20;
  std::vector<float> buf(kCount, -1.0f);
  const Buffer b = Buffer::F32(buf.data(), kCount);
  absl::Status st;
  if (c.rank == 0) {
    for (size_t i = 0; i < kCount; ++i) buf[i] = static_cast<float>(i % 1000);
    absl::SleepFor(absl::Milliseconds(600));
    Say(absl::StrCat("POSTED ", MonoNs()));
    Work w = comm->Send(b, 1, 7, {});
    absl::SleepFor(absl::Milliseconds(300));
    st = w.Wait();
  } else {
    Work w = comm->Recv(b, 0, 7, {});
    for (bool in_wait : {false, true}) {
      const long s0 = switches();
      const int64_t t0 = MonoNs();
      if (in_wait) {
        st = w.Wait();
        Say(absl::StrCat("ARRIVED ", MonoNs()));
      } else {
        absl::SleepFor(absl::Milliseconds(300));
      }
      Say(absl::StrCat(in_wait ? "WAITER " : "EXECUTOR ", switches() - s0, " ",
                       (MonoNs() - t0) / 1000000));
    }
    for (size_t i = 0; st.ok() && i < kCount; ++i) {
      if (buf[i] != static_cast<float>(i % 1000)) st = absl::DataLossError("payload differs");
    }
  }
  if (st.ok()) st = comm->Barrier({}).Wait();
  Say(st.ok() ? "EVENTS-SCENARIO OK" : "FAIL " + st.ToString());
  return st.ok() ? 0 : 1;
}

// Sets the affinity of every thread of this rank (the engine's executor runs operations too).
bool PinAllThreads(const cpu_set_t& cpus) {
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) {
    Say(absl::StrCat("FAIL /proc/self/task: ", std::strerror(errno)));
    return false;
  }
  bool ok = true;
  while (const dirent* t = readdir(tasks)) {
    const int tid = std::atoi(t->d_name);
    if (ok && tid > 0 && sched_setaffinity(tid, sizeof(cpus), &cpus) != 0) {
      Say(absl::StrCat("FAIL sched_setaffinity of thread ", tid, ": ", std::strerror(errno)));
      ok = false;
    }
  }
  closedir(tasks);
  return ok;
}

// The usable vCPUs and the first of them alone.
void UsableCpus(cpu_set_t* all, cpu_set_t* first) {
  CPU_ZERO(first);
  int cpu = 0;
  if (sched_getaffinity(0, sizeof(*all), all) == 0) {
    while (cpu < CPU_SETSIZE - 1 && !CPU_ISSET(cpu, all)) ++cpu;
  }
  CPU_SET(cpu, first);
}

// Two ranks set up while each could have a vCPU of its own, then both moved onto their first usable
// vCPU, as the kernel may place them beside a busy process: small and staged all-reduces, timed. A
// waiter that spins for its peer keeps it off the shared vCPU for a time slice at every hand-over.
int SharedCpu(Ctx& c) {
  auto comm = Make(c, c.rank, c.size, 0);
  cpu_set_t all, one;
  UsableCpus(&all, &one);
  if (!PinAllThreads(one)) return 2;
  absl::Status st = comm->Barrier({}).Wait();
  std::vector<float> small(2, 1.0f), large(size_t{1} << 20, 1.0f);
  const int64_t t0 = MonoNs();
  for (int i = 0; st.ok() && i < 2000; ++i) {
    st = comm->AllReduce(Buffer::F32(small.data(), small.size()),
                         Buffer::F32(small.data(), small.size()), ReduceOp::kMax, {})
             .Wait();
  }
  for (int i = 0; st.ok() && i < 20; ++i) {
    st = comm->AllReduce(Buffer::F32(large.data(), large.size()),
                         Buffer::F32(large.data(), large.size()), ReduceOp::kMax, {})
             .Wait();
  }
  if (st.ok()) Say(absl::StrCat("SHARED_CPU_MS ", (MonoNs() - t0) / 1000000));
  Say(st.ok() ? "SHARED-CPU OK" : "FAIL " + st.ToString());
  return st.ok() ? 0 : 1;
}

// Two ranks put on one vCPU (pinned there, then free to run on any, as the kernel leaves them
// beside a busy process on the other vCPUs), three times: 4-byte all-reduces for 150 ms each time,
// timed, and how often this rank moved off the vCPU it shared (DescribeUcxTransports). Three
// rounds, longer than the 100 ms between moves: the kernel may part the ranks itself once.
int Spread(Ctx& c) {
  auto comm = Make(c, c.rank, c.size, 0);
  cpu_set_t all, one;
  UsableCpus(&all, &one);
  std::vector<float> small(2, 1.0f);
  absl::Status st;
  int64_t ops = 0, ns = 0;
  for (int round = 0; st.ok() && round < 3; ++round) {
    if (!PinAllThreads(one)) return 2;
    st = comm->Barrier({}).Wait();
    if (!PinAllThreads(all)) return 2;
    const int64_t t0 = MonoNs();
    // Every rank runs the same number of operations: rank 0's clock decides when to stop.
    for (float stop = 0; st.ok() && stop == 0; ++ops) {
      small[0] = c.rank == 0 && MonoNs() - t0 > 150'000'000 ? 1 : 0;
      st = comm->AllReduce(Buffer::F32(small.data(), 1), Buffer::F32(small.data(), 1),
                           ReduceOp::kMax, {})
               .Wait();
      stop = small[0];
    }
    ns += MonoNs() - t0;
  }
  if (st.ok()) st = comm->Barrier({}).Wait();
  const double us =
      static_cast<double>(ns) / 1000.0 / static_cast<double>(std::max<int64_t>(ops, 1));
  for (absl::string_view line : absl::StrSplit(DescribeUcxTransports(comm.get()), '\n')) {
    if (absl::ConsumePrefix(&line, "moves of this rank off a vCPU")) {
      Say(absl::StrCat("MOVES", line.substr(line.find(':') + 1), " ", us));
    }
  }
  Say(st.ok() ? "SPREAD OK" : "FAIL " + st.ToString());
  return st.ok() ? 0 : 1;
}

// Open file descriptors of this process.
int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

// Communicators of successive generations created, used (small and staged all-reduces) and
// destroyed healthy: nothing of theirs (UCX workers and their files, shared segments) may stay.
int Churn(Ctx& c) {
  std::vector<float> buf(size_t{1} << 20, 1.0f);
  auto use = [&](uint64_t gen) {
    auto comm = Make(c, c.rank, c.size, gen);
    return comm->AllReduce(Buffer::F32(buf.data(), 2), Buffer::F32(buf.data(), 2), ReduceOp::kMax,
                           {})
               .Wait()
               .ok() &&
           comm->AllReduce(Buffer::F32(buf), Buffer::F32(buf), ReduceOp::kMax, {}).Wait().ok();
  };
  if (!use(0)) return 1;  // the first one also opens what UCX keeps for the process
  const int before = OpenFds();
  for (uint64_t gen = 1; gen <= 10; ++gen) {
    if (!use(gen)) return 1;
  }
  const int after = OpenFds();
  Say(absl::StrCat("CHURN fds ", before, " -> ", after));
  return after <= before ? 0 : 1;
}

// Data-parallel least squares over the ranks: full gradient all-reduce vs top-k 1% with error
// feedback, same steps and learning rate. Prints both final losses and the bytes each run
// handed to UCX's send calls.
int RunCompression(Ctx& c) {
  auto comm = Make(c, c.rank, c.size, 0);
  const size_t d = 200, m = 1000;
  const int steps = 400;
  const float lr = 0.05f;
  std::vector<float> x(m * d), y(m), wstar(d);
  for (size_t j = 0; j < d; ++j) wstar[j] = testing::Val(1000, j, 501);
  for (size_t i = 0; i < m; ++i) {
    float dot = 0.0f;
    for (size_t j = 0; j < d; ++j) {
      x[i * d + j] = testing::Val(c.rank, i * d + j, 500);
      dot += x[i * d + j] * wstar[j];
    }
    y[i] = dot + 1.7f * testing::Val(c.rank, i, 502);
  }
  const float total = static_cast<float>(m * c.size);
  auto train = [&](Compression kind, double* loss, uint64_t* bytes) -> bool {
    std::vector<float> w(d, 0.0f), g(d), r(m);
    CompressionState state;
    CollectiveOptions o;
    o.compression = kind;
    o.topk_fraction = 0.01;
    o.compression_state = &state;
    const uint64_t before = comm->stats().bytes_sent;
    for (int s = 0; s < steps; ++s) {
      for (size_t i = 0; i < m; ++i) {
        float dot = 0.0f;
        for (size_t j = 0; j < d; ++j) dot += x[i * d + j] * w[j];
        r[i] = dot - y[i];
      }
      std::fill(g.begin(), g.end(), 0.0f);
      for (size_t i = 0; i < m; ++i) {
        for (size_t j = 0; j < d; ++j) g[j] += x[i * d + j] * r[i] / total;
      }
      if (!comm->AllReduce(Buffer::F32(g), Buffer::F32(g), ReduceOp::kSum, o).Wait().ok()) {
        return false;
      }
      for (size_t j = 0; j < d; ++j) w[j] -= lr * g[j];
    }
    *bytes = comm->stats().bytes_sent - before;
    float local = 0.0f;
    for (size_t i = 0; i < m; ++i) {
      float dot = 0.0f;
      for (size_t j = 0; j < d; ++j) dot += x[i * d + j] * w[j];
      local += 0.5f * (dot - y[i]) * (dot - y[i]);
    }
    if (!comm->AllReduce(Buffer::F32(&local, 1), Buffer::F32(&local, 1), ReduceOp::kSum, {})
             .Wait()
             .ok()) {
      return false;
    }
    *loss = local / total;
    return true;
  };
  double plain_loss = 0, topk_loss = 0;
  uint64_t plain_bytes = 0, topk_bytes = 0;
  if (!train(Compression::kNone, &plain_loss, &plain_bytes) ||
      !train(Compression::kTopK, &topk_loss, &topk_bytes)) {
    Say("FAIL compression training");
    return 1;
  }
  Say(absl::StrCat("COMPRESS ", plain_loss, " ", topk_loss, " ", plain_bytes, " ", topk_bytes));
  return 0;
}

}  // namespace
}  // namespace troupe::collectives

int main(int argc, char** argv) {
  using namespace troupe::collectives;
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s port rank size scenario [args]\n", argv[0]);
    return 2;
  }
  result_fd = dup(1);
  dup2(2, 1);
  Ctx c;
  std::string host = "127.0.0.1";
  absl::string_view where = argv[1];
  const bool serve = absl::ConsumePrefix(&where, "listen:");
  if (const size_t colon = where.rfind(':'); colon != std::string::npos) {
    host = std::string(where.substr(0, colon));
    where = where.substr(colon + 1);
  }
  c.port = std::atoi(std::string(where).c_str());
  c.rank = std::atoi(argv[2]);
  c.size = std::atoi(argv[3]);
  const std::string scenario = argv[4];
  std::unique_ptr<TcpBootstrapServer> server;
  if (serve) {
    auto s = TcpBootstrapServer::Start(c.port, host);
    if (!s.ok()) {
      Say(absl::StrCat("FAIL bootstrap server: ", s.status().ToString()));
      return 2;
    }
    server = std::move(*s);
  }
  auto boot = TcpBootstrapClient::Connect(host, c.port);
  if (!boot.ok()) {
    Say(absl::StrCat("FAIL bootstrap: ", boot.status().ToString()));
    return 2;
  }
  c.boot = std::move(*boot);
  if (scenario == "matrix") {
    return Matrix(c, std::strtoull(argv[5], nullptr, 10),
                  !(argc > 6 && std::string(argv[6]) == "no-mailboxes"));
  }
  if (scenario == "chaos") {
    return Chaos(c, std::atoi(argv[5]), absl::Milliseconds(std::atoi(argv[6])),
                 argc > 7 ? std::strtoull(argv[7], nullptr, 10) : size_t{16} << 20,
                 !(argc > 8 && std::string(argv[8]) == "no-mailboxes"));
  }
  if (scenario == "freeze")
    return Freeze(c, absl::Milliseconds(std::atoi(argv[5])), std::atoi(argv[6]));
  if (scenario == "paths") return Paths(c, std::atoi(argv[5]));
  if (scenario == "compress") return RunCompression(c);
  if (scenario == "churn") return Churn(c);
  if (scenario == "events") return Events(c);
  if (scenario == "shared-cpu") return SharedCpu(c);
  if (scenario == "spread") return Spread(c);
  Say("FAIL unknown scenario " + scenario);
  return 2;
}
