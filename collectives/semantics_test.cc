// Semantics on the in-process backend: the deterministic mode is bit-exact for any group size,
// failures are typed and sticky, arguments are validated, compression keeps error feedback.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "algorithms.h"
#include "engine.h"
#include "test_util.h"
#include "troupe/collectives/inprocess.h"

namespace troupe::collectives {
namespace {

using testing::ForEachRank;
using testing::Input;

std::vector<float> Tree(const std::vector<std::vector<float>>& leaves, uint64_t lo, uint64_t hi) {
  if (hi - lo == 1) return leaves[lo];
  const uint64_t mid = CanonicalMid(lo, hi);
  auto a = Tree(leaves, lo, mid), b = Tree(leaves, mid, hi);
  for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] + b[i];
  return a;
}

// The completion flag every Work waits on: threads asleep on it (the futex path) all wake when it
// is set, a thread arriving after it was set does not sleep, and setting it twice is harmless.
TEST(WorkFlag, EverySleeperWakesAndLateWaitersReturnAtOnce) {
  Work::Flag flag;
  std::atomic<int> woke{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 8; ++i) {
    waiters.emplace_back([&] {
      flag.WaitForNotification();
      woke.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let them fall asleep
  EXPECT_EQ(woke.load(), 0);
  EXPECT_FALSE(flag.HasBeenNotified());
  flag.Notify();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woke.load(), 8);
  EXPECT_TRUE(flag.HasBeenNotified());
  flag.Notify();
  flag.WaitForNotification();  // already set: returns
  EXPECT_TRUE(flag.HasBeenNotified());
}

TEST(WorkFlag, RacingNotifyAndWaitNeverLoseTheWakeUp) {
  for (int round = 0; round < 2000; ++round) {
    Work::Flag flag;
    std::thread waiter([&] { flag.WaitForNotification(); });
    if (round % 2 == 0) std::this_thread::yield();
    flag.Notify();
    waiter.join();  // a lost wake-up hangs here (the test's timeout fails it)
    ASSERT_TRUE(flag.HasBeenNotified());
  }
}

TEST(CanonicalMid, LargestPowerOfTwoStrictlyBelow) {
  EXPECT_EQ(CanonicalMid(0, 2), 1u);
  EXPECT_EQ(CanonicalMid(0, 4), 2u);
  EXPECT_EQ(CanonicalMid(0, 5), 4u);
  EXPECT_EQ(CanonicalMid(4, 7), 6u);
  EXPECT_EQ(CanonicalMid(8, 16), 12u);
}

// M microbatch gradients; each layout assigns whole subtrees to ranks; every layout must give
// the bit-identical result of the serial canonical tree.
TEST(Ordered, BitExactForAnyNumberOfRanks) {
  const size_t count = 10007;
  for (uint64_t m : {8u, 7u}) {
    std::vector<std::vector<float>> leaves(m);
    for (uint64_t k = 0; k < m; ++k) leaves[k] = Input(static_cast<int>(k), count, DType::kF32, 77);
    const std::vector<float> want = Tree(leaves, 0, m);
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> layouts;
    if (m == 8) {
      layouts = {{{0, 8}},
                 {{0, 4}, {4, 8}},
                 {{0, 4}, {4, 6}, {6, 8}},
                 {{0, 2}, {2, 4}, {4, 6}, {6, 8}},
                 {{0, 2}, {2, 4}, {4, 6}, {6, 7}, {7, 8}},
                 {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}, {7, 8}}};
    } else {
      layouts = {
          {{0, 7}}, {{0, 4}, {4, 7}}, {{0, 4}, {4, 6}, {6, 7}}, {{0, 2}, {2, 4}, {4, 6}, {6, 7}}};
    }
    for (const auto& layout : layouts) {
      const int n = static_cast<int>(layout.size());
      std::vector<std::unique_ptr<Communicator>> comms;
      auto group = InProcessGroup::Create(n, 0, &comms);
      ForEachRank(n, [&](int r) {
        std::vector<float> mine = Tree(leaves, layout[r].first, layout[r].second);
        CollectiveOptions o;
        o.algorithm = Algorithm::kOrdered;
        o.interval_lo = layout[r].first;
        o.interval_hi = layout[r].second;
        ASSERT_TRUE(comms[r]
                        ->AllReduce(Buffer::F32(mine), Buffer::F32(mine), ReduceOp::kSum, o)
                        .Wait()
                        .ok());
        ASSERT_EQ(std::memcmp(mine.data(), want.data(), count * 4), 0)
            << "m=" << m << " ranks=" << n << " rank " << r;
      });
    }
  }
}

TEST(Ordered, RejectsIntervalsThatAreNotSubtrees) {
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(2, 0, &comms);
  ForEachRank(2, [&](int r) {
    std::vector<float> v(16, 1.0f);
    CollectiveOptions o;
    o.algorithm = Algorithm::kOrdered;
    o.interval_lo = r == 0 ? 0 : 3;  // [0,3) is not a node of the canonical tree of [0,4)
    o.interval_hi = r == 0 ? 3 : 4;
    absl::Status st = comms[r]->AllReduce(Buffer::F32(v), Buffer::F32(v), ReduceOp::kSum, o).Wait();
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  });
}

// Ranks issue different point-to-point operations (rank 0 sends to 1 only); the collectives after
// them must still match up on every rank.
TEST(PointToPoint, UnevenSendsDoNotShiftLaterCollectives) {
  const int n = 3;
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(n, 0, &comms);
  CollectiveOptions o;
  o.timeout = absl::Seconds(20);
  std::vector<std::vector<float>> sums(n, std::vector<float>(1000, 1.0f));
  std::vector<absl::Status> st(n);
  ForEachRank(n, [&](int r) {
    std::vector<float> msg(10, 5.0f);
    if (r == 0) st[r] = comms[0]->Send(Buffer::F32(msg), 1, 7, o).Wait();
    if (r == 1) st[r] = comms[1]->Recv(Buffer::F32(msg), 0, 7, o).Wait();
    if (!st[r].ok()) return;
    st[r] =
        comms[r]->AllReduce(Buffer::F32(sums[r]), Buffer::F32(sums[r]), ReduceOp::kSum, o).Wait();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    EXPECT_EQ(sums[r][0], 3.0f) << "rank " << r;
  }
}

TEST(WorkFlag, ATimedWaitReturnsFalseOnTimeoutAndTrueOnceNotified) {
  Work::Flag flag;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(flag.WaitForNotificationWithTimeout(absl::Milliseconds(20)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(15));
  std::thread notifier([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    flag.Notify();
  });
  EXPECT_TRUE(flag.WaitForNotificationWithTimeout(absl::Seconds(20)));
  notifier.join();
  EXPECT_TRUE(flag.WaitForNotificationWithTimeout(absl::ZeroDuration()));  // set: at once
}

// Two threads of one rank wait on two of its receives. The first runs the engine (it holds the
// execution lock, polling for its receive); the peer sends the first receive's message only once
// the second thread's Wait has returned. The second receive completes at once: its waiter must
// see that rather than queue behind the first on the lock — queued, both waited until the peer
// gave up, and the first receive's deadline passed.
TEST(PointToPoint, AWaiterWhoseOperationCompletedReturnsWhileAnotherWaitsOnThePeer) {
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(2, 0, &comms);
  CollectiveOptions o;
  o.timeout = absl::Seconds(20);
  std::vector<float> x(4, 0.0f), y(4, 0.0f), sx(4, 1.0f), sy(4, 2.0f);
  Work rx = comms[0]->Recv(Buffer::F32(x), 1, 1, o);
  Work ry = comms[0]->Recv(Buffer::F32(y), 1, 2, o);
  absl::Notification second_returned;
  absl::Status first, second, peer;
  std::thread a([&] { first = rx.Wait(); });
  // `a` runs the engine from here, as a rule (if not, the test passes without the situation).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread b([&] {
    second = ry.Wait();
    second_returned.Notify();
  });
  std::thread sender([&] {
    peer = comms[1]->Send(Buffer::F32(sy), 0, 2, o).Wait();
    const bool returned = second_returned.WaitForNotificationWithTimeout(absl::Seconds(5));
    EXPECT_TRUE(returned) << "the second waiter's receive completed, but its Wait did not return "
                             "within 5 s while the first waiter waited on the peer";
    const absl::Status second_send = comms[1]->Send(Buffer::F32(sx), 0, 1, o).Wait();
    if (peer.ok()) peer = second_send;  // unblocks `a` either way
  });
  sender.join();
  b.join();
  a.join();
  EXPECT_TRUE(peer.ok()) << peer;
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_TRUE(second.ok()) << second;
  EXPECT_EQ(x, sx);
  EXPECT_EQ(y, sy);
}

TEST(Failure, KilledRankFailsEveryPendingOpWithUnavailableNamingIt) {
  const int n = 4;
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(n, 0, &comms);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(1 << 16, 1.0f));
  std::vector<Work> works;
  CollectiveOptions o;
  o.timeout = absl::InfiniteDuration();  // only detection can end these operations
  for (int r = 0; r < n; ++r) {
    if (r == 2) continue;  // rank 2 never joins: the others block on it
    works.push_back(
        comms[r]->AllReduce(Buffer::F32(bufs[r]), Buffer::F32(bufs[r]), ReduceOp::kSum, o));
  }
  group->KillRank(2);
  for (auto& w : works) {
    absl::Status st = w.Wait();
    EXPECT_TRUE(absl::IsUnavailable(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "rank 2")) << st;
  }
  // Sticky: later operations fail at once with the same status.
  absl::Status later = comms[0]->Barrier({}).Wait();
  EXPECT_TRUE(absl::IsUnavailable(later)) << later;
}

TEST(Failure, GenerationChangeAbortsWithAborted) {
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(2, 5, &comms);
  std::vector<float> v(100, 1.0f);
  CollectiveOptions o;
  o.timeout = absl::InfiniteDuration();
  Work w = comms[0]->AllReduce(Buffer::F32(v), Buffer::F32(v), ReduceOp::kSum, o);
  comms[0]->AbortForGeneration(6);
  absl::Status st = w.Wait();
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "generation 5")) << st;
}

