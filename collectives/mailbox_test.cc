// The shared-memory mailboxes' protocol (mailbox.h): two ranks' Mailboxes in one process, each
// attached to the other's inbox exactly as between processes. Across processes they run under
// every multi-process test of collectives_ucx_test and collectives_chaos_test.
#include "mailbox.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/ipc.h>
#include <sys/shm.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace troupe::collectives {
namespace {

struct Pair {
  std::unique_ptr<Mailboxes> a, b;  // ranks 0 and 2 of a host with ranks {0, 2}
  Pair() {
    auto x = Mailboxes::Create(0, {0, 2});
    auto y = Mailboxes::Create(2, {0, 2});
    EXPECT_TRUE(x.ok() && y.ok());
    a = std::move(*x);
    b = std::move(*y);
    EXPECT_TRUE(a->Attach(2, b->inbox_id()).ok());
    EXPECT_TRUE(b->Attach(0, a->inbox_id()).ok());
  }
};

uint64_t Recv(Mailboxes& m, int peer, uint64_t tag) {
  uint64_t v = 0;
  absl::StatusOr<bool> got = m.TryRecv(peer, tag, &v, sizeof(v));
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() && *got ? v : ~uint64_t{0};
}

TEST(Mailboxes, MessagesArriveInOrderPerTagAndMayBeReceivedOutOfOrderAcrossTags) {
  Pair p;
  for (uint64_t v : {uint64_t{10}, uint64_t{20}, uint64_t{11}}) {
    ASSERT_TRUE(p.a->TrySend(2, /*tag=*/v / 10, &v, sizeof(v)));
  }
  uint64_t none = 0;
  EXPECT_FALSE(*p.b->TryRecv(2, 1, &none, sizeof(none))) << "nothing came from rank 2 itself";
  EXPECT_EQ(Recv(*p.b, 0, 2), 20u) << "a later tag first";
  EXPECT_EQ(Recv(*p.b, 0, 1), 10u) << "then the oldest message of tag 1";
  EXPECT_EQ(Recv(*p.b, 0, 1), 11u);
  EXPECT_FALSE(*p.b->TryRecv(0, 1, &none, sizeof(none))) << "nothing left";
  // And the other way, through the other inbox.
  uint64_t v = 7;
  ASSERT_TRUE(p.b->TrySend(0, 5, &v, sizeof(v)));
  EXPECT_EQ(Recv(*p.a, 2, 5), 7u);
}

// Runs the calling thread on `cpu` alone; false where it may not.
bool RunOn(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof(one), &one) == 0;
}

TEST(Mailboxes, EachRankSeesWhetherAPeerLastWaitedOnItsVcpu) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &all)) cpus.push_back(c);
  }
  ASSERT_FALSE(cpus.empty());
  struct Restore {  // the process's other tests and the ranks they start get every vCPU back
    cpu_set_t all;
    ~Restore() { sched_setaffinity(0, sizeof(all), &all); }
  } restore{all};
  Pair p;
  ASSERT_TRUE(RunOn(cpus[0]));
  EXPECT_FALSE(p.a->PeerSharesMyCpu()) << "rank 2 has published no vCPU yet";
  EXPECT_TRUE(p.b->PeerSharesMyCpu()) << "rank 0 published this one";
  EXPECT_TRUE(p.a->PeerSharesMyCpu());
  if (cpus.size() > 1) {  // CI's machines have 2 vCPUs
    ASSERT_TRUE(RunOn(cpus[1]));
    EXPECT_FALSE(p.b->PeerSharesMyCpu()) << "rank 0 last published vCPU " << cpus[0];
    EXPECT_TRUE(p.a->PeerSharesMyCpu()) << "rank 2 just published vCPU " << cpus[1];
    ASSERT_TRUE(RunOn(cpus[0]));
    EXPECT_FALSE(p.a->PeerSharesMyCpu()) << "rank 2 is still on vCPU " << cpus[1];
  }
}

