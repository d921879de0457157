// [eval]: the held-out loss a Trainable computes (Trainable::EvalLoss), and its split over ranks
// (EvalShare) whose canonical mean does not depend on the world size.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <vector>

#include "troupe/model/data_source.h"
#include "troupe/model/gpt.h"
#include "troupe/model/token_shard.h"
#include "troupe/train/coordinator_core.h"
#include "troupe/train/trainable.h"

namespace troupe::train {
namespace {

constexpr int32_t kVocab = 300;

std::vector<int32_t> Tokens(uint32_t seed, size_t n) {
  std::vector<int32_t> out(n);
  for (auto& t : out) {
    seed = seed * 1664525u + 1013904223u;
    t = static_cast<int32_t>((seed >> 16) % kVocab);
  }
  return out;
}

class EvalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("troupe_eval_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/held");
    ASSERT_TRUE(model::WriteTokenShard(dir_ + "/train-00000.tok", Tokens(1, 20000), kVocab).ok());
    ASSERT_TRUE(model::WriteTokenShard(dir_ + "/val-00000.tok", Tokens(2, 4000), kVocab).ok());
    ASSERT_TRUE(model::WriteTokenShard(dir_ + "/held/other.tok", Tokens(3, 4000), kVocab).ok());
    spec_.data_dir = dir_;
    spec_.seq_len = 16;
    spec_.microbatch_size = 2;
    spec_.microbatches = 4;
    spec_.seed = 5;
    spec_.eval_microbatches = 6;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The loss of `shard`'s held-out microbatch k as the model computes it, from a GPT of its own
  // with the same parameters.
  double Expected(const std::string& shard, Trainable& t, int32_t k) {
    auto data = model::DataSource::Open({shard}, kVocab,
                                        {.seq_len = spec_.seq_len,
                                         .microbatch_size = spec_.microbatch_size,
                                         .microbatches_per_step = spec_.eval_microbatches,
                                         .seed = spec_.seed});
    EXPECT_TRUE(data.ok()) << data.status();
    model::Microbatch mb;
    EXPECT_TRUE(data->Get(0, k, &mb).ok());
    auto gpt = model::Gpt::Create(model::GptConfig::Tiny(kVocab));
    EXPECT_TRUE(gpt.ok()) << gpt.status();
    std::copy(t.params(), t.params() + t.num_params(), gpt->params());
    absl::StatusOr<double> loss =
        gpt->Forward(mb.inputs.data(), mb.targets.data(), mb.batch, mb.seq_len);
    EXPECT_TRUE(loss.ok()) << loss.status();
    return *loss;
  }

  std::string dir_;
  ModelSpec spec_;
};

TEST_F(EvalTest, TheHeldOutLossIsTheModelsLossOnTheValShardAndChangesNothing) {
  auto t = CreateGptTrainable(spec_);
  ASSERT_TRUE(t.ok()) << t.status();
  Trainable& m = **t;
  m.InitParams(9);
  const std::vector<float> before(m.params(), m.params() + m.num_params());
  absl::StatusOr<double> train_loss = m.ComputeGradient(3, 1);
  ASSERT_TRUE(train_loss.ok()) << train_loss.status();
  for (int32_t k = 0; k < spec_.eval_microbatches; ++k) {
    absl::StatusOr<double> loss = m.EvalLoss(k);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_EQ(*loss, Expected(dir_ + "/val-00000.tok", m, k)) << "k " << k;
    EXPECT_EQ(*m.EvalLoss(k), *loss) << "the same tokens at every evaluation";
  }
  EXPECT_EQ(std::vector<float>(m.params(), m.params() + m.num_params()), before);
  absl::StatusOr<double> again = m.ComputeGradient(3, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *train_loss) << "the training data order is untouched";
  EXPECT_NE(*m.EvalLoss(0), *train_loss) << "held-out tokens, not the training step's";
  EXPECT_EQ(m.EvalLoss(6).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EvalTest, AShardIsNamedRelativeToTheDataDirAndAMissingOneIsAnErrorNamingIt) {
  spec_.eval_shard = "held/other.tok";
  auto t = CreateGptTrainable(spec_);
  ASSERT_TRUE(t.ok()) << t.status();
  (*t)->InitParams(9);
  EXPECT_EQ(*(*t)->EvalLoss(2), Expected(dir_ + "/held/other.tok", **t, 2));

  spec_.eval_shard = "";
  std::filesystem::remove(dir_ + "/val-00000.tok");
  auto none = CreateGptTrainable(spec_);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("eval.shard: expected a val-*.tok shard in '" + dir_),
            std::string::npos)
      << none.status();

  spec_.eval_shard = "nope.tok";
  auto missing = CreateGptTrainable(spec_);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("eval.shard: " + dir_ + "/nope.tok"), std::string::npos)
      << missing.status();

  spec_.eval_microbatches = 0;  // [eval] off: nothing is opened, nothing can be evaluated
  auto off = CreateGptTrainable(spec_);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ((*off)->EvalLoss(0).status().code(), absl::StatusCode::kUnimplemented);
}

// Every world size splits the held-out microbatches into shares that cover each once, and their
// canonical mean is the same bits.
TEST_F(EvalTest, EveryWorldSizesSharesCoverEachMicrobatchOnceAndAverageToTheSameBits) {
  spec_.eval_microbatches = 7;
  auto t = CreateGptTrainable(spec_);
  ASSERT_TRUE(t.ok()) << t.status();
  (*t)->InitParams(4);
  double want = -1;
  for (int world = 1; world <= 9; ++world) {
    std::map<int32_t, double> all;
    for (int rank = 0; rank < world; ++rank) {
      auto share = EvalShare(**t, 7, rank, world);
      ASSERT_TRUE(share.ok()) << share.status();
      for (const auto& [k, loss] : *share) {
        EXPECT_TRUE(all.emplace(k, loss).second) << "k " << k << " twice at world " << world;
      }
    }
    ASSERT_EQ(all.size(), 7u) << "world " << world;
    if (want < 0) want = CanonicalMean(all);
    EXPECT_EQ(CanonicalMean(all), want) << "world " << world;
  }
  EXPECT_EQ(EvalShare(**t, 7, 3, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::train
