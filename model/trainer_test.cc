#include "troupe/model/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "test_files.h"
#include "troupe/model/rng.h"
#include "troupe/model/token_shard.h"

namespace troupe::model {
namespace {

// A learnable synthetic language: token i+1 follows token i (mod vocab), with occasional noise.
std::string WriteShard(const std::string& dir, int32_t vocab) {
  std::vector<int32_t> tokens(4000);
  int32_t t = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    t = (UniformDouble(3, RngPurpose::kTest, 0, i) < 0.1) ? (t * 7 + 3) % vocab : (t + 1) % vocab;
    tokens[i] = t;
  }
  const std::string path = dir + "/train.tok";
  EXPECT_TRUE(WriteTokenShard(path, tokens, vocab).ok());
  return path;
}

TEST(TrainerTest, LossFallsAndSaveRestoreResumesBitIdentically) {
  const std::string dir = testing::MakeTempDir();
  const int32_t vocab = 29;
  const std::string shard = WriteShard(dir, vocab);
  auto data = DataSource::Open({shard}, vocab, {16, 4, 3, 5});
  ASSERT_TRUE(data.ok()) << data.status();
  TrainerOptions options;
  options.config = {vocab, 16, 1, 2, 16};
  options.schedule = {1e-2f, 1e-3f, 3, 40};
  auto a = Trainer::Create(options, &*data);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<double> losses;
  for (int i = 0; i < 10; ++i) losses.push_back(*a->Step());
  EXPECT_NEAR(losses[0], std::log(double(vocab)), 0.3);
  ASSERT_TRUE(a->Save(dir + "/state.bin").ok());
  for (int i = 0; i < 20; ++i) losses.push_back(*a->Step());
  EXPECT_LT(losses.back(), 0.6 * losses[0]);
  auto b = Trainer::Create(options, &*data);
  ASSERT_TRUE(b->Restore(dir + "/state.bin").ok());
  EXPECT_EQ(b->step(), 10);
  for (int i = 10; i < 30; ++i) EXPECT_EQ(*b->Step(), losses[i]) << "step " << i;
  EXPECT_EQ(0, std::memcmp(a->model().params(), b->model().params(),
                           a->model().num_params() * sizeof(float)));
  TrainerOptions other = options;
  other.config.width = 32;
  auto c = Trainer::Create(other, &*data);
  const absl::Status s = c->Restore(dir + "/state.bin");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("config: expected"), absl::string_view::npos) << s;
}

// before_update runs once per step, after the passes and before AdamW: the parameters and
// moments it sees are still the step's inputs (what a checkpoint of the previous step holds), and
// a step with it is bit-identical to one without.
TEST(TrainerTest, BeforeUpdateRunsOnceAfterThePassesBeforeTheStateChanges) {
  const std::string dir = testing::MakeTempDir();
  const int32_t vocab = 29;
  auto data = DataSource::Open({WriteShard(dir, vocab)}, vocab, {16, 4, 2, 5});
  ASSERT_TRUE(data.ok()) << data.status();
  TrainerOptions options;
  options.config = {vocab, 16, 1, 2, 16};
  auto with = Trainer::Create(options, &*data);
  auto without = Trainer::Create(options, &*data);
  ASSERT_TRUE(with.ok() && without.ok());
  const int64_t n = with->model().num_params();
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> params(with->model().params(), with->model().params() + n);
    const std::vector<float> v = with->adam_v();
    int calls = 0;
    bool unchanged = false;
    absl::StatusOr<double> loss = with->Step([&] {
      ++calls;
      unchanged = std::memcmp(params.data(), with->model().params(), n * sizeof(float)) == 0 &&
                  with->adam_v() == v;
    });
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_EQ(calls, 1);
    EXPECT_TRUE(unchanged) << "step " << step;
    EXPECT_NE(0, std::memcmp(params.data(), with->model().params(), n * sizeof(float)));
    EXPECT_EQ(*loss, *without->Step());
  }
  EXPECT_EQ(0, std::memcmp(with->model().params(), without->model().params(), n * sizeof(float)));
}

}  // namespace
}  // namespace troupe::model
