// The NCCL communicator's logic without a GPU: the real communicator code over the in-process
// fake (nccl_fake.h), ranks as threads, the unique id through a real TCP bootstrap. Covers
// creation, every operation's result, validation, a rank missing at init, Abort as the liveness
// channel calls it, deadlines, injected NCCL errors, destruction with operations in flight,
// regeneration over the survivors, and the ordered (deterministic) reduce-scatter against the
// in-process communicator's bits. Short timeouts: the binary runs in a few seconds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "algorithms.h"
#include "nccl_backend.h"
#include "reduce.h"
#include "test_util.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"
#include "troupe/collectives/inprocess.h"
#include "troupe/collectives/nccl_communicator.h"
#include "troupe/collectives/nccl_fake.h"

namespace troupe::collectives {
namespace {

using testing::FakeNcclResources;
using testing::FakeNcclWorld;
using testing::ForEachRank;
using ::testing::HasSubstr;
using testing::Val;

constexpr char kPrefix[] = "job";
using CommOr = absl::StatusOr<std::unique_ptr<Communicator>>;

// A bootstrap server, the fake world and a bootstrap client per process.
struct Rig {
  std::unique_ptr<TcpBootstrapServer> server;
  std::shared_ptr<FakeNcclWorld> world = FakeNcclWorld::Create();
  std::vector<std::unique_ptr<TcpBootstrapClient>> boots;

  explicit Rig(int processes) {
    auto s = TcpBootstrapServer::Start();
    EXPECT_TRUE(s.ok()) << s.status();
    server = *std::move(s);
    for (int p = 0; p < processes; ++p) {
      auto b = TcpBootstrapClient::Connect("127.0.0.1", server->port());
      EXPECT_TRUE(b.ok()) << b.status();
      boots.push_back(*std::move(b));
    }
  }

  NcclOptions Options(int rank, int size, uint64_t generation,
                      absl::Duration connect = absl::Seconds(5)) {
    NcclOptions o;
    o.rank = rank;
    o.size = size;
    o.generation = generation;
    o.key_prefix = kPrefix;
    o.connect_timeout = connect;
    return o;
  }

  // Creates rank r of `generation` in process procs[r], all ranks in parallel; procs[r] < 0
  // leaves rank r out (its entry is NotFound).
  std::vector<CommOr> Create(const std::vector<int>& procs, uint64_t generation,
                             absl::Duration connect = absl::Seconds(5)) {
    const int n = static_cast<int>(procs.size());
    std::vector<CommOr> out;
    for (int r = 0; r < n; ++r) out.emplace_back(absl::NotFoundError("rank left out"));
    ForEachRank(n, [&](int r) {
      if (procs[r] < 0) return;
      out[r] = CreateNcclCommunicator(boots[procs[r]].get(), Options(r, n, generation, connect),
                                      world->Process(procs[r]));
    });
    return out;
  }

  std::vector<std::unique_ptr<Communicator>> CreateOk(const std::vector<int>& procs,
                                                      uint64_t generation) {
    std::vector<std::unique_ptr<Communicator>> comms;
    for (CommOr& c : Create(procs, generation)) {
      EXPECT_TRUE(c.ok()) << c.status();
      comms.push_back(c.ok() ? *std::move(c) : nullptr);
    }
    return comms;
  }
};

std::vector<float> Inputs(int rank, size_t n, uint32_t salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Val(rank, i, salt);
  return v;
}

// The reduction of every rank's Inputs(r, n, salt) in rank order, as NCCL's contract says.
std::vector<float> Reference(int size, size_t n, uint32_t salt, ReduceOp op) {
  std::vector<float> acc = Inputs(0, n, salt);
  for (int r = 1; r < size; ++r) {
    std::vector<float> in = Inputs(r, n, salt);
    ReduceInto(acc.data(), in.data(), n, op);
  }
  if (op == ReduceOp::kAvg) DivideBy(acc.data(), n, static_cast<float>(size));
  return acc;
}

CollectiveOptions Timeout(absl::Duration d) {
  CollectiveOptions o;
  o.timeout = d;
  return o;
}

// Each rank's result of one operation, issued by every rank on its own thread.
template <class F>
std::vector<absl::Status> OnEveryRank(std::vector<std::unique_ptr<Communicator>>& comms, F f) {
  std::vector<absl::Status> st(comms.size());
  ForEachRank(static_cast<int>(comms.size()), [&](int r) { st[r] = f(r, *comms[r]); });
  return st;
}

TEST(NcclLogic, FourRanksThroughTheBootstrapComputeEveryOperation) {
  const int n = 4;
  Rig rig(n);
  auto comms = rig.CreateOk({0, 1, 2, 3}, 0);
  ASSERT_EQ(comms.size(), 4u);
  for (int r = 0; r < n; ++r) {
    ASSERT_NE(comms[r], nullptr);
    EXPECT_EQ(comms[r]->rank(), r);
    EXPECT_EQ(comms[r]->size(), n);
    EXPECT_EQ(comms[r]->generation(), 0u);
    EXPECT_TRUE(comms[r]->PeersShareHost()) << "every rank of this rig runs on this host";
  }
  // Rank 0 published the id under <prefix>/g<gen>/nccl-id; every process joined that id.
  auto id = rig.boots[0]->Lookup("job/g0/nccl-id", base::MonotonicNow() + absl::Seconds(1));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 128u);
  EXPECT_EQ(rig.world->Process(0)->CountCalls("ncclGetUniqueId"), 1);
  EXPECT_EQ(rig.world->Process(1)->CountCalls("ncclGetUniqueId"), 0);
  const uint64_t serial = rig.world->Process(0)->Calls().back().id;
  for (int p = 0; p < n; ++p) {
    int inits = 0;
    for (const auto& c : rig.world->Process(p)->Calls()) {
      if (c.name == "ncclCommInitRankConfig") {
        ++inits;
        EXPECT_EQ(c.rank, p);
        EXPECT_EQ(c.id, serial);
      }
    }
    EXPECT_EQ(inits, 1);
  }

