#include "troupe/kernels/embedding.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace troupe::kernels {
namespace {

using testing::RandomVector;

TEST(EmbeddingTest, BackwardMatchesFiniteDifferencesWithRepeatedTokens) {
  const int64_t b = 3, t = 5, c = 7, v = 4;  // 15 tokens over 4 ids: many repeats
  auto tokens = testing::RandomTokens(b * t, v, 1);
  auto wte = RandomVector(v * c, 2), wpe = RandomVector(t * c, 3);
  const auto probe = RandomVector(b * t * c, 4);
  std::vector<double> out(b * t * c);
  auto objective = [&] {
    EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), b, t, c);
    return testing::Dot(out, probe);
  };
  std::vector<double> dwte(v * c, 0), dwpe(t * c, 0);
  EmbeddingBackward(dwte.data(), dwpe.data(), probe.data(), tokens.data(), b, t, c);
  testing::ExpectGradientMatchesFd("dwte", wte, dwte, objective);
  testing::ExpectGradientMatchesFd("dwpe", wpe, dwpe, objective);
}

TEST(EmbeddingTest, BitIdenticalAcrossThreads) {
  const int64_t b = 4, t = 33, c = 71, v = 13;
  auto tokens = testing::RandomTokens(b * t, v, 5);
  auto wte = testing::ToFloat(RandomVector(v * c, 6)),
       wpe = testing::ToFloat(RandomVector(t * c, 7)),
       dout = testing::ToFloat(RandomVector(b * t * c, 8));
  testing::ExpectSameBitsAtThreadCounts([&] {
    std::vector<float> out(b * t * c), dwte(v * c, 0), dwpe(t * c, 0);
    EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), b, t, c);
    EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), b, t, c);
    EXPECT_EQ(out[c + 3], wte[tokens[1] * c + 3] + wpe[c + 3]);
    std::vector<float> all = out;
    testing::Append(all, dwte);
    testing::Append(all, dwpe);
    return all;
  });
}

}  // namespace
}  // namespace troupe::kernels
