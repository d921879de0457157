#include "troupe/model/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

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

// A pipeline's stages, chained, compute Backward's gradient bit for bit: every stage holds three
// microbatches in flight (all forwards first, then the backwards), and wte's gradient is the last
// stage's head part completed with the first stage's input gradient.
TEST(GptTest, ChainedStagesReproduceTheWholeModelsGradientBitForBit) {
  const GptConfig config{23, 7, 4, 3, 12};
  const int b = 2, t = 5, microbatches = 3;
  auto reference = Gpt::Create(config);
  ASSERT_TRUE(reference.ok());
  RandomParams(*reference, 7);
  std::vector<std::vector<int32_t>> tokens, targets;
  std::vector<std::vector<float>> want_grads;
  std::vector<double> want_loss;
  for (int k = 0; k < microbatches; ++k) {
    tokens.push_back(Tokens(b * t, config.vocab_size, 10 + k));
    targets.push_back(Tokens(b * t, config.vocab_size, 20 + k));
    auto loss = reference->Forward(tokens[k].data(), targets[k].data(), b, t);
    ASSERT_TRUE(loss.ok());
    want_loss.push_back(*loss);
    reference->ZeroGrad();
    ASSERT_TRUE(reference->Backward(1.0f / (b * t)).ok());
    want_grads.emplace_back(reference->grads(), reference->grads() + reference->num_params());
  }
  const std::vector<std::vector<StageRange>> cuts = {
      {{0, 4}}, {{0, 2}, {2, 4}}, {{0, 1}, {1, 2}, {2, 3}, {3, 4}}, {{0, 3}, {3, 4}}};
  for (const std::vector<StageRange>& cut : cuts) {
    const int p = static_cast<int>(cut.size());
    SCOPED_TRACE(testing::Message() << p << " stages, the first ending at " << cut[0].end_block);
    std::vector<Gpt> stages;
    std::vector<int64_t> covered(reference->num_params(), 0);
    for (const StageRange& range : cut) {
      auto stage = Gpt::Create(config);
      ASSERT_TRUE(stage.ok());
      std::copy(reference->params(), reference->params() + reference->num_params(),
                stage->params());
      ASSERT_TRUE(stage->SetStage(range, microbatches).ok());
      for (const auto& [lo, hi] : stage->StageGradientRanges(range)) {
        for (int64_t i = lo; i < hi; ++i) ++covered[i];
      }
      stages.push_back(std::move(*stage));
    }
    EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), reference->num_params())
        << "the stages' gradient ranges must cover every parameter exactly once";
    for (int k = 0; k < microbatches; ++k) {
      const float* input = nullptr;
      for (int s = 0; s < p; ++s) {
        auto loss = stages[s].ForwardStage(k, tokens[k].data(), targets[k].data(), input, b, t);
        ASSERT_TRUE(loss.ok()) << loss.status();
        if (s == p - 1) {
          EXPECT_EQ(*loss, want_loss[k]) << "microbatch " << k;
        } else {
          input = stages[s].stage_output(k);
        }
      }
    }
    for (int k = 0; k < microbatches; ++k) {
      std::vector<float> got(reference->num_params(), -1.0f);
      const float* d_output = nullptr;
      for (int s = p - 1; s >= 0; --s) {
        stages[s].ZeroGrad();
        ASSERT_TRUE(stages[s].BackwardStage(k, 1.0f / (b * t), d_output).ok());
        for (const auto& [lo, hi] : stages[s].StageGradientRanges(cut[s])) {
          std::copy(stages[s].grads() + lo, stages[s].grads() + hi, got.begin() + lo);
        }
        d_output = stages[s].input_gradient();
      }
      stages[p - 1].AddTokenEmbeddingGradient(got.data() + reference->layout().wte(),
                                              stages[0].input_gradient(), tokens[k].data(), b, t);
      EXPECT_EQ(0, std::memcmp(got.data(), want_grads[k].data(), got.size() * sizeof(float)))
          << "microbatch " << k;
    }
  }
}

TEST(GptTest, InitialisingARangeWritesThoseBitsAndNothingElse) {
  auto whole = GptModel<float>::Create(OddConfig());
  ASSERT_TRUE(whole.ok()) << whole.status();
  whole->InitParams(11);
  const int64_t n = whole->num_params();
  // Cuts inside a matrix, inside a bias and at the ends.
  for (const auto& [b, e] :
       std::vector<std::pair<int64_t, int64_t>>{{0, n}, {5, 170}, {n / 3, n / 2 + 1}, {n - 9, n}}) {
    auto part = GptModel<float>::Create(OddConfig());
    ASSERT_TRUE(part.ok()) << part.status();
    part->InitParams(11, b, e);
    for (int64_t i = 0; i < n; ++i) {
      const float want = i >= b && i < e ? whole->params()[i] : 0.0f;
      ASSERT_EQ(part->params()[i], want) << "element " << i << " of [" << b << ", " << e << ")";
    }
  }
}

TEST(GptTest, BadStagesAreRejected) {
  auto m = Gpt::Create(GptConfig::Tiny(50));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->SetStage({1, 1}, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->SetStage({0, 3}, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->SetStage({0, 1}, 0).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> tokens(8, 3);
  EXPECT_EQ(m->ForwardStage(0, tokens.data(), nullptr, nullptr, 2, 4).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "ForwardStage before SetStage";
  ASSERT_TRUE(m->SetStage({1, 2}, 2).ok());
  EXPECT_EQ(m->ForwardStage(0, tokens.data(), tokens.data(), nullptr, 2, 4).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a later stage without its input";
  EXPECT_EQ(m->ForwardStage(2, tokens.data(), tokens.data(), nullptr, 2, 4).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a slot beyond SetStage's";
}

}  // namespace
}  // namespace troupe::model
