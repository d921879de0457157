// PlanCanonicalCombine (troupe/collectives/canonical_combine.h), the plan both the host ordered
// reduce-scatter and the NCCL communicator run: the exact steps for small groups, that running a
// plan reproduces the serial canonical tree bit for bit for every way of splitting M microbatches
// over W ranks, and the intervals it rejects.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "algorithms.h"
#include "test_util.h"

namespace troupe::collectives {
namespace {

using ::testing::HasSubstr;
using Kind = CombineOperand::Kind;
using testing::Intervals;
using testing::TrainerBlocks;

CombineOperand P(int rank) { return {Kind::kPartial, rank}; }
CombineOperand I(int temp) { return {Kind::kInner, temp}; }
CombineOperand Out() { return {Kind::kOutput, 0}; }
CombineOperand None() { return {}; }

std::string Name(const CombineOperand& o) {
  switch (o.kind) {
    case Kind::kPartial:
      return absl::StrCat("p", o.index);
    case Kind::kInner:
      return absl::StrCat("i", o.index);
    case Kind::kOutput:
      return "out";
    case Kind::kNone:
      break;
  }
  return "-";
}

// "i0=p1+p2 out=p0+i0": readable failure messages.
std::string Show(const std::vector<CombineStep>& steps) {
  std::string s;
  for (const CombineStep& st : steps) {
    absl::StrAppend(&s, s.empty() ? "" : " ", Name(st.dst), "=", Name(st.x));
    if (st.y.kind != Kind::kNone) absl::StrAppend(&s, "+", Name(st.y));
  }
  return s;
}

// Leaf k: a value whose magnitude depends on k, so that the order of the additions shows in the
// rounded result.
float Leaf(uint64_t k) {
  return std::ldexp(1.0f + static_cast<float>((k * 2654435761u) % 1000) / 1000.0f,
                    static_cast<int>((k * 7) % 41) - 20) *
         ((k % 3) == 0 ? -1.0f : 1.0f);
}

float Tree(uint64_t lo, uint64_t hi) {
  if (hi - lo == 1) return Leaf(lo);
  const uint64_t mid = CanonicalMid(lo, hi);
  return Tree(lo, mid) + Tree(mid, hi);
}

int CeilLog2(uint64_t m) {
  int bits = 0;
  while ((uint64_t{1} << bits) < m) ++bits;
  return bits;
}

// Runs `plan` on the partials Tree(lo, hi) of each rank's interval.
float Execute(const CombinePlan& plan, const Intervals& iv) {
  std::vector<float> partials, inner(plan.inner);
  for (const auto& [lo, hi] : iv) partials.push_back(Tree(lo, hi));
  float out = 0.0f, none = 0.0f;
  auto at = [&](const CombineOperand& o) -> float& {
    if (o.kind == Kind::kPartial) return partials[o.index];
    if (o.kind == Kind::kInner) return inner[o.index];
    if (o.kind == Kind::kOutput) return out;
    return none;
  };
  for (const CombineStep& s : plan.steps) {
    const float x = at(s.x);
    at(s.dst) = s.y.kind == Kind::kNone ? x : x + at(s.y);
  }
  return out;
}

TEST(PlanCanonicalCombine, StepsForSmallGroups) {
  struct Case {
    Intervals iv;
    std::vector<CombineStep> steps;
    uint64_t total;
    int inner;
  };
  const std::vector<Case> cases = {
      // W = 1: the output is the only partial.
      {{{0, 8}}, {{Out(), P(0), None()}}, 8, 0},
      {{{0, 1}}, {{Out(), P(0), None()}}, 1, 0},
      // W = 2.
      {{{0, 4}, {4, 8}}, {{Out(), P(0), P(1)}}, 8, 0},
      // The lower interval is always the left operand, whatever the ranks' order.
      {{{4, 8}, {0, 4}}, {{Out(), P(1), P(0)}}, 8, 0},
      // W = 3, both shapes.
      {{{0, 4}, {4, 6}, {6, 8}}, {{I(0), P(1), P(2)}, {Out(), P(0), I(0)}}, 8, 1},
      {{{0, 2}, {2, 4}, {4, 8}}, {{I(0), P(0), P(1)}, {Out(), I(0), P(2)}}, 8, 1},
      // A total that is not a power of two: T(0, 7) = T(0, 4) + (T(4, 6) + T(6, 7)).
      {{{0, 4}, {4, 6}, {6, 7}}, {{I(0), P(1), P(2)}, {Out(), P(0), I(0)}}, 7, 1},
      // W = 5.
      {{{0, 2}, {2, 4}, {4, 6}, {6, 7}, {7, 8}},
       {{I(0), P(0), P(1)}, {I(1), P(3), P(4)}, {I(2), P(2), I(1)}, {Out(), I(0), I(2)}},
       8,
       3},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CombinePlan> plan = PlanCanonicalCombine(c.iv);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(Show(plan->steps), Show(c.steps));
    EXPECT_EQ(plan->steps, c.steps);
    EXPECT_EQ(plan->total, c.total);
    EXPECT_EQ(plan->inner, c.inner);
  }
}

// Every W from 1 to M, M a power of two or not: W - 1 additions (one copy for W = 1), at most
// W - 2 temporaries, every partial read once, and the plan's result is the serial tree's bits.
TEST(PlanCanonicalCombine, ReproducesTheSerialTreeForEverySplit) {
  int order_mattered = 0;
  for (uint64_t m : {1u, 2u, 5u, 8u, 13u, 64u, 100u}) {
    const float want = Tree(0, m);
    float naive = 0.0f;
    for (uint64_t k = 0; k < m; ++k) naive += Leaf(k);
    order_mattered += naive != want;
    for (int w = 1; w <= static_cast<int>(m); ++w) {
      const Intervals iv = TrainerBlocks(m, w);
      absl::StatusOr<CombinePlan> plan = PlanCanonicalCombine(iv);
      ASSERT_TRUE(plan.ok()) << "m=" << m << " w=" << w << ": " << plan.status();
      EXPECT_EQ(plan->total, m);
      EXPECT_EQ(plan->steps.size(), static_cast<size_t>(w == 1 ? 1 : w - 1));
      EXPECT_LE(plan->inner, std::max(0, w - 2));
      EXPECT_LE(plan->inner, CeilLog2(m)) << "m=" << m << " w=" << w;
      EXPECT_EQ(plan->steps.back().dst, Out());
      std::vector<int> reads(w, 0);
      for (const CombineStep& s : plan->steps) {
        for (const CombineOperand& o : {s.x, s.y}) {
          if (o.kind == Kind::kPartial) ++reads[o.index];
        }
      }
      EXPECT_EQ(reads, std::vector<int>(w, 1)) << "m=" << m << " w=" << w;
      // A step may write the temporary it reads as x, never the one it reads as y (CombinePieces
      // copies x into dst before it adds y), and reads no temporary another step overwrote since.
      std::vector<bool> unread(plan->inner, false);  // written, not yet read
      for (size_t i = 0; i < plan->steps.size(); ++i) {
        const CombineStep& s = plan->steps[i];
        EXPECT_FALSE(s.dst == s.y) << "m=" << m << " w=" << w << " step " << i;
        for (const CombineOperand& o : {s.x, s.y}) {
          if (o.kind != Kind::kInner) continue;
          EXPECT_TRUE(unread[o.index]) << "m=" << m << " w=" << w << " step " << i;
          unread[o.index] = false;
        }
        if (s.dst.kind != Kind::kInner) continue;
        EXPECT_FALSE(unread[s.dst.index]) << "m=" << m << " w=" << w << " step " << i;
        unread[s.dst.index] = true;
      }
      const float got = Execute(*plan, iv);
      EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0)
          << "m=" << m << " w=" << w << ": " << got << " vs " << want;
    }
  }
  EXPECT_GT(order_mattered, 0);  // the leaves make the order visible
}

// At scale: 8,192 ranks of one microbatch each reuse a temporary per level of the tree (13), not
// one per inner node (8,190 blocks: as much scratch as the model), with the serial tree's bits.
TEST(PlanCanonicalCombine, EightThousandRanksNeedOnlyATemporaryPerLevel) {
  const uint64_t m = 8192;
  const Intervals iv = TrainerBlocks(m, static_cast<int>(m));
  absl::StatusOr<CombinePlan> plan = PlanCanonicalCombine(iv);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->steps.size(), m - 1);
  EXPECT_EQ(plan->inner, 13);  // log2(8192)
  const float got = Execute(*plan, iv), want = Tree(0, m);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << got << " vs " << want;
}

TEST(PlanCanonicalCombine, RejectsWhatIsNotADisjointCoverBySubtrees) {
  struct Case {
    const char* what;
    Intervals iv;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no ranks", {}, "no contributions"},
      {"nothing to contribute", {{0, 0}}, "no contributions"},
      {"not a subtree",
       {{0, 3}, {3, 4}},
       "no rank holds contribution [0, 1); intervals must be disjoint power-of-two-aligned "
       "subtrees covering [0, 4)"},
      {"a gap", {{0, 2}, {3, 4}}, "no rank holds contribution [2, 3)"},
      {"misaligned", {{0, 2}, {2, 5}, {5, 8}}, "no rank holds contribution [2, 3)"},
      {"overlapping", {{0, 4}, {2, 4}, {4, 8}}, "rank 1's contribution [2, 4) is not used"},
      {"twice", {{0, 4}, {4, 8}, {0, 4}}, "rank 2's contribution [0, 4) is not used"},
      {"reversed", {{0, 4}, {6, 4}}, "rank 1's contribution [6, 4) is not used"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CombinePlan> plan = PlanCanonicalCombine(c.iv);
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << c.what << ": " << plan.status();
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(c.message)) << c.what;
  }
}

}  // namespace
}  // namespace troupe::collectives