TEST(Failure, DeadlineIsTheLastResort) {
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(2, 0, &comms);
  std::vector<float> v(100, 1.0f);
  CollectiveOptions o;
  o.timeout = absl::Milliseconds(20);
  absl::Status st = comms[0]->AllReduce(Buffer::F32(v), Buffer::F32(v), ReduceOp::kSum, o).Wait();
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
}

// A transport whose peer never answers: posts stay pending until it fails, and the post after
// fail_next_post fails it, as UCX does when a send meets a dead peer's endpoint.
class SilentPeerTransport : public Transport {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  absl::StatusOr<ReqId> PostSend(int, uint64_t, const void*, size_t) override { return Post(); }
  absl::StatusOr<ReqId> PostRecv(int, uint64_t, void*, size_t) override { return Post(); }
  absl::Status WaitAll(absl::Span<const ReqId>, absl::Time) override { return failure(); }
  absl::StatusOr<bool> Test(ReqId) override {
    if (absl::Status f = failure(); !f.ok()) return f;
    return false;
  }
  void CancelAll() override {}
  void Fail(absl::Status status) override {
    std::lock_guard<std::mutex> l(mu_);
    if (failed_.ok()) failed_ = std::move(status);
  }
  void* Scratch(int, size_t bytes) override {
    scratch_.resize(bytes);
    return scratch_.data();
  }
  std::atomic<int> posts{0};
  std::atomic<bool> fail_next_post{false};

