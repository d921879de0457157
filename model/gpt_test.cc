#include "troupe/model/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "troupe/kernels/parallel.h"
#include "troupe/model/rng.h"

namespace troupe::model {
namespace {

// Odd sizes everywhere: vocab 23, width 12 over 3 heads, 2 layers, batch 2 × seq 5 (context 7).
GptConfig OddConfig() { return {23, 7, 2, 3, 12}; }

std::vector<int32_t> Tokens(int64_t n, int32_t vocab, uint64_t seed) {
  std::vector<int32_t> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = static_cast<int32_t>(RandomBits(seed, RngPurpose::kTest, 9, i)[0] % vocab);
  }
  return v;
}

// Initialises, then perturbs every parameter (biases and LayerNorm too) so none is trivially 0/1.
template <typename T>
void RandomParams(GptModel<T>& m, uint64_t seed) {
  m.InitParams(seed);
  for (int64_t i = 0; i < m.num_params(); ++i) {
    m.params()[i] +=
        static_cast<T>(static_cast<float>(0.1 * NormalDouble(seed, RngPurpose::kTest, 1, i)));
  }
}

TEST(GptTest, WholeModelGradientMatchesFloat64FiniteDifferences) {
  const GptConfig config = OddConfig();
  auto model = GptModel<double>::Create(config);
  ASSERT_TRUE(model.ok()) << model.status();
  RandomParams(*model, 5);
  const int b = 2, t = 5;
  const auto tokens = Tokens(b * t, config.vocab_size, 1);
  const auto targets = Tokens(b * t, config.vocab_size, 2);
  ASSERT_TRUE(model->Forward(tokens.data(), targets.data(), b, t).ok());
  model->ZeroGrad();
  ASSERT_TRUE(model->Backward(1.0 / (b * t)).ok());
  const std::vector<double> analytic(model->grads(), model->grads() + model->num_params());
  // Central differences, step 1e-5: |fd − analytic| <= 1e-7 + 1e-6·|analytic| on every checked
  // element; up to 40 elements of every named tensor.
  int64_t checked = 0;
  for (const ParamTensor& tensor : model->layout().tensors()) {
    const int64_t stride = std::max<int64_t>(1, tensor.size / 40);
    for (int64_t j = stride / 2; j < tensor.size; j += stride) {
      double& p = model->params()[tensor.offset + j];
      const double saved = p;
      p = saved + 1e-5;
      const double up = *model->Forward(tokens.data(), targets.data(), b, t);
      p = saved - 1e-5;
      const double down = *model->Forward(tokens.data(), targets.data(), b, t);
      p = saved;
      const double fd = (up - down) / 2e-5;
      const double an = analytic[tensor.offset + j];
      ASSERT_LE(std::fabs(fd - an), 1e-7 + 1e-6 * std::fabs(an))
          << tensor.name << "[" << j << "]: finite difference " << fd << " vs analytic " << an;
      ++checked;
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(GptTest, FloatModelMatchesDoubleModel) {
  const GptConfig config = OddConfig();
  auto md = GptModel<double>::Create(config);
  auto mf = GptModel<float>::Create(config);
  RandomParams(*md, 6);
  RandomParams(*mf, 6);
  const int b = 3, t = 7;
  const auto tokens = Tokens(b * t, config.vocab_size, 3);
  const auto targets = Tokens(b * t, config.vocab_size, 4);
  const double ld = *md->Forward(tokens.data(), targets.data(), b, t);
  const double lf = *mf->Forward(tokens.data(), targets.data(), b, t);
  EXPECT_NEAR(lf, ld, 1e-5 * ld);
  md->ZeroGrad();
  mf->ZeroGrad();
  ASSERT_TRUE(md->Backward(1.0 / (b * t)).ok());
  ASSERT_TRUE(mf->Backward(1.0f / (b * t)).ok());
  double num = 0, den = 0;
  for (int64_t i = 0; i < md->num_params(); ++i) {
    num += (mf->grads()[i] - md->grads()[i]) * (mf->grads()[i] - md->grads()[i]);
    den += md->grads()[i] * md->grads()[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);
}

TEST(GptTest, LossStartsNearLogVocabAndGradientsAreBitIdenticalAt123Threads) {
  const GptConfig config{67, 33, 2, 4, 36};
  const int b = 3, t = 33;
  const auto tokens = Tokens(b * t, config.vocab_size, 5);
  const auto targets = Tokens(b * t, config.vocab_size, 6);
  std::vector<float> first;
  double first_loss = 0;
  for (int threads : {1, 2, 3}) {
    kernels::SetNumThreads(threads);
    auto m = Gpt::Create(config);
    m->InitParams(7);
    const double loss = *m->Forward(tokens.data(), targets.data(), b, t);
    m->ZeroGrad();
    ASSERT_TRUE(m->Backward(1.0f / (b * t)).ok());
    std::vector<float> out(m->grads(), m->grads() + m->num_params());
    out.insert(out.end(), m->logits(), m->logits() + b * t * config.vocab_size);
    if (first.empty()) {
      first = out;
      first_loss = loss;
      EXPECT_NEAR(loss, std::log(67.0), 0.1);
    } else {
      EXPECT_EQ(loss, first_loss) << threads << " threads";
      EXPECT_EQ(0, std::memcmp(first.data(), out.data(), out.size() * sizeof(float)))
          << threads << " threads";
    }
  }
  kernels::SetNumThreads(1);
}

TEST(GptTest, BadTokensAndShapesAreRejected) {
  auto m = Gpt::Create(GptConfig::Tiny(50));
  ASSERT_TRUE(m.ok());
  std::vector<int32_t> tokens(8, 3), targets(8, 4);
  targets[5] = 50;
  auto r = m->Forward(tokens.data(), targets.data(), 2, 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("targets[5]"), absl::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("got 50"), absl::string_view::npos) << r.status();
  tokens[0] = -1;
  EXPECT_FALSE(m->Forward(tokens.data(), nullptr, 2, 4).ok());
  tokens[0] = 1;
  EXPECT_FALSE(m->Forward(tokens.data(), nullptr, 1, 65).ok());  // longer than the context
  ASSERT_TRUE(m->Forward(tokens.data(), nullptr, 2, 4).ok());
  EXPECT_EQ(m->Backward(1.0f).code(), absl::StatusCode::kFailedPrecondition);
  GptConfig bad = GptConfig::Tiny(50);
  bad.num_heads = 5;
  EXPECT_EQ(Gpt::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::model
