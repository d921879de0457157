#include "troupe/model/data_source.h"

#include <gtest/gtest.h>

#include <set>

#include "test_files.h"

namespace troupe::model {
namespace {

class DataSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    // Two shards: 10 samples of 4+1 tokens and 7 samples (+3 leftover tokens). Token = position.
    std::vector<int32_t> a(50), b(38);
    for (int i = 0; i < 50; ++i) a[i] = i;
    for (int i = 0; i < 38; ++i) b[i] = 100 + i;
    ASSERT_TRUE(WriteTokenShard(dir_ + "/a.tok", a, 200).ok());
    ASSERT_TRUE(WriteTokenShard(dir_ + "/b.tok", b, 200).ok());
    options_ = {/*seq_len=*/4, /*microbatch_size=*/2, /*microbatches_per_step=*/3, /*seed=*/11};
  }
  absl::StatusOr<DataSource> Open() {
    return DataSource::Open({dir_ + "/a.tok", dir_ + "/b.tok"}, 200, options_);
  }
  std::string dir_;
  DataSourceOptions options_;
};

TEST_F(DataSourceTest, EveryEpochVisitsEverySampleOnceInASeededOrder) {
  auto ds = Open();
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ(ds->num_samples(), 17);
  // 17 samples, 6 per step: slots of epoch e are g in [17e, 17e + 17).
  std::vector<int64_t> order;
  for (int64_t step = 0; step < 12; ++step) {
    for (int k = 0; k < 3; ++k) {
      for (int r = 0; r < 2; ++r) order.push_back(ds->SampleIndex(step, k, r));
    }
  }
  std::set<int64_t> epoch0(order.begin(), order.begin() + 17),
      epoch1(order.begin() + 17, order.begin() + 34);
  EXPECT_EQ(epoch0.size(), 17u);
  EXPECT_EQ(epoch1.size(), 17u);
  EXPECT_NE(std::vector<int64_t>(order.begin(), order.begin() + 17),
            std::vector<int64_t>(order.begin() + 17, order.begin() + 34));
}

TEST_F(DataSourceTest, MicrobatchIsAPureFunctionOfSeedStepAndIndex) {
  auto ds1 = Open();
  auto ds2 = Open();
  Microbatch x, y;
  ASSERT_TRUE(ds1->Get(5, 2, &x).ok());
  ASSERT_TRUE(ds1->Get(0, 0, &y).ok());  // other calls in between change nothing
  ASSERT_TRUE(ds2->Get(5, 2, &y).ok());
  EXPECT_EQ(x.inputs, y.inputs);
  EXPECT_EQ(x.targets, y.targets);
  // Targets are the inputs shifted by one, from one contiguous sample.
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < 4; ++t) EXPECT_EQ(x.targets[r * 4 + t], x.inputs[r * 4 + t] + 1);
    const int64_t s = x.samples[r];
    const int32_t first = s < 10 ? s * 5 : 100 + (s - 10) * 5;
    EXPECT_EQ(x.inputs[r * 4], first);
  }
  options_.seed = 12;
  auto other_seed = Open();
  int differ = 0;
  for (int step = 0; step < 4; ++step) {
    differ += ds1->SampleIndex(step, 0, 0) != other_seed->SampleIndex(step, 0, 0);
  }
  EXPECT_GT(differ, 0);
}

TEST_F(DataSourceTest, BadArgumentsAndShardsAreReported) {
  auto ds = Open();
  Microbatch mb;
  EXPECT_EQ(ds->Get(0, 3, &mb).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ds->Get(-1, 0, &mb).code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = DataSource::Open({dir_ + "/a.tok"}, 300, options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a.tok: vocab_size: expected 300, got 200"), absl::string_view::npos)
      << s;
  options_.seq_len = 60;  // longer than any shard
  EXPECT_EQ(Open().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataSource::Open({dir_ + "/none.tok"}, 200, options_).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace troupe::model
