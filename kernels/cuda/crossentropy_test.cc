#include "crossentropy.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "test_util.h"
#include "troupe/kernels/crossentropy.h"

namespace troupe::kernels::cuda {
namespace {

using kernels::testing::RandomTokens;
using kernels::testing::RandomVector;
using testing::ExpectClose;
using testing::ExpectWithinOneBf16Ulp;

// Row r is shifted by kOffsets[r % 3]: exp of the shifted logits over- or underflows float (for
// V = 50257, Σ exp(x) with x ≈ 50 reaches 1e26; with x ≈ -50, exp(x) ≈ 2e-22), so the results
// rely on the max shift.
constexpr double kOffsets[] = {0.0, 50.0, -50.0};

template <typename Tx>
Tx Store(float x) {
  if constexpr (std::is_same_v<Tx, float>) {
    return x;
  } else {
    return __float2bfloat16(x);
  }
}
float Load(float x) { return x; }
float Load(__nv_bfloat16 x) { return __bfloat162float(x); }

// Logits [n, v], random with scale 4 plus each row's offset, rounded to Tx.
template <typename Tx>
std::vector<Tx> MakeLogits(int64_t n, int64_t v, uint64_t seed) {
  auto x = RandomVector(n * v, seed, 4.0);
  std::vector<Tx> out(x.size());
  for (int64_t i = 0; i < n * v; ++i) {
    out[i] = Store<Tx>(static_cast<float>(x[i] + kOffsets[(i / v) % 3]));
  }
  return out;
}

template <typename Tx>
std::vector<double> AsDouble(const std::vector<Tx>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Load(v[i]);
  return out;
}

struct Reference {
  std::vector<double> losses, lse, probs;
};

Reference CpuReference(const std::vector<double>& logits, const std::vector<int32_t>& targets,
                       int64_t n, int64_t v) {
  Reference r{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n * v)};
  CrossEntropyForward<double>(r.losses.data(), r.probs.data(), logits.data(), targets.data(), n, v);
  for (int64_t i = 0; i < n; ++i) r.lse[i] = r.losses[i] + logits[i * v + targets[i]];
  return r;
}

// dlogits0 + the CPU backward, in double.
std::vector<double> CpuBackward(const Reference& r, const std::vector<int32_t>& targets,
                                std::vector<double> dlogits0, double dloss, int64_t n, int64_t v) {
  CrossEntropyBackward<double>(dlogits0.data(), r.probs.data(), targets.data(), dloss, n, v);
  return dlogits0;
}

class CrossEntropyCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(CrossEntropyCudaTest);

TEST_P(CrossEntropyCudaTest, Fp32MatchesTheCpuReference) {
  for (int64_t v : {1, 7, 65, 50257}) {
    const int64_t n = 3;  // one row per offset
    const float dloss = 1.0f / static_cast<float>(n);
    const auto logits = MakeLogits<float>(n, v, v);
    const auto targets = RandomTokens(n, static_cast<int32_t>(v), v + 1);
    const Reference ref = CpuReference(AsDouble(logits), targets, n, v);
    const auto dlogits0 = RandomVector(n * v, v + 2);
    const auto dlogits_ref = CpuBackward(ref, targets, dlogits0, dloss, n, v);
    const auto grad_ref = CpuBackward(ref, targets, std::vector<double>(n * v), dloss, n, v);
    for (int block : {32, 96, 1024}) {
      SCOPED_TRACE(::testing::Message() << "v=" << v << " block=" << block);
      std::vector<float> losses(n), lse(n);
      ASSERT_TRUE(crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), n,
                                       v, nullptr, block)
                      .ok());
      // A loss is lse − x[target], a difference of values of the size of the logits.
      ExpectClose(losses, ref.losses, 1e-5, "losses", /*floor=*/1.0);
      ExpectClose(lse, ref.lse, 1e-5, "lse");

      // Accumulation onto O(1) values.
      std::vector<float> dlogits = kernels::testing::ToFloat(dlogits0);
      ASSERT_TRUE(crossentropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(),
                                        dloss, n, v, nullptr, block)
                      .ok());
      ExpectClose(dlogits, dlogits_ref, 1e-5, "dlogits", /*floor=*/1.0);

      // The gradient alone: p · dloss is checked relative to itself however small p is (exp has a
      // small relative error); p − 1 at the target cancels, so it is checked relative to dloss.
      std::vector<float> grad(n * v, 0.0f);
      ASSERT_TRUE(crossentropy_backward(grad.data(), logits.data(), lse.data(), targets.data(),
                                        dloss, n, v, nullptr, block)
                      .ok());
      std::vector<float> off, at;
      std::vector<double> off_ref, at_ref;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < v; ++j) {
          const bool is_target = j == targets[i];
          (is_target ? at : off).push_back(grad[i * v + j]);
          (is_target ? at_ref : off_ref).push_back(grad_ref[i * v + j]);
        }
      }
      ExpectClose(off, off_ref, 1e-5, "softmax · dloss", /*floor=*/1e-30);
      ExpectClose(at, at_ref, 1e-5, "(softmax − 1) · dloss", /*floor=*/dloss);
    }
  }
}