  const size_t count = 1001, block = 257;
  std::vector<std::vector<float>> sum(n), avg(n), max(n), rs(n), ag(n), bc(n), p2p(n);
  std::vector<std::vector<uint16_t>> bf(n);
  auto st = OnEveryRank(comms, [&](int r, Communicator& c) -> absl::Status {
    sum[r] = Inputs(r, count, 1);
    avg[r] = Inputs(r, count, 1);
    max[r] = Inputs(r, count, 1);
    std::vector<float> rs_in = Inputs(r, n * block, 2);
    rs[r].assign(block, 0);
    std::vector<float> ag_in = Inputs(r, block, 3);
    ag[r].assign(n * block, 0);
    bc[r] = Inputs(r, count, 4);
    std::vector<float> in_bf = Inputs(r, count, 5);
    bf[r].resize(count);
    F32ToBf16(in_bf.data(), bf[r].data(), count);
    p2p[r].assign(count, 0);
    std::vector<float> mine = Inputs(r, count, 6);
    // Issue everything, then wait: operations are asynchronous and run in issue order.
    std::vector<Work> works = {
        c.AllReduce(Buffer::F32(sum[r]), Buffer::F32(sum[r]), ReduceOp::kSum, {}),
        c.AllReduce(Buffer::F32(avg[r]), Buffer::F32(avg[r]), ReduceOp::kAvg, {}),
        c.AllReduce(Buffer::F32(max[r]), Buffer::F32(max[r]), ReduceOp::kMax, {}),
        c.ReduceScatter(Buffer::F32(rs_in), Buffer::F32(rs[r]), ReduceOp::kSum, {}),
        c.AllGather(Buffer::F32(ag_in), Buffer::F32(ag[r]), {}),
        c.Broadcast(Buffer::F32(bc[r]), /*root=*/2, {}),
        c.AllReduce(Buffer::BF16(bf[r]), Buffer::BF16(bf[r]), ReduceOp::kSum, {}),
        c.Barrier({}),
    };
    // A ring of sends: even ranks send first, odd ranks receive first (NCCL pairs individual
    // sends and receives in issue order: two ranks both sending first would wait forever).
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) {
      works.push_back(c.Send(Buffer::F32(mine), next, 0, {}));
      works.push_back(c.Recv(Buffer::F32(p2p[r]), prev, 0, {}));
    } else {
      works.push_back(c.Recv(Buffer::F32(p2p[r]), prev, 0, {}));
      works.push_back(c.Send(Buffer::F32(mine), next, 0, {}));
    }
    for (Work& w : works) {
      TROUPE_RETURN_IF_ERROR(w.Wait());
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];

  const std::vector<float> ref_sum = Reference(n, count, 1, ReduceOp::kSum);
  const std::vector<float> ref_avg = Reference(n, count, 1, ReduceOp::kAvg);
  const std::vector<float> ref_max = Reference(n, count, 1, ReduceOp::kMax);
  const std::vector<float> ref_rs = Reference(n, n * block, 2, ReduceOp::kSum);
  std::vector<float> ref_bf(count, 0.0f);
  for (int r = 0; r < n; ++r) {
    std::vector<float> in = Inputs(r, count, 5);
    for (size_t i = 0; i < count; ++i) ref_bf[i] += Bf16ToF32(F32ToBf16(in[i]));
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(sum[r], ref_sum) << "rank " << r;
    EXPECT_EQ(avg[r], ref_avg) << "rank " << r;
    EXPECT_EQ(max[r], ref_max) << "rank " << r;
    EXPECT_EQ(rs[r],
              std::vector<float>(ref_rs.begin() + r * block, ref_rs.begin() + (r + 1) * block))
        << "rank " << r;
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(std::vector<float>(ag[r].begin() + q * block, ag[r].begin() + (q + 1) * block),
                Inputs(q, block, 3))
          << "rank " << r << " block " << q;
    }
    EXPECT_EQ(bc[r], Inputs(2, count, 4)) << "rank " << r;
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(bf[r][i], F32ToBf16(ref_bf[i])) << "rank " << r << " element " << i;
    }
    EXPECT_EQ(p2p[r], Inputs((r + n - 1) % n, count, 6)) << "rank " << r;
    CommStats s = comms[r]->stats();
    EXPECT_EQ(s.ops_completed, 10u);
    EXPECT_EQ(s.messages_sent, 10u);
    EXPECT_THAT(comms[r]->DebugString(), HasSubstr("healthy"));
  }
  comms.clear();
  for (int p = 0; p < n; ++p) {
    EXPECT_EQ(rig.world->Process(p)->Live(), FakeNcclResources{}) << "process " << p;
  }
}

TEST(NcclLogic, EnqueuesStillInProgressSettleFirst) {
  Rig rig(2);
  rig.world->Process(0)->SetEnqueueInProgressPolls(5);
  rig.world->Process(1)->SetEnqueueInProgressPolls(5);
  auto comms = rig.CreateOk({0, 1}, 0);
  std::vector<std::vector<float>> v = {Inputs(0, 64, 1), Inputs(1, 64, 1)};
  auto st = OnEveryRank(comms, [&](int r, Communicator& c) {
    absl::Status s = c.AllReduce(Buffer::F32(v[r]), Buffer::F32(v[r]), ReduceOp::kSum, {}).Wait();
    return s.ok() ? c.Barrier({}).Wait() : s;
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(v[r], Reference(2, 64, 1, ReduceOp::kSum));
  }
}

// NCCL's non-blocking mode: an enqueue may stay in progress; Abort() from another thread (the
// liveness monitor) must get in while it settles, not wait behind it.
TEST(NcclLogic, AbortGetsInWhileAnEnqueueSettles) {
  Rig rig(2);
  auto comms = rig.CreateOk({0, 1}, 0);
  rig.world->Process(0)->SetEnqueueInProgressPolls(1 << 30);
  const absl::Status liveness = BlamePeer(absl::UnavailableError("liveness: rank 1 died"), 1);
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    comms[0]->Abort(liveness);
  });
  std::vector<float> v(8, 1.0f);
  const absl::Time start = base::MonotonicNow();
  absl::Status st = comms[0]->AllReduce(Buffer::F32(v), Buffer::F32(v), ReduceOp::kSum, {}).Wait();
  aborter.join();
  EXPECT_EQ(st, liveness);
  EXPECT_LT(base::MonotonicNow() - start, absl::Seconds(2));
  EXPECT_EQ(rig.world->Process(0)->CountCalls("ncclCommAbort"), 1);
}

