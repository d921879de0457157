#include "embedding.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "test_util.h"
#include "troupe/kernels/embedding.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomTokens;
using kernels::testing::RandomVector;
using testing::ExpectClose;
using testing::ExpectWithinOneBf16Ulp;

struct Shape {
  int64_t b, t, c;
  int32_t vocab;  // small vocabularies repeat tokens, also within a group of kEmbeddingUnroll
};

// t < kEmbeddingUnroll takes only the one-at-a-time path; vocab 3 mostly repeated groups, vocab
// 64 mostly distinct ones.
constexpr Shape kShapes[] = {{2, 5, 1, 3}, {3, 7, 33, 4},  {2, 9, 100, 64}, {1, 3, 7, 2},
                             {4, 1, 5, 3}, {3, 2, 40, 64}, {5, 11, 65, 3}};

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

class EmbeddingCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(EmbeddingCudaTest);

TEST_P(EmbeddingCudaTest, Fp32IsBitIdenticalToTheFloatCpuKernel) {
  for (const Shape& s : kShapes) {
    const int64_t bt = s.b * s.t;
    const auto tokens = RandomTokens(bt, s.vocab, s.c + s.t);
    const auto wte = RandomVector(s.vocab * s.c, 1), wpe = RandomVector(s.t * s.c, 2);
    const auto dout = RandomVector(bt * s.c, 3);
    const auto dwte0 = RandomVector(s.vocab * s.c, 4), dwpe0 = RandomVector(s.t * s.c, 5);

    std::vector<double> out_ref(bt * s.c), dwte_ref = dwte0, dwpe_ref = dwpe0;
    EmbeddingForward<double>(out_ref.data(), tokens.data(), wte.data(), wpe.data(), s.b, s.t, s.c);
    EmbeddingBackward<double>(dwte_ref.data(), dwpe_ref.data(), dout.data(), tokens.data(), s.b,
                              s.t, s.c);
    const auto wte_f = kernels::testing::ToFloat(wte), wpe_f = kernels::testing::ToFloat(wpe);
    const auto dout_f = kernels::testing::ToFloat(dout);
    std::vector<float> out_cpu(bt * s.c), dwte_cpu = kernels::testing::ToFloat(dwte0),
                                          dwpe_cpu = kernels::testing::ToFloat(dwpe0);
    EmbeddingForward<float>(out_cpu.data(), tokens.data(), wte_f.data(), wpe_f.data(), s.b, s.t,
                            s.c);
    EmbeddingBackward<float>(dwte_cpu.data(), dwpe_cpu.data(), dout_f.data(), tokens.data(), s.b,
                             s.t, s.c);

    for (int block : {32, 96, 256}) {
      SCOPED_TRACE(::testing::Message()
                   << "b=" << s.b << " t=" << s.t << " c=" << s.c << " block=" << block);
      std::vector<float> out(bt * s.c), dwte = kernels::testing::ToFloat(dwte0),
                                        dwpe = kernels::testing::ToFloat(dwpe0);
      ASSERT_TRUE(embedding_forward(out.data(), tokens.data(), wte_f.data(), wpe_f.data(), s.b, s.t,
                                    s.c, nullptr, block)
                      .ok());
      ASSERT_TRUE(embedding_backward(dwte.data(), dwpe.data(), dout_f.data(), tokens.data(), s.b,
                                     s.t, s.c, nullptr, block)
                      .ok());
      EXPECT_TRUE(SameBits(out, out_cpu)) << "out";
      EXPECT_TRUE(SameBits(dwte, dwte_cpu)) << "dwte";
      EXPECT_TRUE(SameBits(dwpe, dwpe_cpu)) << "dwpe";
      ExpectClose(out, out_ref, 1e-5, "out", /*floor=*/1.0);     // a sum of two O(1) values
      ExpectClose(dwte, dwte_ref, 1e-5, "dwte", /*floor=*/1.0);  // sums onto O(1) values
      ExpectClose(dwpe, dwpe_ref, 1e-5, "dwpe", /*floor=*/1.0);
    }
  }
}

