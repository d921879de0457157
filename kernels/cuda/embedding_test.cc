#include "embedding.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "kernel_cases.h"
#include "test_util.h"
#include "troupe/kernels/embedding.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomTokens;
using kernels::testing::RandomVector;
using testing::ExpectClose;
using testing::ExpectWithinOneBf16Ulp;
// kernel_cases.h
using testing::EmbeddingBf16Case;
using testing::EmbeddingFp32Case;
using testing::EmbeddingShape;
using testing::ExpectEmbeddingFp32Matches;
using testing::ExpectWithinRoundingBound;
using testing::kEmbeddingShapes;
using testing::MakeEmbeddingBf16Case;
using testing::MakeEmbeddingFp32Case;
using testing::SameBits;

class EmbeddingCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(EmbeddingCudaTest);

TEST_P(EmbeddingCudaTest, Fp32IsBitIdenticalToTheFloatCpuKernel) {
  for (const EmbeddingShape& s : kEmbeddingShapes) {
    const int64_t bt = s.b * s.t;
    const EmbeddingFp32Case k = MakeEmbeddingFp32Case(s);
    for (int block : {32, 96, 256}) {
      SCOPED_TRACE(::testing::Message()
                   << "b=" << s.b << " t=" << s.t << " c=" << s.c << " block=" << block);
      std::vector<float> out(bt * s.c), dwte = k.dwte0, dwpe = k.dwpe0;
      ASSERT_TRUE(embedding_forward(out.data(), k.tokens.data(), k.wte.data(), k.wpe.data(), s.b,
                                    s.t, s.c, nullptr, block)
                      .ok());
      ASSERT_TRUE(embedding_backward(dwte.data(), dwpe.data(), k.dout.data(), k.tokens.data(), s.b,
                                     s.t, s.c, nullptr, block)
                      .ok());
      ExpectEmbeddingFp32Matches(k, out, dwte, dwpe);
    }
  }
}

// bf16: the forward is one rounding of a float sum of two bf16 values. The backward rounds to bf16
// after every addition, in (b, t) order: it must equal that sequence replayed on the host, bit for
// bit, and lie within the bound of that many roundings of the double reference:
// |got − exact| ≤ 2^-8 · Σ |partial sums| (bf16 keeps 8 significant bits; the float addition
// before each rounding is exact or off by 2^-24, which the margin covers).
TEST_P(EmbeddingCudaTest, Bf16MatchesTheRoundedReference) {
  for (const EmbeddingShape& s : kEmbeddingShapes) {
    const int64_t bt = s.b * s.t, c = s.c;
    const EmbeddingBf16Case k = MakeEmbeddingBf16Case(s);

    for (int block : {32, 96}) {
      SCOPED_TRACE(::testing::Message()
                   << "b=" << s.b << " t=" << s.t << " c=" << c << " block=" << block);
      std::vector<__nv_bfloat16> out(bt * c), dwte = k.dwte0, dwpe = k.dwpe0;
      ASSERT_TRUE(embedding_forward(out.data(), k.tokens.data(), k.wte.data(), k.wpe.data(), s.b,
                                    s.t, c, nullptr, block)
                      .ok());
      ASSERT_TRUE(embedding_backward(dwte.data(), dwpe.data(), k.dout.data(), k.tokens.data(), s.b,
                                     s.t, c, nullptr, block)
                      .ok());
      ExpectWithinOneBf16Ulp(out, k.out_ref, "out");
      EXPECT_TRUE(SameBits(dwte, k.replay.dwte)) << "dwte";
      EXPECT_TRUE(SameBits(dwpe, k.replay.dwpe)) << "dwpe";
      ExpectWithinRoundingBound(dwte, k.dwte_ref, k.replay.dwte_mass, "dwte");
      ExpectWithinRoundingBound(dwpe, k.dwpe_ref, k.replay.dwpe_mass, "dwpe");
    }
  }
}

TEST_P(EmbeddingCudaTest, EmptyShapesLaunchNothingAndBadBlocksAreRejected) {
  std::vector<float> buf(8, 1.0f);
  const std::vector<int32_t> tokens = {0, 1};
  EXPECT_TRUE(
      embedding_forward(buf.data(), tokens.data(), buf.data(), buf.data(), 0, 2, 4, nullptr).ok());
  EXPECT_TRUE(
      embedding_backward(buf.data(), buf.data(), buf.data(), tokens.data(), 1, 2, 0, nullptr).ok());
  EXPECT_EQ(
      embedding_forward(buf.data(), tokens.data(), buf.data(), buf.data(), 1, 2, 4, nullptr, 0)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      embedding_backward(buf.data(), buf.data(), buf.data(), tokens.data(), 1, 2, 4, nullptr, 2048)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// The bits of out, dwte and dwpe under every schedule.
template <typename Tx>
std::vector<unsigned char> RunAll() {
  const int64_t b = 3, t = 7, c = 65;
  const int32_t vocab = 5;
  const auto tokens = RandomTokens(b * t, vocab, 21);
  const auto wte = testing::ToBf16(RandomVector(vocab * c, 22));
  const auto wpe = testing::ToBf16(RandomVector(t * c, 23));
  const auto dout = testing::ToBf16(RandomVector(b * t * c, 24));
  auto convert = [](const std::vector<__nv_bfloat16>& v) {
    std::vector<Tx> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if constexpr (std::is_same_v<Tx, float>) {
        out[i] = __bfloat162float(v[i]);
      } else {
        out[i] = v[i];
      }
    }
    return out;
  };
  const auto wte_x = convert(wte), wpe_x = convert(wpe), dout_x = convert(dout);
  std::vector<Tx> out(b * t * c), dwte = wte_x, dwpe = wpe_x;
  EXPECT_TRUE(
      embedding_forward(out.data(), tokens.data(), wte_x.data(), wpe_x.data(), b, t, c, nullptr, 32)
          .ok());
  EXPECT_TRUE(embedding_backward(dwte.data(), dwpe.data(), dout_x.data(), tokens.data(), b, t, c,
                                 nullptr, 32)
                  .ok());
  std::vector<unsigned char> bytes;
  for (const auto* v : {&out, &dwte, &dwpe}) {
    const auto* p = reinterpret_cast<const unsigned char*>(v->data());
    bytes.insert(bytes.end(), p, p + v->size() * sizeof(Tx));
  }
  return bytes;
}

TEST(EmbeddingCudaDeterminismTest, BitIdenticalAcrossSchedules) {
  std::vector<unsigned char> first_f, first_b;
  for (simt::Schedule schedule : testing::kSchedules) {
    simt::ScopedSchedule scoped(schedule, /*seed=*/5);
    const auto f = RunAll<float>();
    const auto b = RunAll<__nv_bfloat16>();
    if (first_f.empty()) {
      first_f = f, first_b = b;
      continue;
    }
    EXPECT_EQ(f, first_f) << "fp32, " << simt::ScheduleName(schedule);
    EXPECT_EQ(b, first_b) << "bf16, " << simt::ScheduleName(schedule);
  }
}

}  // namespace
}  // namespace troupe::kernels::cuda