 private:
  absl::Status failure() {
    std::lock_guard<std::mutex> l(mu_);
    return failed_;
  }
  absl::StatusOr<ReqId> Post() {
    if (absl::Status f = failure(); !f.ok()) return f;
    if (fail_next_post.exchange(false)) {
      Fail(absl::UnavailableError("collectives: peer rank 1 is gone (its endpoint failed)"));
      return failure();
    }
    return static_cast<ReqId>(++posts);
  }
  std::mutex mu_;
  absl::Status failed_;
  std::vector<uint8_t> scratch_;
};

// A receive is in flight when a send's post fails the transport: both fail with the transport's
// status, and the communicator is destroyed at once (its executor thread once kept polling the
// emptied list of pending operations, and the destructor waited on it forever: a rank's next
// generation never started after a peer host lost power).
TEST(Failure, APostThatFailsTheTransportReleasesPendingOpsAndDestructionReturns) {
  auto transport = std::make_unique<SilentPeerTransport>();
  SilentPeerTransport* t = transport.get();
  auto engine = std::make_unique<Engine>(std::move(transport), 0, "silent");
  std::vector<float> in(16, 1.0f), out(16, 0.0f);
  CollectiveOptions o;
  o.timeout = absl::InfiniteDuration();  // only the failure can end the receive
  Work recv = engine->Recv(Buffer::F32(out.data(), out.size()), 1, 7, o);
  // The executor thread posts it (a queued operation nobody waits for is its after a poll).
  for (int i = 0; i < 5000 && t->posts.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(t->posts.load(), 1) << "the receive was never posted";
  t->fail_next_post = true;
  absl::Status sent = engine->Send(Buffer::F32(in.data(), in.size()), 1, 8, o).Wait();
  EXPECT_TRUE(absl::IsUnavailable(sent)) << sent;
  absl::Status received = recv.Wait();
  EXPECT_TRUE(absl::IsUnavailable(received)) << received;
  EXPECT_TRUE(absl::StrContains(received.message(), "rank 1 is gone")) << received;
  auto destroyed = std::make_shared<std::promise<void>>();
  std::future<void> done = destroyed->get_future();
  std::thread([e = engine.release(), destroyed] {
    delete e;
    destroyed->set_value();
  }).detach();
  if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "destroying the communicator did not return within 20 s";
    fflush(stdout);
    std::_Exit(1);  // the destructor's thread cannot be stopped; the test cannot go on
  }
}