// bf16: the forward is one rounding of a float sum of two bf16 values. The backward rounds to bf16
// after every addition, in (b, t) order: it must equal that sequence replayed on the host, bit for
// bit, and lie within the bound of that many roundings of the double reference:
// |got − exact| ≤ 2^-8 · Σ |partial sums| (bf16 keeps 8 significant bits; the float addition
// before each rounding is exact or off by 2^-24, which the margin covers).
TEST_P(EmbeddingCudaTest, Bf16MatchesTheRoundedReference) {
  for (const Shape& s : kShapes) {
    const int64_t bt = s.b * s.t, c = s.c;
    const auto tokens = RandomTokens(bt, s.vocab, s.c + s.t + 1);
    const auto wte_b = testing::ToBf16(RandomVector(s.vocab * c, 11));
    const auto wpe_b = testing::ToBf16(RandomVector(s.t * c, 12));
    const auto dout_b = testing::ToBf16(RandomVector(bt * c, 13));
    const auto dwte0_b = testing::ToBf16(RandomVector(s.vocab * c, 14));
    const auto dwpe0_b = testing::ToBf16(RandomVector(s.t * c, 15));
    const auto wte = testing::ToDouble(wte_b), wpe = testing::ToDouble(wpe_b);
    const auto dout = testing::ToDouble(dout_b);
    std::vector<double> out_ref(bt * c), dwte_ref = testing::ToDouble(dwte0_b),
                                         dwpe_ref = testing::ToDouble(dwpe0_b);
    EmbeddingForward<double>(out_ref.data(), tokens.data(), wte.data(), wpe.data(), s.b, s.t, c);
    EmbeddingBackward<double>(dwte_ref.data(), dwpe_ref.data(), dout.data(), tokens.data(), s.b,
                              s.t, c);

    // The replay, and Σ |partial sums| per element.
    std::vector<__nv_bfloat16> dwte_replay = dwte0_b, dwpe_replay = dwpe0_b;
    std::vector<double> dwte_mass(s.vocab * c, 0.0), dwpe_mass(s.t * c, 0.0);
    for (int64_t i = 0; i < bt; ++i) {
      for (int64_t j = 0; j < c; ++j) {
        const float g = __bfloat162float(dout_b[i * c + j]);
        const int64_t te = tokens[i] * c + j, pe = (i % s.t) * c + j;
        dwte_replay[te] = __float2bfloat16(__bfloat162float(dwte_replay[te]) + g);
        dwpe_replay[pe] = __float2bfloat16(__bfloat162float(dwpe_replay[pe]) + g);
        dwte_mass[te] += std::fabs(__bfloat162float(dwte_replay[te]));
        dwpe_mass[pe] += std::fabs(__bfloat162float(dwpe_replay[pe]));
      }
    }

    for (int block : {32, 96}) {
      SCOPED_TRACE(::testing::Message()
                   << "b=" << s.b << " t=" << s.t << " c=" << c << " block=" << block);
      std::vector<__nv_bfloat16> out(bt * c), dwte = dwte0_b, dwpe = dwpe0_b;
      ASSERT_TRUE(embedding_forward(out.data(), tokens.data(), wte_b.data(), wpe_b.data(), s.b, s.t,
                                    c, nullptr, block)
                      .ok());
      ASSERT_TRUE(embedding_backward(dwte.data(), dwpe.data(), dout_b.data(), tokens.data(), s.b,
                                     s.t, c, nullptr, block)
                      .ok());
      ExpectWithinOneBf16Ulp(out, out_ref, "out");
      EXPECT_TRUE(SameBits(dwte, dwte_replay)) << "dwte";
      EXPECT_TRUE(SameBits(dwpe, dwpe_replay)) << "dwpe";
      auto expect_bounded = [](const std::vector<__nv_bfloat16>& got,
                               const std::vector<double>& ref, const std::vector<double>& mass,
                               const char* what) {
        for (size_t k = 0; k < got.size(); ++k) {
          const double bound = 1.01 * std::ldexp(mass[k], -8);
          ASSERT_LE(std::fabs(__bfloat162float(got[k]) - ref[k]), bound)
              << what << "[" << k << "] is " << __bfloat162float(got[k]) << ", reference "
              << ref[k];
        }
      };
      expect_bounded(dwte, dwte_ref, dwte_mass, "dwte");
      expect_bounded(dwpe, dwpe_ref, dwpe_mass, "dwpe");
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