TEST(Mailboxes, AFullChannelRefusesUntilTheReceiverCopiesOut) {
  Pair p;
  for (uint64_t i = 0; i < Mailboxes::kSlots; ++i) ASSERT_TRUE(p.a->TrySend(2, 100 + i, &i, 8));
  uint64_t more = 99;
  EXPECT_FALSE(p.a->TrySend(2, 1, &more, 8)) << "every slot holds a message not yet received";
  // Receiving a later message frees its slot, but the sender fills slots in order: the oldest
  // slot is the next one it needs.
  EXPECT_EQ(Recv(*p.b, 0, 105), 5u);
  EXPECT_FALSE(p.a->TrySend(2, 1, &more, 8));
  EXPECT_EQ(Recv(*p.b, 0, 100), 0u);
  EXPECT_TRUE(p.a->TrySend(2, 1, &more, 8));
  for (uint64_t i = 1; i < Mailboxes::kSlots; ++i) {
    if (i != 5) {
      EXPECT_EQ(Recv(*p.b, 0, 100 + i), i);
    }
  }
  EXPECT_EQ(Recv(*p.b, 0, 1), 99u);
}

TEST(Mailboxes, CarriesAFullSlotAndWrapsAroundManyTimes) {
  Pair p;
  std::vector<uint8_t> out(Mailboxes::kPayloadBytes), in(Mailboxes::kPayloadBytes);
  for (int round = 0; round < 5 * Mailboxes::kSlots; ++round) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + round);
    ASSERT_TRUE(p.a->TrySend(2, 3, out.data(), out.size()));
    absl::StatusOr<bool> got = p.b->TryRecv(0, 3, in.data(), in.size());
    ASSERT_TRUE(got.ok() && *got) << round;
    ASSERT_EQ(in, out) << round;
  }
}

TEST(Mailboxes, AMessageOfAnotherSizeIsAnErrorNamingBoth) {
  Pair p;
  uint32_t four = 4;
  ASSERT_TRUE(p.a->TrySend(2, 9, &four, sizeof(four)));
  uint64_t eight = 0;
  absl::StatusOr<bool> got = p.b->TryRecv(0, 9, &eight, sizeof(eight));
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::StrContains(got.status().message(), "expected a 8-byte message from rank 0"))
      << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "got 4 bytes")) << got.status();
}

TEST(Mailboxes, InboxesAreRemovedAtOnceSoNoProcessDeathLeavesOneBehind) {
  Pair p;
  for (int id : {p.a->inbox_id(), p.b->inbox_id()}) {
    shmid_ds ds{};
    ASSERT_EQ(shmctl(id, IPC_STAT, &ds), 0);
    EXPECT_TRUE(ds.shm_perm.mode & SHM_DEST) << "segment " << id << " not marked for removal";
    EXPECT_EQ(ds.shm_nattch, 2u) << "its owner and its peer";
    EXPECT_EQ(ds.shm_perm.mode & 0777, 0600u) << "this user's only";
  }
  const int id = p.a->inbox_id();
  p.a.reset();
  p.b.reset();
  shmid_ds ds{};
  EXPECT_EQ(shmctl(id, IPC_STAT, &ds), -1) << "gone with the last process to detach";
}

TEST(Mailboxes, AttachingAnythingButAnotherRankOfThisHostIsRefused) {
  auto m = Mailboxes::Create(1, {0, 1});
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE((*m)->Attach(1, (*m)->inbox_id()).ok()) << "itself";
  EXPECT_FALSE((*m)->Attach(3, (*m)->inbox_id()).ok()) << "not on this host";
  EXPECT_EQ((*m)->Attach(0, -1).code(), absl::StatusCode::kUnavailable) << "no such segment";
  EXPECT_FALSE(Mailboxes::Create(5, {0, 1}).ok()) << "a rank missing from its own host's ranks";
}

}  // namespace
}  // namespace troupe::collectives
