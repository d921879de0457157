// The in-process backend across the matrix: every operation x algorithm x sizes (1 element to
// 64 MiB, odd sizes) x 1..8 ranks x {f32, bf16} x {in place, out of place}, checked against a
// plain reference. Tolerances (test_util.h): f32 within 4·eps·n·Σ|x| of the rank-order sum;
// bf16 additionally within 2^-8·|ref| (one bf16 rounding); max exact; ordered f32 bit-exact.
#include "troupe/collectives/inprocess.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "algorithms.h"
#include "test_util.h"

namespace troupe::collectives {
namespace {

using testing::ForEachRank;
using testing::HostBuf;
using testing::Input;
using testing::Tolerance;

const size_t kSizes[] = {1, 2, 7, 127, 4099, 65537, 262147};
const Algorithm kReduceAlgs[] = {Algorithm::kAuto, Algorithm::kRing, Algorithm::kRecursiveDoubling,
                                 Algorithm::kOrdered, Algorithm::kSingleCopy};

const char* AlgName(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kRecursiveDoubling:
      return "recursive-doubling";
    case Algorithm::kOrdered:
      return "ordered";
    case Algorithm::kSingleCopy:
      return "single-copy";
  }
  return "?";
}

// Canonical-tree reference over per-rank vectors [lo, hi).
std::vector<float> TreeSum(const std::vector<std::vector<float>>& in, size_t lo, size_t hi,
                           ReduceOp op) {
  if (hi - lo == 1) return in[lo];
  const size_t mid = CanonicalMid(lo, hi);
  auto a = TreeSum(in, lo, mid, op), b = TreeSum(in, mid, hi, op);
  Combine(a.data(), a.data(), b.data(), a.size(), op);
  return a;
}

struct Reference {
  std::vector<float> value, sum_abs;
};

Reference Reduce(const std::vector<std::vector<float>>& in, ReduceOp op) {
  const size_t count = in[0].size();
  Reference ref{in[0], std::vector<float>(count, 0.0f)};
  for (size_t i = 0; i < count; ++i) ref.sum_abs[i] = std::fabs(in[0][i]);
  for (size_t r = 1; r < in.size(); ++r) {
    for (size_t i = 0; i < count; ++i) {
      ref.value[i] =
          op == ReduceOp::kMax ? std::max(ref.value[i], in[r][i]) : ref.value[i] + in[r][i];
      ref.sum_abs[i] += std::fabs(in[r][i]);
    }
  }
  if (op == ReduceOp::kAvg) {
    for (auto& v : ref.value) v /= static_cast<float>(in.size());
  }
  return ref;
}

// Runs one all-reduce (or reduce-scatter) case and checks every rank's output.
void CheckReduction(bool scatter, int n, size_t count, DType dt, ReduceOp op, Algorithm alg,
                    bool inplace) {
  SCOPED_TRACE(absl::StrCat(scatter ? "ReduceScatter" : "AllReduce", " n=", n, " count=", count,
                            " dtype=", dt == DType::kF32 ? "f32" : "bf16",
                            " op=", static_cast<int>(op), " alg=", AlgName(alg),
                            inplace ? " in-place" : " out-of-place"));
  const size_t total = scatter ? count * n : count;
  std::vector<std::vector<float>> in(n);
  for (int r = 0; r < n; ++r) in[r] = Input(r, total, dt, 1234);
  Reference ref = Reduce(in, op);
  std::vector<float> tree;
  if (alg == Algorithm::kOrdered) {
    tree = TreeSum(in, 0, n, op);
    if (op == ReduceOp::kAvg) {
      for (auto& v : tree) v /= static_cast<float>(n);
    }
  }
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(n, 0, &comms);
  std::vector<std::vector<float>> got(n);
  ForEachRank(n, [&](int r) {
    HostBuf input(dt, in[r]);
    HostBuf output(dt, scatter ? count : total);
    CollectiveOptions o;
    o.algorithm = alg;
    o.timeout = absl::Seconds(60);
    Buffer ib = input.buf(),
           ob = inplace ? (scatter ? input.sub(r * count, count) : ib) : output.buf();
    absl::Status st = scatter ? comms[r]->ReduceScatter(ib, ob, op, o).Wait()
                              : comms[r]->AllReduce(ib, ob, op, o).Wait();
    ASSERT_TRUE(st.ok()) << st;
    auto all = inplace ? input.values() : output.values();
    if (inplace && scatter) {
      got[r].assign(all.begin() + r * count, all.begin() + (r + 1) * count);
    } else {
      got[r] = all;
    }
  });
  for (int r = 0; r < n; ++r) {
    const size_t base = scatter ? r * count : 0;
    ASSERT_EQ(got[r].size(), count);
    for (size_t i = 0; i < count; ++i) {
      const size_t j = base + i;
      if (alg == Algorithm::kOrdered && dt == DType::kF32) {
        ASSERT_EQ(std::memcmp(&got[r][i], &tree[j], 4), 0)
            << "rank " << r << " element " << i << " got " << got[r][i] << " tree " << tree[j];
        continue;
      }
      const float tol =
          op == ReduceOp::kMax ? 0.0f : Tolerance(dt, ref.value[j], ref.sum_abs[j], n);
      ASSERT_NEAR(got[r][i], ref.value[j], tol) << "rank " << r << " element " << i;
    }
    if (!scatter && r > 0) {  // every algorithm gives all ranks the bit-identical result
      ASSERT_EQ(std::memcmp(got[r].data(), got[0].data(), count * 4), 0) << "rank " << r;
    }
  }
}

class Matrix : public ::testing::TestWithParam<int> {};

TEST_P(Matrix, AllReduce) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    for (Algorithm alg : kReduceAlgs) {
      for (size_t count : kSizes) {
        for (DType dt : {DType::kF32, DType::kBF16}) {
          CheckReduction(false, GetParam(), count, dt, op, alg, count % 2 == 1);
          if (count < 8) CheckReduction(false, GetParam(), count, dt, op, alg, count % 2 == 0);
        }
      }
    }
  }
}