TEST(Validation, NamesTheFieldAndExpectedVersusGot) {
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(2, 0, &comms);
  std::vector<float> a(10), b(5);
  absl::Status st = comms[0]->AllReduce(Buffer::F32(a), Buffer::F32(b), ReduceOp::kSum, {}).Wait();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_TRUE(absl::StrContains(st.message(), "expected 10, got 5")) << st;
  std::vector<float> c(3);
  st = comms[0]->ReduceScatter(Buffer::F32(a), Buffer::F32(c), ReduceOp::kSum, {}).Wait();
  EXPECT_TRUE(absl::StrContains(st.message(), "input.count")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "expected 6, got 10")) << st;
  st = comms[0]->Broadcast(Buffer::F32(a), 7, {}).Wait();
  EXPECT_TRUE(absl::StrContains(st.message(), "root expected in [0, 2), got 7")) << st;
  CollectiveOptions o;
  o.compression = Compression::kTopK;
  st = comms[0]->AllReduce(Buffer::F32(a), Buffer::F32(a), ReduceOp::kSum, o).Wait();
  EXPECT_TRUE(absl::StrContains(st.message(), "compression_state")) << st;
  // Validation errors do not break the communicator.
  ForEachRank(2, [&](int r) { EXPECT_TRUE(comms[r]->Barrier({}).Wait().ok()); });
}

// With error feedback nothing is lost: after T steps the sum of what was delivered plus the
// residuals equals the sum of all inputs (up to rounding), for top-k and int8.
TEST(Compression, ErrorFeedbackConservesTheSignal) {
  const int n = 3;
  const size_t count = 5000;
  for (Compression kind : {Compression::kTopK, Compression::kInt8}) {
    std::vector<std::unique_ptr<Communicator>> comms;
    auto group = InProcessGroup::Create(n, 0, &comms);
    std::vector<std::vector<double>> delivered(n, std::vector<double>(count, 0.0));
    std::vector<CompressionState> states(n);
    const int steps = 20;
    ForEachRank(n, [&](int r) {
      CollectiveOptions o;
      o.compression = kind;
      o.topk_fraction = 0.05;
      o.compression_state = &states[r];
      for (int s = 0; s < steps; ++s) {
        std::vector<float> g = Input(r, count, DType::kF32, 100 + s);
        std::vector<float> out(count);
        ASSERT_TRUE(
            comms[r]->AllReduce(Buffer::F32(g), Buffer::F32(out), ReduceOp::kSum, o).Wait().ok());
        for (size_t i = 0; i < count; ++i) delivered[r][i] += out[i];
      }
    });
    for (size_t i = 0; i < count; i += 37) {
      double want = 0.0, residual = 0.0;
      for (int r = 0; r < n; ++r) {
        for (int s = 0; s < steps; ++s) want += Input(r, count, DType::kF32, 100 + s)[i];
        residual += states[r].residual[i];
      }
      EXPECT_NEAR(delivered[0][i] + residual, want, 1e-3) << "element " << i;
      EXPECT_EQ(delivered[0][i], delivered[n - 1][i]);  // every rank decodes the same sum
    }
  }
}

}  // namespace
}  // namespace troupe::collectives