// Ranks that disagree on a collective (a caller's bug): NCCL's ncclInvalidUsage, InvalidArgument
// on every rank involved — retrying the same calls cannot help.
TEST(NcclLogic, MismatchedCollectivesAreInvalidArgument) {
  Rig rig(2);
  auto comms = rig.CreateOk({0, 1}, 0);
  std::vector<std::vector<float>> v = {std::vector<float>(8, 1.0f), std::vector<float>(4, 1.0f)};
  auto st = OnEveryRank(comms, [&](int r, Communicator& c) {
    return c.AllReduce(Buffer::F32(v[r]), Buffer::F32(v[r]), ReduceOp::kSum, {}).Wait();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
    EXPECT_THAT(std::string(st[r].message()), HasSubstr("ncclInvalidUsage"));
  }
}

TEST(NcclLogic, InvalidOptionsAreInvalidArgument) {
  Rig rig(1);
  auto process = rig.world->Process(0);
  struct Case {
    const char* what;
    NcclOptions options;
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, auto edit) {
    NcclOptions o = rig.Options(0, 2, 0);
    edit(o);
    cases.push_back({what, o});
  };
  add("size", [](NcclOptions& o) { o.size = 0; });
  add("rank", [](NcclOptions& o) { o.rank = -1; });
  add("rank", [](NcclOptions& o) { o.rank = 2; });
  add("device", [](NcclOptions& o) { o.device = -1; });
  add("device", [](NcclOptions& o) { o.device = 1; });  // the fake process has one device
  add("key_prefix", [](NcclOptions& o) { o.key_prefix = ""; });
  add("connect_timeout", [](NcclOptions& o) { o.connect_timeout = absl::ZeroDuration(); });
  for (const Case& c : cases) {
    CommOr comm = CreateNcclCommunicator(rig.boots[0].get(), c.options, process);
    EXPECT_TRUE(absl::IsInvalidArgument(comm.status())) << c.what << ": " << comm.status();
    EXPECT_THAT(std::string(comm.status().message()), HasSubstr(c.what));
  }
  CommOr no_boot = CreateNcclCommunicator(nullptr, rig.Options(0, 1, 0), process);
  EXPECT_TRUE(absl::IsInvalidArgument(no_boot.status())) << no_boot.status();
  CommOr no_backend = CreateNcclCommunicator(rig.boots[0].get(), rig.Options(0, 1, 0), nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(no_backend.status())) << no_backend.status();
  // Rejected before touching the device or NCCL.
  EXPECT_EQ(process->Calls().size(), 0u);
  EXPECT_EQ(process->Live(), FakeNcclResources{});

  // No usable device: FailedPrecondition naming the CUDA error.
  process->SetDevices(0, /*cudaErrorInsufficientDriver*/ 35);
  CommOr no_driver = CreateNcclCommunicator(rig.boots[0].get(), rig.Options(0, 1, 0), process);
  EXPECT_TRUE(absl::IsFailedPrecondition(no_driver.status())) << no_driver.status();
  EXPECT_THAT(std::string(no_driver.status().message()),
              HasSubstr("cudaGetDeviceCount failed: cudaErrorInsufficientDriver (35)"));
}

TEST(NcclLogic, NcclAvailableNamesTheCudaError) {
  auto world = FakeNcclWorld::Create();
  auto p = world->Process(0);
  std::string why;
  EXPECT_TRUE(NcclAvailable(*p, &why)) << why;
  EXPECT_EQ(why, "1 CUDA device(s), NCCL 22809");
  p->SetDevices(0, 35);
  EXPECT_FALSE(NcclAvailable(*p, &why));
  EXPECT_EQ(why,
            "cudaGetDeviceCount failed: cudaErrorInsufficientDriver (35): CUDA driver version is "
            "insufficient for CUDA runtime version (fake)");
  p->SetDevices(0);
  EXPECT_FALSE(NcclAvailable(*p, &why));
  EXPECT_THAT(why, HasSubstr("no CUDA device"));

  // This machine's real answer: with CUDA and no driver it must name the error code.
  std::string real;
  const bool available = NcclAvailable(&real);
  std::printf("NcclAvailable here: %s: %s\n", available ? "yes" : "no", real.c_str());
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
  if (!available && real.find("no CUDA device") == std::string::npos) {
    EXPECT_THAT(real, ::testing::MatchesRegex("cudaGetDeviceCount failed: cudaError[A-Za-z]+ "
                                              "\\([0-9]+\\): .+"));
  }
#else
  EXPECT_FALSE(available);
  EXPECT_THAT(real, HasSubstr("without CUDA"));
#endif
  if (!available) {
    Rig rig(1);
    CommOr comm = CreateNcclCommunicator(rig.boots[0].get(), rig.Options(0, 1, 0));
    EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
  }
}

TEST(NcclLogic, RankMissingAtInitFailsEveryOtherRankWithinTheConnectTimeout) {
  const absl::Duration connect = absl::Milliseconds(300);
  {  // rank 2 never comes: the others published/looked up the id but init stays in progress
    Rig rig(4);
    const absl::Time start = base::MonotonicNow();
    std::vector<CommOr> comms = rig.Create({0, 1, -1, 3}, 0, connect);
    const absl::Duration took = base::MonotonicNow() - start;
    for (int r : {0, 1, 3}) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(comms[r].status())) << r << ": " << comms[r].status();
      EXPECT_THAT(std::string(comms[r].status().message()), HasSubstr("ncclCommInitRankConfig"));
      auto process = rig.world->Process(r);
      EXPECT_EQ(process->CountCalls("ncclCommInitRankConfig"), 1);
      EXPECT_EQ(process->CountCalls("ncclCommAbort"), 1) << "rank " << r;
      EXPECT_EQ(process->Live(), FakeNcclResources{}) << "rank " << r;
    }
    EXPECT_GE(took, connect);
    EXPECT_LT(took, connect + absl::Seconds(2));
  }
  {  // rank 0 never comes: nobody publishes the id, the others' lookups run into the deadline
    Rig rig(4);
    const absl::Time start = base::MonotonicNow();
    std::vector<CommOr> comms = rig.Create({-1, 1, 2, 3}, 0, connect);
    EXPECT_LT(base::MonotonicNow() - start, connect + absl::Seconds(2));
    for (int r : {1, 2, 3}) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(comms[r].status())) << r << ": " << comms[r].status();
      EXPECT_THAT(std::string(comms[r].status().message()), HasSubstr("job/g0/nccl-id"));
      EXPECT_EQ(rig.world->Process(r)->CountCalls("ncclCommInitRankConfig"), 0);
      EXPECT_EQ(rig.world->Process(r)->Live(), FakeNcclResources{});
    }
  }
}

// The liveness channel of rank 1 reports rank 3 dead while ranks 0..2 wait in an all-reduce that
// rank 3 will never join. Rank 1 aborts its communicator with the liveness status (Unavailable,
// blaming 3): its own Work fails with exactly that status; ranks 0 and 2 see NCCL's remote error
// and fail with Unavailable — the code for "a peer or the network failed, rebuild without it"
// (not Aborted: they did not decide to leave the generation, a peer's failure reached them).
TEST(NcclLogic, AbortOnOneRankFailsThePendingWorkOfTheOthersFast) {
  const int n = 4;
  Rig rig(n);
  auto comms = rig.CreateOk({0, 1, 2, 3}, 0);
  rig.world->Process(3)->Kill();
  const absl::Status liveness = BlamePeer(absl::UnavailableError("liveness: rank 3 died"), 3);
  std::vector<std::vector<float>> v(n, std::vector<float>(32, 1.0f));
  std::vector<Work> works(n);
  for (int r = 0; r < 3; ++r) {  // the survivors enqueue (from this thread: enqueue is async)
    works[r] = comms[r]->AllReduce(Buffer::F32(v[r]), Buffer::F32(v[r]), ReduceOp::kSum,
                                   Timeout(absl::Seconds(30)));
  }
  std::vector<absl::Status> st(3);
  std::vector<absl::Duration> waited(3);
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    comms[1]->Abort(liveness);
  });
  ForEachRank(3, [&](int r) {
    const absl::Time t = base::MonotonicNow();
    st[r] = works[r].Wait();
    waited[r] = base::MonotonicNow() - t;
  });
  aborter.join();
  EXPECT_EQ(st[1], liveness);
  EXPECT_EQ(BlamedPeer(st[1]), 3);
  for (int r : {0, 2}) {
    EXPECT_TRUE(absl::IsUnavailable(st[r])) << r << ": " << st[r];
    EXPECT_THAT(std::string(st[r].message()), HasSubstr("ncclRemoteError"));
    EXPECT_THAT(std::string(st[r].message()), HasSubstr("rank 1 aborted"));
  }
  for (int r = 0; r < 3; ++r) {
    EXPECT_LT(waited[r], absl::Seconds(2)) << "rank " << r;
    EXPECT_EQ(rig.world->Process(r)->CountCalls("ncclCommAbort"), 1) << "rank " << r;
    // Sticky: a later operation fails at once with the same status.
    Work later = comms[r]->AllReduce(Buffer::F32(v[r]), Buffer::F32(v[r]), ReduceOp::kSum, {});
    EXPECT_TRUE(later.IsDone());
    EXPECT_EQ(later.Wait(), st[r]);
    EXPECT_EQ(comms[r]->Barrier({}).Wait(), st[r]);
    comms[r]->Abort(absl::AbortedError("a second abort changes nothing"));
    EXPECT_EQ(comms[r]->Barrier({}).Wait(), st[r]);
    EXPECT_THAT(comms[r]->DebugString(), HasSubstr(std::string(st[r].message())));
    EXPECT_EQ(rig.world->Process(r)->CountCalls("ncclCommAbort"), 1) << "rank " << r;
  }
}

