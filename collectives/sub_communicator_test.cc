// SubCommunicator: two groups of an in-process world of five run every operation at once, each
// over its own members only; results are checked against sums written out here.
#include "troupe/collectives/sub_communicator.h"

#include <gtest/gtest.h>

#include <vector>

#include "test_util.h"
#include "troupe/collectives/inprocess.h"

namespace troupe::collectives {
namespace {

using testing::ForEachRank;

const std::vector<std::vector<int>> kGroups = {{0, 2, 3}, {1, 4}};

const std::vector<int>& GroupOf(int world_rank) {
  return kGroups[world_rank == 1 || world_rank == 4 ? 1 : 0];
}

// What member `m` of a group contributes: 7 floats, distinct per world rank.
std::vector<float> Input(int world_rank) {
  std::vector<float> v(7);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * world_rank + 0.125f * i + 1;
  return v;
}

TEST(SubCommunicatorTest, TwoGroupsOfOneWorldRunEveryOperationOverTheirOwnMembers) {
  std::vector<std::unique_ptr<Communicator>> world;
  auto keep = InProcessGroup::Create(5, 3, &world);
  CollectiveOptions o;
  o.timeout = absl::Seconds(20);
  ForEachRank(5, [&](int w) {
    const std::vector<int>& members = GroupOf(w);
    auto sub = SubCommunicator::Create(world[w].get(), members);
    ASSERT_TRUE(sub.ok()) << sub.status();
    SubCommunicator& g = **sub;
    const int n = g.size();
    EXPECT_EQ(g.generation(), 3u);
    EXPECT_EQ(members[g.rank()], w);
    std::vector<float> in = Input(w);
    // AllGather: rank order.
    std::vector<float> all(7 * n);
    ASSERT_TRUE(g.AllGather(Buffer::F32(in), Buffer::F32(all), o).Wait().ok());
    for (int j = 0; j < n; ++j) {
      EXPECT_EQ(std::vector<float>(all.begin() + 7 * j, all.begin() + 7 * (j + 1)),
                Input(members[j]));
    }
    // AllReduce: sum in rank order, avg, max.
    std::vector<float> want(7, 0.0f), out(7);
    for (int m : members) {
      for (size_t i = 0; i < 7; ++i) want[i] += Input(m)[i];
    }
    ASSERT_TRUE(g.AllReduce(Buffer::F32(in), Buffer::F32(out), ReduceOp::kSum, o).Wait().ok());
    EXPECT_EQ(out, want);
    ASSERT_TRUE(g.AllReduce(Buffer::F32(in), Buffer::F32(out), ReduceOp::kMax, o).Wait().ok());
    EXPECT_EQ(out, Input(members.back()));
    // ReduceScatter: my block of the sum of every member's n blocks.
    std::vector<float> blocks(7 * n), mine(7);
    for (int j = 0; j < n; ++j) std::copy(in.begin(), in.end(), blocks.begin() + 7 * j);
    ASSERT_TRUE(
        g.ReduceScatter(Buffer::F32(blocks), Buffer::F32(mine), ReduceOp::kSum, o).Wait().ok());
    EXPECT_EQ(mine, want);
    // Broadcast from the last member; a barrier; point to point around the group's ring.
    std::vector<float> b = in;
    ASSERT_TRUE(g.Broadcast(Buffer::F32(b), n - 1, o).Wait().ok());
    EXPECT_EQ(b, Input(members.back()));
    ASSERT_TRUE(g.Barrier(o).Wait().ok());
    std::vector<float> from_prev(7);
    std::vector<Work> p2p = g.PostPointToPoint(
        {{Communicator::PointToPoint::Kind::kSend, Buffer::F32(in), (g.rank() + 1) % n, 9},
         {Communicator::PointToPoint::Kind::kRecv, Buffer::F32(from_prev), (g.rank() + n - 1) % n,
          9}},
        o);
    for (const Work& x : p2p) ASSERT_TRUE(x.Wait().ok());
    EXPECT_EQ(from_prev, Input(members[(g.rank() + n - 1) % n]));
  });
}

TEST(SubCommunicatorTest, BadMembersAreRefusedAndAnAbortEndsTheParent) {
  std::vector<std::unique_ptr<Communicator>> world;
  auto keep = InProcessGroup::Create(3, 1, &world);
  for (const std::vector<int>& bad :
       std::vector<std::vector<int>>{{1, 2}, {0, 0, 1}, {2, 0}, {0, 3}, {}}) {
    auto s = SubCommunicator::Create(world[0].get(), bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  }
  auto sub = SubCommunicator::Create(world[0].get(), {0, 2});
  ASSERT_TRUE(sub.ok());
  (*sub)->Abort(absl::AbortedError("generation 1 superseded"));
  float x = 1;
  EXPECT_EQ(world[0]->Send(Buffer::F32(&x, 1), 1, 0, {}).Wait().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE((*sub)->Send(Buffer::F32(&x, 1), 7, 0, {}).Wait().ok()) << "no such peer";
}

}  // namespace
}  // namespace troupe::collectives
