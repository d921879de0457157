// The NCCL communicator's logic without a GPU: the real communicator code over the in-process
// fake (nccl_fake.h), ranks as threads, the unique id through a real TCP bootstrap. Covers
// creation, every operation's result, validation, a rank missing at init, Abort as the liveness
// channel calls it, deadlines, injected NCCL errors, destruction with operations in flight, and
// regeneration over the survivors. Short timeouts: the binary runs in a few seconds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "nccl_backend.h"
#include "nccl_fake.h"
#include "reduce.h"
#include "test_util.h"
#include "troupe/collectives/nccl_communicator.h"

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
  }
  // Rank 0 published the id under <prefix>/g<gen>/nccl-id; every process joined that id.
  auto id = rig.boots[0]->Lookup("job/g0/nccl-id", absl::Now() + absl::Seconds(1));
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
      if (absl::Status s = w.Wait(); !s.ok()) return s;
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
  const absl::Time start = absl::Now();
  absl::Status st = comms[0]->AllReduce(Buffer::F32(v), Buffer::F32(v), ReduceOp::kSum, {}).Wait();
  aborter.join();
  EXPECT_EQ(st, liveness);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
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
    const absl::Time start = absl::Now();
    std::vector<CommOr> comms = rig.Create({0, 1, -1, 3}, 0, connect);
    const absl::Duration took = absl::Now() - start;
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
    const absl::Time start = absl::Now();
    std::vector<CommOr> comms = rig.Create({-1, 1, 2, 3}, 0, connect);
    EXPECT_LT(absl::Now() - start, connect + absl::Seconds(2));
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
    const absl::Time t = absl::Now();
    st[r] = works[r].Wait();
    waited[r] = absl::Now() - t;
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
  const absl::Time start = absl::Now();
  // Rank 1 never issues its all-reduce.
  absl::Status st = comms[0]
                        ->AllReduce(Buffer::F32(v), Buffer::F32(v), ReduceOp::kSum,
                                    Timeout(absl::Milliseconds(150)))
                        .Wait();
  const absl::Duration took = absl::Now() - start;
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
  const absl::Time start = absl::Now();
  absl::Status s0, s1;
  std::thread t([&] { s1 = w1.Wait(); });
  s0 = w0.Wait();
  t.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s0)) << s0;
  EXPECT_TRUE(absl::IsUnavailable(s1)) << s1;  // released by rank 0's abort, not its own 30 s
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
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
  auto id0 = rig.boots[1]->Lookup("job/g0/nccl-id", absl::Now() + absl::Seconds(1));
  auto id1 = rig.boots[1]->Lookup("job/g1/nccl-id", absl::Now() + absl::Seconds(1));
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
  const std::vector<std::pair<const char*, Work>> bad = {
      {"ordered all-reduce", c.AllReduce(Buffer::F32(a), Buffer::F32(a), ReduceOp::kSum, ordered)},
      {"top-k all-reduce", c.AllReduce(Buffer::F32(a), Buffer::F32(a), ReduceOp::kSum, topk)},
      {"int8 all-reduce", c.AllReduce(Buffer::F32(a), Buffer::F32(a), ReduceOp::kAvg, int8)},
      {"ordered reduce-scatter",
       c.ReduceScatter(Buffer::F32(a), Buffer::F32(b), ReduceOp::kSum, ordered)},
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
  // Nothing reached NCCL, and the communicator still works.
  EXPECT_EQ(rig.world->Process(0)->CountCalls("ncclAllReduce"), 0);
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
  const absl::Time start = absl::Now();
  comms[0].reset();
  waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
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

}  // namespace
}  // namespace troupe::collectives