TEST_P(CrossEntropyCudaTest, Bf16LogitsMatchTheReferenceOfTheRoundedLogits) {
  for (int64_t v : {1, 7, 65, 50257}) {
    const int64_t n = 3;  // one row per offset
    const float dloss = 1.0f / static_cast<float>(n);
    const auto logits = MakeLogits<__nv_bfloat16>(n, v, v + 10);
    const auto targets = RandomTokens(n, static_cast<int32_t>(v), v + 11);
    // The reference starts from the same bf16 values, in double.
    const Reference ref = CpuReference(AsDouble(logits), targets, n, v);
    const auto dlogits0 = testing::ToBf16(RandomVector(n * v, v + 12));
    const auto dlogits_ref = CpuBackward(ref, targets, testing::ToDouble(dlogits0), dloss, n, v);
    const auto grad_ref = CpuBackward(ref, targets, std::vector<double>(n * v), dloss, n, v);
    for (int block : {64, kCrossEntropyBlock}) {
      SCOPED_TRACE(::testing::Message() << "v=" << v << " block=" << block);
      std::vector<float> losses(n), lse(n);
      ASSERT_TRUE(crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), n,
                                       v, nullptr, block)
                      .ok());
      ExpectClose(losses, ref.losses, 1e-5, "losses", /*floor=*/1.0);
      ExpectClose(lse, ref.lse, 1e-5, "lse");
      // Each bf16 output is one rounding of a float computed to ~1e-6 relative.
      std::vector<__nv_bfloat16> dlogits = dlogits0;
      ASSERT_TRUE(crossentropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(),
                                        dloss, n, v, nullptr, block)
                      .ok());
      ExpectWithinOneBf16Ulp(dlogits, dlogits_ref, "dlogits");
      std::vector<__nv_bfloat16> grad(n * v, __float2bfloat16(0.0f));
      ASSERT_TRUE(crossentropy_backward(grad.data(), logits.data(), lse.data(), targets.data(),
                                        dloss, n, v, nullptr, block)
                      .ok());
      ExpectWithinOneBf16Ulp(grad, grad_ref, "(softmax − onehot) · dloss");
    }
  }
}

TEST_P(CrossEntropyCudaTest, LseIsOptional) {
  const int64_t n = 2, v = 65;
  const auto logits = MakeLogits<float>(n, v, 3);
  const auto targets = RandomTokens(n, v, 4);
  std::vector<float> with(n), without(n), lse(n);
  ASSERT_TRUE(
      crossentropy_forward(with.data(), lse.data(), logits.data(), targets.data(), n, v, nullptr)
          .ok());
  ASSERT_TRUE(crossentropy_forward(without.data(), static_cast<float*>(nullptr), logits.data(),
                                   targets.data(), n, v, nullptr)
                  .ok());
  EXPECT_EQ(0, std::memcmp(with.data(), without.data(), n * sizeof(float)));
}

TEST_P(CrossEntropyCudaTest, RejectsBadBlocksAndShapes) {
  std::vector<float> logits(7, 0.0f), losses(1), lse(1);
  const std::vector<int32_t> targets = {3};
  for (int block : {0, 48, 2048}) {
    EXPECT_EQ(crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), 1, 7,
                                   nullptr, block)
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << block;
  }
  EXPECT_EQ(
      crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), 1, 0, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(crossentropy_backward(logits.data(), logits.data(), lse.data(), targets.data(), 1.0f, 1,
                                  7, nullptr, 0)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), 0, 7, nullptr)
          .ok());
}

// The bits of every output under every schedule: the reductions' order depends on the thread
// indices only, never on which thread runs first.
template <typename Tx>
std::vector<unsigned char> RunAll(int64_t n, int64_t v, int block) {
  const auto logits = MakeLogits<Tx>(n, v, v + 20);
  const auto targets = RandomTokens(n, static_cast<int32_t>(v), v + 21);
  std::vector<float> losses(n), lse(n);
  std::vector<Tx> dlogits(n * v, Store<Tx>(0.5f));
  EXPECT_TRUE(crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), n, v,
                                   nullptr, block)
                  .ok());
  EXPECT_TRUE(crossentropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(),
                                    0.25f, n, v, nullptr, block)
                  .ok());
  std::vector<unsigned char> bytes((2 * n) * sizeof(float) + n * v * sizeof(Tx));
  std::memcpy(bytes.data(), losses.data(), n * sizeof(float));
  std::memcpy(bytes.data() + n * sizeof(float), lse.data(), n * sizeof(float));
  std::memcpy(bytes.data() + 2 * n * sizeof(float), dlogits.data(), n * v * sizeof(Tx));
  return bytes;
}

TEST(CrossEntropyCudaDeterminismTest, BitIdenticalAcrossSchedules) {
  for (int64_t v : {65, 50257}) {
    std::vector<unsigned char> first_f, first_b;
    for (simt::Schedule schedule : testing::kSchedules) {
      simt::ScopedSchedule scoped(schedule, /*seed=*/5);
      const auto f = RunAll<float>(3, v, 96);
      const auto b = RunAll<__nv_bfloat16>(3, v, 96);
      if (first_f.empty()) {
        first_f = f, first_b = b;
        continue;
      }
      EXPECT_EQ(f, first_f) << "fp32, v=" << v << ", " << simt::ScheduleName(schedule);
      EXPECT_EQ(b, first_b) << "bf16, v=" << v << ", " << simt::ScheduleName(schedule);
    }
  }
}

}  // namespace
}  // namespace troupe::kernels::cuda
