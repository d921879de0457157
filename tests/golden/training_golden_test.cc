// Trains the tiny GPT on the Debian `fortunes` corpus for a fixed number of steps on 2 threads:
// the loss falls from about ln(vocab) to below kFinalLossBelow, two runs with the same seed give
// bit-identical loss curves, and the first losses match golden values within a small tolerance
// (other CPU types pick other OpenBLAS kernels, so bits may differ across machines).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "troupe/kernels/parallel.h"
#include "troupe/model/corpus.h"
#include "troupe/model/data_source.h"
#include "troupe/model/trainer.h"

namespace troupe::model {
namespace {

constexpr int32_t kVocab = 512;
constexpr int kSteps = 600;
constexpr double kFinalLossBelow = 4.5;  // mean of the last 10 steps
// Losses of steps 0..9 measured on the reference machine (AMD EPYC, OpenBLAS 0.3.21, 2 threads).
constexpr double kGoldenLosses[] = {6.264437058, 6.199255806, 6.109178598, 6.003670683,
                                    5.889521941, 5.734591087, 5.556048623, 5.467608254,
                                    5.373519365, 5.543445021};
constexpr double kGoldenTolerance = 2e-3;

std::vector<double> TrainOnce(const DataSource& data) {
  TrainerOptions options;
  options.config = GptConfig::Tiny(kVocab);
  options.schedule = {/*max_lr=*/1e-2f, /*min_lr=*/1e-3f, /*warmup_steps=*/10,
                      /*total_steps=*/kSteps};
  options.init_seed = 1234;
  auto trainer = Trainer::Create(options, &data);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    absl::StatusOr<double> loss = trainer->Step();
    EXPECT_TRUE(loss.ok()) << loss.status();
    losses.push_back(*loss);
  }
  return losses;
}

TEST(TrainingGoldenTest, TinyGptLearnsFortunesDeterministically) {
  const std::vector<std::string> files = FortunesCorpusFiles();
  if (files.empty()) GTEST_SKIP() << "Debian package `fortunes` not installed";
  char tmpl[] = "/tmp/troupe_golden_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  absl::StatusOr<PreparedDataset> prepared = PrepareDataset(files, dir, kVocab);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->vocab_size, kVocab);
  auto data = DataSource::Open(prepared->train_shards, kVocab,
                               {/*seq_len=*/64, /*microbatch_size=*/8,
                                /*microbatches_per_step=*/2, /*seed=*/7});
  ASSERT_TRUE(data.ok()) << data.status();

  kernels::SetNumThreads(2);
  const std::vector<double> first = TrainOnce(*data);
  const std::vector<double> second = TrainOnce(*data);
  kernels::SetNumThreads(1);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);  // the shards stay mapped until data goes away
  ASSERT_EQ(first.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    if (s < 12 || s % 10 == 0) std::printf("step %3d loss %.9f\n", s, first[s]);
    ASSERT_EQ(first[s], second[s]) << "runs diverge at step " << s;
  }
  EXPECT_NEAR(first[0], std::log(double(kVocab)), 0.25);
  double tail = 0;
  for (int s = kSteps - 10; s < kSteps; ++s) tail += first[s] / 10;
  std::printf("mean loss of the last 10 steps: %.4f\n", tail);
  EXPECT_LT(tail, kFinalLossBelow);
  for (int s = 0; s < 10; ++s) {
    EXPECT_NEAR(first[s], kGoldenLosses[s], kGoldenTolerance) << "golden loss of step " << s;
  }
}

}  // namespace
}  // namespace troupe::model