TEST(NcclLogic, AbortForGenerationIsAbortedHereAndUnavailableAtThePeer) {
  Rig rig(2);
  auto comms = rig.CreateOk({0, 1}, 7);
  std::vector<float> v(8, 1.0f);
  Work pending = comms[1]->AllReduce(Buffer::F32(v), Buffer::F32(v), ReduceOp::kSum, {});
  comms[0]->AbortForGeneration(8);
  absl::Status mine = comms[0]->Barrier({}).Wait();
  EXPECT_TRUE(absl::IsAborted(mine)) << mine;
  EXPECT_THAT(std::string(mine.message()), HasSubstr("generation 7 superseded by generation 8"));
  absl::Status peer = pending.Wait();
  EXPECT_TRUE(absl::IsUnavailable(peer)) << peer;
}

TEST(NcclLogic, OpDeadlineIsDeadlineExceededAndAbortsTheCommunicator) {
  Rig rig(2);
  auto comms = rig.CreateOk({0, 1}, 0);
  std::vector<float> v(16, 1.0f);
  const absl::Time start = base::MonotonicNow();
  // Rank 1 never issues its all-reduce.
  absl::Status st = comms[0]
                        ->AllReduce(Buffer::F32(v), Buffer::F32(v), ReduceOp::kSum,
                                    Timeout(absl::Milliseconds(150)))
                        .Wait();
  const absl::Duration took = base::MonotonicNow() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_GE(took, absl::Milliseconds(150));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(rig.world->Process(0)->CountCalls("ncclCommAbort"), 1);
  EXPECT_EQ(rig.world->Process(1)->CountCalls("ncclCommAbort"), 0);
  Work later = comms[0]->Barrier({});
  EXPECT_TRUE(later.IsDone());
  EXPECT_TRUE(absl::IsDeadlineExceeded(later.Wait()));
  // The peer learns of the abort at its next call, and aborts too.
  absl::Status peer = comms[1]->Barrier({}).Wait();
  EXPECT_TRUE(absl::IsUnavailable(peer)) << peer;
  EXPECT_EQ(rig.world->Process(1)->CountCalls("ncclCommAbort"), 1);
}

TEST(NcclLogic, HungOperationTimesOutAndReleasesThePeer) {
  Rig rig(2);
  auto comms = rig.CreateOk({0, 1}, 0);
  rig.world->Process(1)->Hang();  // its kernels never finish: the collective stalls everywhere
  std::vector<std::vector<float>> v(2, std::vector<float>(16, 1.0f));
  Work w0 = comms[0]->AllReduce(Buffer::F32(v[0]), Buffer::F32(v[0]), ReduceOp::kSum,
                                Timeout(absl::Milliseconds(150)));
  Work w1 = comms[1]->AllReduce(Buffer::F32(v[1]), Buffer::F32(v[1]), ReduceOp::kSum,
                                Timeout(absl::Seconds(30)));
  const absl::Time start = base::MonotonicNow();
  absl::Status s0, s1;
  std::thread t([&] { s1 = w1.Wait(); });
  s0 = w0.Wait();
  t.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s0)) << s0;
  EXPECT_TRUE(absl::IsUnavailable(s1)) << s1;  // released by rank 0's abort, not its own 30 s
  EXPECT_LT(base::MonotonicNow() - start, absl::Seconds(2));
  EXPECT_EQ(v[0], std::vector<float>(16, 1.0f));  // nothing ran
  for (int p = 0; p < 2; ++p) EXPECT_EQ(rig.world->Process(p)->CountCalls("ncclCommAbort"), 1);
}

TEST(NcclLogic, AsyncNcclErrorsAbortWithTheirCode) {
  struct Case {
    NcclResult injected;
    absl::StatusCode code;
  };
  for (Case c : {Case{NcclResult::kSystemError, absl::StatusCode::kUnavailable},
                 Case{NcclResult::kRemoteError, absl::StatusCode::kUnavailable},
                 Case{NcclResult::kInternalError, absl::StatusCode::kInternal},
                 Case{NcclResult::kUnhandledCudaError, absl::StatusCode::kInternal},
                 Case{NcclResult::kInvalidUsage, absl::StatusCode::kInvalidArgument}}) {
    const std::string name = NcclResultName(c.injected);
    Rig rig(3);
    auto comms = rig.CreateOk({0, 1, 2}, 0);
    std::vector<std::vector<float>> v(3, std::vector<float>(8, 1.0f));
    // Ranks 0 and 1 wait; rank 2 has not issued yet; rank 0's NCCL reports an error.
    Work w0 = comms[0]->AllReduce(Buffer::F32(v[0]), Buffer::F32(v[0]), ReduceOp::kSum, {});
    Work w1 = comms[1]->AllReduce(Buffer::F32(v[1]), Buffer::F32(v[1]), ReduceOp::kSum, {});
    rig.world->Process(0)->InjectAsyncError(c.injected);
    absl::Status s0 = w0.Wait();
    EXPECT_EQ(s0.code(), c.code) << name << ": " << s0;
    EXPECT_THAT(std::string(s0.message()),
                HasSubstr(absl::StrCat(name, " (", static_cast<int>(c.injected), ")")));
    EXPECT_THAT(std::string(s0.message()), HasSubstr("fake: injected"));  // ncclGetLastError
    absl::Status s1 = w1.Wait();
    EXPECT_TRUE(absl::IsUnavailable(s1)) << name << ": " << s1;
    absl::Status s2 =
        comms[2]->AllReduce(Buffer::F32(v[2]), Buffer::F32(v[2]), ReduceOp::kSum, {}).Wait();
    EXPECT_TRUE(absl::IsUnavailable(s2)) << name << ": " << s2;
    for (int p = 0; p < 3; ++p) EXPECT_EQ(rig.world->Process(p)->CountCalls("ncclCommAbort"), 1);
  }
}

