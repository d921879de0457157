#include "troupe/kernels/crossentropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "test_util.h"

namespace troupe::kernels {
namespace {

using testing::RandomVector;

TEST(CrossEntropyTest, ForwardMatchesLogSoftmax) {
  const int64_t n = 3, v = 11;
  auto logits = RandomVector(n * v, 1, 5.0);
  auto targets = testing::RandomTokens(n, v, 2);
  std::vector<double> losses(n), probs(n * v);
  CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), n, v);
  for (int64_t i = 0; i < n; ++i) {
    double z = 0, psum = 0;
    for (int64_t j = 0; j < v; ++j) z += std::exp(logits[i * v + j]);
    for (int64_t j = 0; j < v; ++j) psum += probs[i * v + j];
    EXPECT_NEAR(losses[i], std::log(z) - logits[i * v + targets[i]], 1e-12);
    EXPECT_NEAR(psum, 1.0, 1e-12);
  }
}

TEST(CrossEntropyTest, BackwardMatchesFiniteDifferences) {
  const int64_t n = 9, v = 17;
  auto logits = RandomVector(n * v, 3, 3.0);
  auto targets = testing::RandomTokens(n, v, 4);
  const double dloss = 1.0 / n;  // objective: mean loss
  std::vector<double> losses(n), probs(n * v);
  auto objective = [&] {
    CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), n, v);
    double s = 0;
    for (double l : losses) s += l;
    return s * dloss;
  };
  objective();
  std::vector<double> dlogits(n * v, 0);
  CrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), dloss, n, v);
  testing::ExpectGradientMatchesFd("dlogits", logits, dlogits, objective);
}

TEST(CrossEntropyTest, FloatMatchesDoubleAndIsBitIdenticalAcrossThreads) {
  const int64_t n = 101, v = 257;
  auto logits = RandomVector(n * v, 5, 4.0);
  auto targets = testing::RandomTokens(n, v, 6);
  std::vector<double> losses_d(n), probs_d(n * v), dlogits_d(n * v, 0);
  CrossEntropyForward(losses_d.data(), probs_d.data(), logits.data(), targets.data(), n, v);
  CrossEntropyBackward(dlogits_d.data(), probs_d.data(), targets.data(), 0.01, n, v);
  auto logits_f = testing::ToFloat(logits);
  testing::ExpectSameBitsAtThreadCounts([&] {
    std::vector<float> losses(n), probs(n * v), dlogits(n * v, 0);
    CrossEntropyForward(losses.data(), probs.data(), logits_f.data(), targets.data(), n, v);
    CrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), 0.01f, n, v);
    EXPECT_LT(testing::RelErr(losses, losses_d), 1e-6);
    EXPECT_LT(testing::RelErr(dlogits, dlogits_d), 1e-5);
    std::vector<float> all = losses;
    testing::Append(all, probs);
    testing::Append(all, dlogits);
    return all;
  });
}

TEST(CrossEntropyTest, BackwardWithoutAccumulateOverwritesWhatWasThere) {
  const int64_t n = 37, v = 101;
  auto logits = testing::ToFloat(RandomVector(n * v, 8, 4.0));
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 17) % v);
  std::vector<float> losses(n), probs(n * v), added(n * v, 0.0f), written(n * v, -7.0f);
  CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), n, v);
  CrossEntropyBackward(added.data(), probs.data(), targets.data(), 0.5f, n, v);
  CrossEntropyBackward(written.data(), probs.data(), targets.data(), 0.5f, n, v,
                       /*accumulate=*/false);
  ASSERT_EQ(written.size(), added.size());
  EXPECT_EQ(std::memcmp(written.data(), added.data(), added.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace troupe::kernels
