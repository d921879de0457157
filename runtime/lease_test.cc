#include "internal/lease.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace troupe::runtime::internal {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kLength{500};
const LeaseTable::Clock::time_point t0{};

TEST(LeaseTable, TheHolderRenewsItsLeaseAndKeepsItsEpoch) {
  LeaseTable t;
  auto first = t.Acquire("coord", "w1#1", "w1", t0, kLength, 1000);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->epoch, 1000u);
  EXPECT_EQ(first->expiry, t0 + kLength);
  // Renewed before and after its expiry (nobody else asked): the same epoch, a later expiry.
  for (milliseconds at : {milliseconds(300), milliseconds(2000)}) {
    auto renewed = t.Acquire("coord", "w1#1", "w1", t0 + at, kLength, 5000);
    ASSERT_TRUE(renewed.ok()) << renewed.status();
    EXPECT_EQ(renewed->epoch, 1000u);
    EXPECT_EQ(renewed->expiry, t0 + at + kLength);
  }
}

TEST(LeaseTable, AnotherHolderWaitsForTheLeaseToRunOutThenGetsAHigherEpoch) {
  LeaseTable t;
  ASSERT_TRUE(t.Acquire("coord", "w1#1", "w1", t0, kLength, 1000).ok());
  auto early = t.Acquire("coord", "w2#2", "w2", t0 + milliseconds(200), kLength, 1000);
  ASSERT_EQ(early.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(early.status().message(),
            "the lease on 'coord' is held by w1#1 (epoch 1000) for another 300ms");
  auto later = t.Acquire("coord", "w2#2", "w2", t0 + kLength, kLength, 1000);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->epoch, 1001u);  // the wall clock had not moved on: one more than the last
  // The old holder, back after its lease ran out, is now the one that waits.
  auto old = t.Acquire("coord", "w1#1", "w1", t0 + kLength + milliseconds(1), kLength, 1000);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kUnavailable);
}

TEST(LeaseTable, EpochsFollowTheWallClockAndNeverGoBack) {
  LeaseTable t;
  ASSERT_EQ(t.Acquire("a", "x", "x", t0, kLength, 7'000'000)->epoch, 7'000'000u);
  // A wall clock stepped back cannot lower the epoch of a new holder.
  ASSERT_EQ(t.Acquire("b", "y", "y", t0, kLength, 5'000'000)->epoch, 7'000'001u);
  ASSERT_EQ(t.Acquire("a", "z", "z", t0 + kLength, kLength, 9'000'000)->epoch, 9'000'000u);
  // Names are leased independently: "b" is still y's.
  EXPECT_EQ(t.Acquire("b", "x", "x", t0 + milliseconds(100), kLength, 9'500'000).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(LeaseTable, AHolderWhoseProcessExitedReleasesItsLeaseAtOnce) {
  LeaseTable t;
  ASSERT_TRUE(t.Acquire("coord", "w1#1", "w1", t0, kLength, 1000).ok());
  ASSERT_TRUE(t.Acquire("other", "w2#1", "w2", t0, kLength, 1000).ok());
  t.ReleaseWorker("w1");
  auto next = t.Acquire("coord", "w3#2", "w3", t0 + milliseconds(1), kLength, 1000);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->epoch, 1002u);
  // w2's lease is untouched.
  EXPECT_EQ(t.Acquire("other", "w3#2", "w3", t0 + milliseconds(1), kLength, 1000).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace troupe::runtime::internal