// A generation fails (rank 3 dies; the survivors' liveness aborts their communicators); the
// survivors build generation 1 — a new unique id under the g1 key, three ranks — and it works.
TEST(NcclLogic, RegenerationBuildsANewCommunicatorOverTheSurvivors) {
  Rig rig(4);
  auto g0 = rig.CreateOk({0, 1, 2, 3}, 0);
  std::vector<std::vector<float>> v(4);
  auto ok = OnEveryRank(g0, [&](int r, Communicator& c) {
    v[r] = Inputs(r, 100, 1);
    return c.AllReduce(Buffer::F32(v[r]), Buffer::F32(v[r]), ReduceOp::kSum, {}).Wait();
  });
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(ok[r].ok()) << ok[r];

  rig.world->Process(3)->Kill();
  std::vector<Work> pending(3);
  for (int r = 0; r < 3; ++r) {
    pending[r] = g0[r]->AllReduce(Buffer::F32(v[r]), Buffer::F32(v[r]), ReduceOp::kSum, {});
  }
  for (int r = 0; r < 3; ++r) {  // what each survivor's liveness monitor does
    g0[r]->Abort(BlamePeer(absl::UnavailableError("liveness: rank 3 died"), 3));
  }
  for (int r = 0; r < 3; ++r) {
    absl::Status s = pending[r].Wait();
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  }
  pending.clear();
  g0.clear();  // the dead rank's communicator too (its process does nothing any more)

  auto g1 = rig.CreateOk({0, 1, 2}, 1);
  ASSERT_EQ(g1.size(), 3u);
  auto id0 = rig.boots[1]->Lookup("job/g0/nccl-id", base::MonotonicNow() + absl::Seconds(1));
  auto id1 = rig.boots[1]->Lookup("job/g1/nccl-id", base::MonotonicNow() + absl::Seconds(1));
  ASSERT_TRUE(id0.ok() && id1.ok());
  EXPECT_NE(*id0, *id1);
  std::vector<uint64_t> ids;
  for (const auto& call : rig.world->Process(2)->Calls()) {
    if (call.name == "ncclCommInitRankConfig") ids.push_back(call.id);
  }
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_NE(ids[0], ids[1]);
  auto st = OnEveryRank(g1, [&](int r, Communicator& c) {
    EXPECT_EQ(c.size(), 3);
    EXPECT_EQ(c.generation(), 1u);
    v[r] = Inputs(r, 100, 2);
    absl::Status s = c.AllReduce(Buffer::F32(v[r]), Buffer::F32(v[r]), ReduceOp::kSum, {}).Wait();
    return s.ok() ? c.Barrier({}).Wait() : s;
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(v[r], Reference(3, 100, 2, ReduceOp::kSum));
  }
  g1.clear();
  for (int p = 0; p < 3; ++p) EXPECT_EQ(rig.world->Process(p)->Live(), FakeNcclResources{});
}

TEST(NcclLogic, HostOnlyFeaturesAndBadArgumentsAreInvalidArgumentAndLeaveItHealthy) {
  Rig rig(2);
  auto comms = rig.CreateOk({0, 1}, 0);
  Communicator& c = *comms[0];
  std::vector<float> a(8, 1.0f), b(4, 0.0f), big(16, 0.0f);
  CompressionState residual;
  CollectiveOptions ordered, topk, int8, zero;
  ordered.algorithm = Algorithm::kOrdered;
  topk.compression = Compression::kTopK;
  topk.compression_state = &residual;
  int8.compression = Compression::kInt8;
  int8.compression_state = &residual;
  zero.timeout = absl::ZeroDuration();
  std::vector<uint16_t> ha(8), hb(4);
  CollectiveOptions ordered_topk = topk;
  ordered_topk.algorithm = Algorithm::kOrdered;
  const std::vector<std::pair<const char*, Work>> bad = {
      {"ordered all-reduce", c.AllReduce(Buffer::F32(a), Buffer::F32(a), ReduceOp::kSum, ordered)},
      {"top-k all-reduce", c.AllReduce(Buffer::F32(a), Buffer::F32(a), ReduceOp::kSum, topk)},
      {"int8 all-reduce", c.AllReduce(Buffer::F32(a), Buffer::F32(a), ReduceOp::kAvg, int8)},
      {"ordered bf16 reduce-scatter",
       c.ReduceScatter(Buffer::BF16(ha), Buffer::BF16(hb), ReduceOp::kSum, ordered)},
      {"ordered max reduce-scatter",
       c.ReduceScatter(Buffer::F32(a), Buffer::F32(b), ReduceOp::kMax, ordered)},
      {"ordered avg reduce-scatter",
       c.ReduceScatter(Buffer::F32(a), Buffer::F32(b), ReduceOp::kAvg, ordered)},
      {"ordered top-k reduce-scatter",
       c.ReduceScatter(Buffer::F32(a), Buffer::F32(b), ReduceOp::kSum, ordered_topk)},
      {"ordered reduce-scatter counts",
       c.ReduceScatter(Buffer::F32(a), Buffer::F32(a), ReduceOp::kSum, ordered)},
      {"ordered all-gather", c.AllGather(Buffer::F32(b), Buffer::F32(a), ordered)},
      {"zero timeout", c.Barrier(zero)},
      {"all-reduce counts", c.AllReduce(Buffer::F32(a), Buffer::F32(b), ReduceOp::kSum, {})},
      {"all-reduce dtypes",
       c.AllReduce(Buffer::F32(a), Buffer::BF16(nullptr, 0), ReduceOp::kSum, {})},
      {"reduce-scatter counts",
       c.ReduceScatter(Buffer::F32(a), Buffer::F32(a), ReduceOp::kSum, {})},
      {"all-gather counts", c.AllGather(Buffer::F32(a), Buffer::F32(a), {})},
      {"null data", c.AllReduce(Buffer::F32(nullptr, 8), Buffer::F32(a), ReduceOp::kSum, {})},
      {"broadcast root", c.Broadcast(Buffer::F32(a), 2, {})},
      {"send to self", c.Send(Buffer::F32(a), 0, 0, {})},
      {"recv from nowhere", c.Recv(Buffer::F32(a), -1, 0, {})},
  };
  for (const auto& [what, w] : bad) {
    EXPECT_TRUE(w.IsDone()) << what;
    absl::Status s = w.Wait();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << what << ": " << s;
  }
  // The messages name what is expected.
  EXPECT_THAT(std::string(bad[0].second.Wait().message()),
              HasSubstr("algorithm kOrdered expected only with ReduceScatter"));
  EXPECT_THAT(std::string(bad[3].second.Wait().message()),
              HasSubstr("ReduceScatter (kOrdered): input.dtype expected kF32"));
  EXPECT_THAT(std::string(bad[4].second.Wait().message()),
              HasSubstr("ReduceScatter (kOrdered): op expected kSum"));
  EXPECT_THAT(std::string(bad[6].second.Wait().message()), HasSubstr("compression expected kNone"));
  // Nothing reached NCCL, and the communicator still works.
  EXPECT_EQ(rig.world->Process(0)->CountCalls("ncclAllReduce"), 0);
  EXPECT_EQ(rig.world->Process(0)->CountCalls("ncclAllGather"), 0);
  EXPECT_EQ(rig.world->Process(0)->CountCalls("ncclReduceScatter"), 0);
  std::vector<std::vector<float>> v = {Inputs(0, 8, 1), Inputs(1, 8, 1)};
  auto st = OnEveryRank(comms, [&](int r, Communicator& x) {
    return x.AllReduce(Buffer::F32(v[r]), Buffer::F32(v[r]), ReduceOp::kSum, {}).Wait();
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(st[r].ok()) << st[r];
  EXPECT_EQ(v[0], Reference(2, 8, 1, ReduceOp::kSum));
  EXPECT_THAT(c.DebugString(), HasSubstr("healthy"));
}

TEST(NcclLogic, DestroyingWithOperationsInFlightAbortsCleanly) {
  Rig rig(2);
  auto comms = rig.CreateOk({0, 1}, 0);
  std::vector<float> v(64, 1.0f);
  Work a = comms[0]->AllReduce(Buffer::F32(v), Buffer::F32(v), ReduceOp::kSum, {});
  Work b = comms[0]->Barrier({});
  std::atomic<bool> waited{false};
  absl::Status sa;
  std::thread waiter([&] {
    sa = a.Wait();
    waited = true;
  });
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_FALSE(waited.load());
  const absl::Time start = base::MonotonicNow();
  comms[0].reset();
  waiter.join();
  EXPECT_LT(base::MonotonicNow() - start, absl::Seconds(2));
  EXPECT_TRUE(absl::IsCancelled(sa)) << sa;
  EXPECT_TRUE(absl::IsCancelled(b.Wait())) << b.Wait();
  EXPECT_EQ(v, std::vector<float>(64, 1.0f));
  EXPECT_EQ(rig.world->Process(0)->CountCalls("ncclCommAbort"), 1);
  // The Works hold the last reference: once they are gone, so is everything on the "device".
  a = Work();
  b = Work();
  EXPECT_EQ(rig.world->Process(0)->Live(), FakeNcclResources{});
  // The peer sees the abort at its next call.
  absl::Status peer = comms[1]->Barrier({}).Wait();
  EXPECT_TRUE(absl::IsUnavailable(peer)) << peer;
  comms[1].reset();
  EXPECT_EQ(rig.world->Process(1)->Live(), FakeNcclResources{});
}

// --- Ordered (deterministic) reduce-scatter -------------------------------------------------

using testing::Intervals;
using testing::TrainerBlocks;

// Microbatch k's gradient, element i: magnitudes from 2^-20 to 2^20, so the order of the
// additions shows in the rounded sums.
float Grad(uint64_t k, size_t i) {
  return std::ldexp(Val(static_cast<int>(k), i, 11), static_cast<int>((k * 7 + i * 3) % 41) - 20);
}

float SubtreeAt(uint64_t lo, uint64_t hi, size_t i) {
  if (hi - lo == 1) return Grad(lo, i);
  const uint64_t mid = CanonicalMid(lo, hi);
  return SubtreeAt(lo, mid, i) + SubtreeAt(mid, hi, i);
}

// The canonical-tree sum T(lo, hi) of the gradients, `count` elements.
std::vector<float> Subtree(uint64_t lo, uint64_t hi, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = SubtreeAt(lo, hi, i);
  return v;
}

CollectiveOptions Ordered(const std::pair<uint64_t, uint64_t>& interval,
                          absl::Duration timeout = absl::Seconds(20)) {
  CollectiveOptions o;
  o.algorithm = Algorithm::kOrdered;
  o.interval_lo = interval.first;
  o.interval_hi = interval.second;
  o.timeout = timeout;
  return o;
}

bool SameBits(const float* a, const float* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

constexpr float kUntouched = 12345.0f;

// For W = 1..5 ranks, M = 8 and M = 7 microbatches split as the trainer splits them (and M = 8,
// W = 3 also as [0,4) [4,6) [6,8)), blocks of 1, 3, 0 and 257 elements, and once in place (the
// output inside the input): the NCCL communicator's ordered reduce-scatter gives the bits of the
// in-process communicator's — the serial canonical tree — on every rank. Each rank issues all
// its operations before waiting for any (each issue finishes the previous one's combine).
TEST(NcclLogicOrdered, BitIdenticalToTheInProcessCommunicatorForEveryGroupSize) {
  size_t order_mattered = 0;
  for (int w = 1; w <= 5; ++w) {
    struct Case {
      Intervals iv;
      uint64_t m;
      size_t block;
      bool in_place;
    };
    std::vector<Case> cases;
    for (uint64_t m : {8u, 7u}) {
      std::vector<Intervals> layouts = {TrainerBlocks(m, w)};
      if (m == 8 && w == 3) layouts.push_back({{0, 4}, {4, 6}, {6, 8}});
      for (const Intervals& iv : layouts) {
        for (size_t block : {1u, 3u, 0u, 257u}) cases.push_back({iv, m, block, false});
      }
    }
    cases.push_back({TrainerBlocks(8, w), 8, 64, true});
    const size_t k = cases.size();
    // inputs[c][r]: rank r's partial over its interval, for every block.
    std::vector<std::vector<std::vector<float>>> inputs(k), nccl(k), inproc(k);
    for (size_t c = 0; c < k; ++c) {
      for (int r = 0; r < w; ++r) {
        const auto [lo, hi] = cases[c].iv[r];
        inputs[c].push_back(Subtree(lo, hi, w * cases[c].block));
      }
      nccl[c] = inproc[c] = inputs[c];  // in place: the output is a slice of these
      for (int r = 0; r < w && !cases[c].in_place; ++r) {
        nccl[c][r].assign(cases[c].block, kUntouched);
        inproc[c][r].assign(cases[c].block, kUntouched);
      }
    }
    auto output = [&](std::vector<float>& v, size_t c, int r) {
      return cases[c].in_place ? Buffer::F32(v.data() + r * cases[c].block, cases[c].block)
                               : Buffer::F32(v);
    };

    Rig rig(w);
    std::vector<int> procs(w);
    for (int r = 0; r < w; ++r) procs[r] = r;
    auto comms = rig.CreateOk(procs, 0);
    auto st = OnEveryRank(comms, [&](int r, Communicator& comm) -> absl::Status {
      std::vector<Work> works;
      for (size_t c = 0; c < k; ++c) {
        Buffer in = cases[c].in_place ? Buffer::F32(nccl[c][r]) : Buffer::F32(inputs[c][r]);
        works.push_back(comm.ReduceScatter(in, output(nccl[c][r], c, r), ReduceOp::kSum,
                                           Ordered(cases[c].iv[r])));
      }
      for (size_t c = 0; c < k; ++c) {
        TROUPE_RETURN_IF_ERROR(works[c].Wait());
      }
      return absl::OkStatus();
    });
    std::vector<std::unique_ptr<Communicator>> host;
    auto group = InProcessGroup::Create(w, 0, &host);
    auto host_st = OnEveryRank(host, [&](int r, Communicator& comm) -> absl::Status {
      for (size_t c = 0; c < k; ++c) {
        Buffer in = cases[c].in_place ? Buffer::F32(inproc[c][r]) : Buffer::F32(inputs[c][r]);
        TROUPE_RETURN_IF_ERROR(comm.ReduceScatter(in, output(inproc[c][r], c, r), ReduceOp::kSum,
                                                  Ordered(cases[c].iv[r]))
                                   .Wait());
      }
      return absl::OkStatus();
    });
    size_t nonempty = 0;
    for (const Case& c : cases) nonempty += c.block > 0;
    for (int r = 0; r < w; ++r) {
      ASSERT_TRUE(st[r].ok()) << "W=" << w << " rank " << r << ": " << st[r];
      ASSERT_TRUE(host_st[r].ok()) << "W=" << w << " rank " << r << ": " << host_st[r];
      for (size_t c = 0; c < k; ++c) {
        const size_t block = cases[c].block, at = cases[c].in_place ? r * block : 0;
        const std::vector<float> want = Subtree(0, cases[c].m, w * block);
        const float* got = nccl[c][r].data() + at;
        EXPECT_TRUE(SameBits(got, inproc[c][r].data() + at, block))
            << "W=" << w << " case " << c << " rank " << r;
        EXPECT_TRUE(SameBits(got, want.data() + r * block, block))
            << "W=" << w << " case " << c << " rank " << r;
        for (size_t i = 0; i < block; ++i) {
          float naive = 0.0f;
          for (uint64_t j = 0; j < cases[c].m; ++j) naive += Grad(j, r * block + i);
          order_mattered += naive != got[i];
        }
      }
      // One interval all-gather and one group of sends and receives per operation with data;
      // W - 1 additions each (W = 1: a copy, except in place, where the output is the input).
      auto p = rig.world->Process(r);
      EXPECT_EQ(p->CountCalls("ncclAllGather"), static_cast<int>(nonempty));
      EXPECT_EQ(p->CountCalls("ncclGroupStart"), w > 1 ? static_cast<int>(nonempty) : 0);
      EXPECT_EQ(p->CountCalls("ncclSend"), static_cast<int>(nonempty) * (w - 1));
      EXPECT_EQ(p->CountCalls("AddF32"), static_cast<int>(nonempty) * (w - 1));
      EXPECT_EQ(comms[r]->stats().ops_completed, nonempty);
      EXPECT_THAT(comms[r]->DebugString(), HasSubstr("pending 0 status healthy"));
    }
    comms.clear();
    for (int r = 0; r < w; ++r) {
      EXPECT_EQ(rig.world->Process(r)->Live(), FakeNcclResources{}) << "W=" << w << " rank " << r;
    }
  }
  EXPECT_GT(order_mattered, 1000u);  // the canonical order is what made these bits
}

// The sharded-optimizer pattern: the ordered reduce-scatter's output goes straight into an
// all-gather issued before anyone waited. The combine is enqueued before the all-gather (stream
// order), and every rank gets the whole canonical sum. Issued from one thread for all ranks
// (issuing does not wait for peers), with every NCCL call staying in progress for a few polls.
TEST(NcclLogicOrdered, LaterOperationsSeeTheResultAndIssuingDoesNotWaitForPeers) {
  const int n = 3;
  const size_t block = 100;
  Rig rig(n);
  for (int p = 0; p < n; ++p) rig.world->Process(p)->SetEnqueueInProgressPolls(3);
  auto comms = rig.CreateOk({0, 1, 2}, 0);
  const Intervals iv = {{0, 4}, {4, 6}, {6, 8}};
  std::vector<std::vector<float>> in(n), shard(n, std::vector<float>(block, kUntouched)),
      full(n, std::vector<float>(n * block, kUntouched));
  std::vector<Work> works;
  for (int r = 0; r < n; ++r) {
    in[r] = Subtree(iv[r].first, iv[r].second, n * block);
    works.push_back(comms[r]->ReduceScatter(Buffer::F32(in[r]), Buffer::F32(shard[r]),
                                            ReduceOp::kSum, Ordered(iv[r])));
  }
  for (int r = 0; r < n; ++r) {  // each rank's all-gather waits for its own intervals, all here
    works.push_back(comms[r]->AllGather(Buffer::F32(shard[r]), Buffer::F32(full[r]), {}));
  }
  for (Work& w : works) ASSERT_TRUE(w.Wait().ok()) << w.Wait();
  const std::vector<float> want = Subtree(0, 8, n * block);
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(SameBits(full[r].data(), want.data(), n * block)) << "rank " << r;
    EXPECT_TRUE(SameBits(shard[r].data(), want.data() + r * block, block)) << "rank " << r;
  }
}

// Intervals that are not a canonical cut of [0, M): the same InvalidArgument as the host
// backends give, on every rank, with the output untouched; the communicator stays healthy (a
// host backend's failure is sticky) and the next ordered reduce-scatter is right.
TEST(NcclLogicOrdered, BadIntervalsAreInvalidArgumentOnEveryRankAndLeaveItHealthy) {
  const int n = 3;
  const size_t block = 16;
  Rig rig(n);
  auto comms = rig.CreateOk({0, 1, 2}, 0);
  struct Case {
    const char* what;
    Intervals iv;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"not a subtree", {{0, 3}, {3, 4}, {4, 8}}, "no rank holds contribution [0, 1)"},
      {"a gap", {{0, 2}, {2, 4}, {6, 8}}, "no rank holds contribution [4, 5)"},
      {"overlapping", {{0, 4}, {2, 4}, {4, 8}}, "rank 1's contribution [2, 4) is not used"},
      {"twice", {{0, 4}, {4, 8}, {4, 8}}, "rank 2's contribution [4, 8) is not used"},
  };
  for (const Case& c : cases) {
    std::vector<std::vector<float>> in(n), out(n, std::vector<float>(block, kUntouched));
    for (int r = 0; r < n; ++r) in[r] = Inputs(r, n * block, 7);
    auto st = OnEveryRank(comms, [&](int r, Communicator& comm) {
      return comm
          .ReduceScatter(Buffer::F32(in[r]), Buffer::F32(out[r]), ReduceOp::kSum, Ordered(c.iv[r]))
          .Wait();
    });
    // A host backend's failure is sticky: a group of its own for each case.
    std::vector<std::unique_ptr<Communicator>> host;
    auto group = InProcessGroup::Create(n, 0, &host);
    auto host_st = OnEveryRank(host, [&](int r, Communicator& comm) {
      std::vector<float> o(block);
      return comm
          .ReduceScatter(Buffer::F32(in[r]), Buffer::F32(o), ReduceOp::kSum, Ordered(c.iv[r]))
          .Wait();
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << c.what << " rank " << r << ": " << st[r];
      EXPECT_THAT(std::string(st[r].message()), HasSubstr("ReduceScatter (kOrdered)"));
      EXPECT_THAT(std::string(st[r].message()), HasSubstr(c.message)) << c.what;
      EXPECT_TRUE(absl::IsInvalidArgument(host_st[r])) << c.what << ": " << host_st[r];
      EXPECT_THAT(std::string(host_st[r].message()), HasSubstr(c.message)) << c.what;
      EXPECT_EQ(out[r], std::vector<float>(block, kUntouched)) << c.what << " rank " << r;
    }
  }
  const Intervals good = TrainerBlocks(8, n);
  std::vector<std::vector<float>> in(n), out(n, std::vector<float>(block, kUntouched));
  auto st = OnEveryRank(comms, [&](int r, Communicator& comm) {
    in[r] = Subtree(good[r].first, good[r].second, n * block);
    absl::Status s = comm.ReduceScatter(Buffer::F32(in[r]), Buffer::F32(out[r]), ReduceOp::kSum,
                                        Ordered(good[r]))
                         .Wait();
    return s.ok() ? comm.Barrier({}).Wait() : s;
  });
  const std::vector<float> want = Subtree(0, 8, n * block);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_TRUE(SameBits(out[r].data(), want.data() + r * block, block)) << "rank " << r;
    EXPECT_THAT(comms[r]->DebugString(), HasSubstr("healthy"));
    EXPECT_EQ(rig.world->Process(r)->CountCalls("ncclCommAbort"), 0);
  }
}

// A rank dies during an ordered reduce-scatter — before every interval arrived (it never issued
// the operation), or after (it issued the intervals' all-gather, then stalled and died before
// sending its partials). Rank 1's liveness monitor aborts its communicator: rank 1 fails with the
// liveness status, ranks 0 and 2 with Unavailable (ncclRemoteError), all well before their
// 30-second deadlines.
TEST(NcclLogicOrdered, APeerDyingMidOperationFailsTheOthersFast) {
  const int n = 4;
  const size_t block = 32;
  for (bool intervals_arrived : {false, true}) {
    SCOPED_TRACE(intervals_arrived ? "died after the intervals" : "died before the intervals");
    Rig rig(n);
    auto comms = rig.CreateOk({0, 1, 2, 3}, 0);
    const Intervals iv = TrainerBlocks(8, n);
    std::vector<std::vector<float>> in(n), out(n, std::vector<float>(block, kUntouched));
    for (int r = 0; r < n; ++r) in[r] = Subtree(iv[r].first, iv[r].second, n * block);
    if (intervals_arrived) {
      // Rank 3's all-gather runs, but its enqueue stays "in progress": its thread never gets to
      // the sends and receives.
      rig.world->Process(3)->SetEnqueueInProgressPolls(1 << 30);
    } else {
      rig.world->Process(3)->Kill();
    }
    const absl::Status liveness = BlamePeer(absl::UnavailableError("liveness: rank 3 died"), 3);
    std::vector<absl::Status> st(n);
    std::vector<absl::Duration> waited(n);
    std::thread aborter([&] {
      if (intervals_arrived) {
        // Ranks 0..2 got every interval and enqueued their additions; then rank 3 dies.
        const absl::Time until = base::MonotonicNow() + absl::Seconds(5);
        while (base::MonotonicNow() < until && (rig.world->Process(0)->CountCalls("AddF32") == 0 ||
                                                rig.world->Process(2)->CountCalls("AddF32") == 0)) {
          absl::SleepFor(absl::Milliseconds(5));
        }
        EXPECT_GT(rig.world->Process(0)->CountCalls("AddF32"), 0);
        rig.world->Process(3)->Kill();
      }
      absl::SleepFor(absl::Milliseconds(50));
      comms[1]->Abort(liveness);
    });
    ForEachRank(intervals_arrived ? n : n - 1, [&](int r) {
      const absl::Time t = base::MonotonicNow();
      st[r] = comms[r]
                  ->ReduceScatter(Buffer::F32(in[r]), Buffer::F32(out[r]), ReduceOp::kSum,
                                  Ordered(iv[r], absl::Seconds(30)))
                  .Wait();
      waited[r] = base::MonotonicNow() - t;
      if (r == 1 && intervals_arrived) comms[3]->Abort(absl::CancelledError("rank 3 is dead"));
    });
    aborter.join();
    EXPECT_EQ(st[1], liveness);
    for (int r : {0, 2}) {
      EXPECT_TRUE(absl::IsUnavailable(st[r])) << r << ": " << st[r];
      EXPECT_THAT(std::string(st[r].message()), HasSubstr("ncclRemoteError"));
    }
    for (int r = 0; r < 3; ++r) {
      EXPECT_LT(waited[r], absl::Seconds(5)) << "rank " << r;
      EXPECT_EQ(rig.world->Process(r)->CountCalls("ncclCommAbort"), 1) << "rank " << r;
      // Sticky: the next ordered reduce-scatter fails at once with the same status.
      Work later = comms[r]->ReduceScatter(Buffer::F32(in[r]), Buffer::F32(out[r]), ReduceOp::kSum,
                                           Ordered(iv[r]));
      EXPECT_TRUE(later.IsDone());
      EXPECT_EQ(later.Wait(), st[r]);
    }
    if (intervals_arrived) {
      EXPECT_FALSE(st[3].ok());
    }
  }
}

// Nobody aborts and a rank never issues its part: the ordered reduce-scatter ends at its own
// deadline (DeadlineExceeded) and aborts the communicator, so the peer fails at its next call.
TEST(NcclLogicOrdered, DeadlineWhileWaitingForIntervalsIsDeadlineExceeded) {
  Rig rig(2);
  auto comms = rig.CreateOk({0, 1}, 0);
  std::vector<float> in(16, 1.0f), out(8, kUntouched);
  const absl::Time start = base::MonotonicNow();
  absl::Status st = comms[0]
                        ->ReduceScatter(Buffer::F32(in), Buffer::F32(out), ReduceOp::kSum,
                                        Ordered({0, 1}, absl::Milliseconds(150)))
                        .Wait();
  const absl::Duration took = base::MonotonicNow() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("waiting for every rank's interval"));
  EXPECT_GE(took, absl::Milliseconds(150));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(out, std::vector<float>(8, kUntouched));
  EXPECT_EQ(rig.world->Process(0)->CountCalls("ncclCommAbort"), 1);
  absl::Status peer = comms[1]->Barrier({}).Wait();
  EXPECT_TRUE(absl::IsUnavailable(peer)) << peer;
}

}  // namespace
}  // namespace troupe::collectives
