#include "norm.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_test_util.h"
#include "kernel_cases.h"
#include "test_util.h"
#include "troupe/kernels/norm.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomVector;
using testing::Bits;
using testing::ExpectChunkSumsMatch;
using testing::SpreadFloats;

class NormCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(NormCudaTest);

int64_t NumChunks(int64_t n) { return (n + kNormChunk - 1) / kNormChunk; }

const int64_t kSizes[] = {1, 4095, 4096, 4097, 3 * 4096 + 5, 37 * 4096 + 100};

// Every chunk sum has the CPU's bits (so the same in every schedule), nothing is written past the
// last chunk, and the norm from TreeSum agrees bit for bit.
TEST_P(NormCudaTest, ChunkSumsMatchTheCpuBitForBit) {
  for (int64_t n : kSizes) {
    for (int block : {32, 96, 256}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " block=" << block);
      const auto x = SpreadFloats(n, n + 1);
      const int64_t chunks = NumChunks(n);
      std::vector<double> want(chunks);
      ChunkSquareSums(x.data(), n, want.data());
      std::vector<double> got(chunks + 1, std::numeric_limits<double>::quiet_NaN());
      ASSERT_TRUE(chunk_square_sums(got.data(), x.data(), n, nullptr, block).ok());
      ExpectChunkSumsMatch(got, want);
    }
  }
}

// The bit comparison has teeth: on these data, one running sum per chunk (another order of the
// same additions) differs from the CPU's lane order in some chunk.
TEST_P(NormCudaTest, TheTestDataAreSensitiveToTheOrder) {
  const int64_t n = 37 * 4096 + 100;
  const auto x = SpreadFloats(n, n + 1);
  std::vector<double> lanes(NumChunks(n));
  ChunkSquareSums(x.data(), n, lanes.data());
  int differing = 0;
  for (int64_t c = 0; c < NumChunks(n); ++c) {
    double running = 0;
    for (int64_t i = c * kNormChunk; i < std::min(n, (c + 1) * kNormChunk); ++i) {
      running += static_cast<double>(x[i]) * x[i];
    }
    differing += Bits(running) != Bits(lanes[c]);
  }
  EXPECT_GT(differing, 0);
}

TEST_P(NormCudaTest, Bf16BufferMatchesTheCpuOnItsFloatValues) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const auto xf = SpreadFloats(n, n + 2);
    std::vector<__nv_bfloat16> xb(n);
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) {
      xb[i] = __float2bfloat16(xf[i]);
      x[i] = __bfloat162float(xb[i]);
    }
    const int64_t chunks = NumChunks(n);
    std::vector<double> want(chunks), got(chunks);
    ChunkSquareSums(x.data(), n, want.data());
    ASSERT_TRUE(chunk_square_sums(got.data(), xb.data(), n, nullptr, 64).ok());
    for (int64_t c = 0; c < chunks; ++c) {
      ASSERT_EQ(Bits(got[c]), Bits(want[c])) << "chunk " << c;
    }
  }
}

TEST_P(NormCudaTest, RejectsBlocksOfPartialWarpsAndAcceptsAnEmptyBuffer) {
  const std::vector<float> x(10, 1.0f);
  double out = 0;
  for (int block : {0, 8, 48, 2048}) {
    EXPECT_EQ(chunk_square_sums(&out, x.data(), 10, nullptr, block).code(),
              absl::StatusCode::kInvalidArgument)
        << block;
  }
  EXPECT_TRUE(chunk_square_sums<float>(nullptr, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace troupe::kernels::cuda