TEST_P(Matrix, ReduceScatter) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    for (Algorithm alg : kReduceAlgs) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{4099}, size_t{32771}}) {
        for (DType dt : {DType::kF32, DType::kBF16}) {
          CheckReduction(true, GetParam(), count, dt, op, alg, count % 2 == 1);
          if (count < 8) CheckReduction(true, GetParam(), count, dt, op, alg, count % 2 == 0);
        }
      }
    }
  }
}

TEST_P(Matrix, AllGather) {
  const int n = GetParam();
  for (size_t count : kSizes) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (bool inplace : {false, true}) {
        std::vector<std::unique_ptr<Communicator>> comms;
        auto group = InProcessGroup::Create(n, 0, &comms);
        ForEachRank(n, [&](int r) {
          auto mine = Input(r, count, dt, 7);
          HostBuf out(dt, count * n), in(dt, mine);
          if (inplace) out = HostBuf(dt, std::vector<float>(count * n, 0.0f));
          if (inplace) {
            HostBuf tmp(dt, mine);
            std::vector<float> all(count * n, 0.0f);
            std::copy(mine.begin(), mine.end(), all.begin() + r * count);
            out = HostBuf(dt, all);
          }
          Buffer ib = inplace ? out.sub(r * count, count) : in.buf();
          ASSERT_TRUE(comms[r]->AllGather(ib, out.buf(), {}).Wait().ok());
          auto v = out.values();
          for (int q = 0; q < n; ++q) {
            auto exp = Input(q, count, dt, 7);
            ASSERT_TRUE(std::equal(exp.begin(), exp.end(), v.begin() + q * count))
                << "n=" << n << " count=" << count << " block " << q << " on rank " << r;
          }
        });
      }
    }
  }
}

TEST_P(Matrix, BroadcastFromEveryRoot) {
  const int n = GetParam();
  for (size_t count : kSizes) {
    for (int root = 0; root < n; ++root) {
      std::vector<std::unique_ptr<Communicator>> comms;
      auto group = InProcessGroup::Create(n, 0, &comms);
      ForEachRank(n, [&](int r) {
        HostBuf b(DType::kF32,
                  r == root ? Input(root, count, DType::kF32, 3) : std::vector<float>(count, 0.0f));
        ASSERT_TRUE(comms[r]->Broadcast(b.buf(), root, {}).Wait().ok());
        ASSERT_EQ(b.f, Input(root, count, DType::kF32, 3))
            << "n=" << n << " count=" << count << " root " << root << " rank " << r;
      });
    }
  }
}

TEST_P(Matrix, BarrierAndSendRecvRing) {
  const int n = GetParam();
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(n, 0, &comms);
  ForEachRank(n, [&](int r) {
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(comms[r]->Barrier({}).Wait().ok());
    if (n == 1) return;
    auto mine = Input(r, 1001, DType::kF32, 9);
    std::vector<float> got(1001);
    Work s = comms[r]->Send(Buffer::F32(mine), (r + 1) % n, 5, {});
    Work v = comms[r]->Recv(Buffer::F32(got), (r + n - 1) % n, 5, {});
    ASSERT_TRUE(s.Wait().ok());
    ASSERT_TRUE(v.Wait().ok());
    ASSERT_EQ(got, Input((r + n - 1) % n, 1001, DType::kF32, 9));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Matrix, ::testing::Range(1, 9),
                         [](const auto& info) { return absl::StrCat("n", info.param); });

// The matrix stays at or below the direct all-gather's limit; beyond it the ring gathers.
TEST(AllGatherBeyondTheDirectLimit, RingGathersEveryBlock) {
  for (int n : {kDirectAllGatherRanks + 1, 13}) {
    std::vector<std::unique_ptr<Communicator>> comms;
    auto group = InProcessGroup::Create(n, 0, &comms);
    ForEachRank(n, [&](int r) {
      HostBuf in(DType::kF32, Input(r, 1000, DType::kF32, 7)), out(DType::kF32, 1000 * n);
      ASSERT_TRUE(comms[r]->AllGather(in.buf(), out.buf(), {}).Wait().ok());
      auto v = out.values();
      for (int q = 0; q < n; ++q) {
        auto exp = Input(q, 1000, DType::kF32, 7);
        ASSERT_TRUE(std::equal(exp.begin(), exp.end(), v.begin() + q * 1000))
            << "n=" << n << " block " << q << " on rank " << r;
      }
    });
  }
}

// 64 MiB buffers on the ring path, out of place, f32 sum.
TEST(Large, AllReduce64MiB) {
  for (int n : {2, 8}) {
    CheckReduction(false, n, 16 << 20, DType::kF32, ReduceOp::kSum, Algorithm::kRing, false);
    CheckReduction(false, n, 16 << 20, DType::kF32, ReduceOp::kSum, Algorithm::kSingleCopy, false);
  }
}

TEST(Large, ReduceScatterAndAllGather64MiB) {
  CheckReduction(true, 4, 4 << 20, DType::kF32, ReduceOp::kSum, Algorithm::kRing, false);
  CheckReduction(true, 4, 4 << 20, DType::kBF16, ReduceOp::kSum, Algorithm::kOrdered, true);
}

}  // namespace
}  // namespace troupe::collectives
