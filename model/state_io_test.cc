#include "troupe/model/state_io.h"

#include <gtest/gtest.h>

#include "test_files.h"
#include "troupe/model/rng.h"

namespace troupe::model {
namespace {

class StateIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    config_ = {37, 9, 2, 3, 6};
    const int64_t n = ParamLayout(config_).total_size();
    for (auto* v : {&params_, &m_, &v_}) v->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      params_[i] = NormalFloat(1, RngPurpose::kTest, 0, i);
      m_[i] = NormalFloat(1, RngPurpose::kTest, 1, i);
      v_[i] = 1.0f + NormalFloat(1, RngPurpose::kTest, 2, i) * 0.1f;
    }
    path_ = dir_ + "/state.bin";
    ASSERT_TRUE(SaveState(path_, {config_, 17, 99, params_.data(), m_.data(), v_.data()}).ok());
  }
  std::string dir_, path_;
  GptConfig config_;
  std::vector<float> params_, m_, v_;
};

TEST_F(StateIoTest, RoundTripsExactly) {
  absl::StatusOr<LoadedState> s = LoadState(path_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->config, config_);
  EXPECT_EQ(s->step, 17);
  EXPECT_EQ(s->seed, 99u);
  EXPECT_EQ(s->params, params_);
  EXPECT_EQ(s->adam_m, m_);
  EXPECT_EQ(s->adam_v, v_);
  ASSERT_TRUE(SaveState(path_, {config_, 3, 4, params_.data(), nullptr, nullptr}).ok());
  s = LoadState(path_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->adam_m.empty());
}

TEST_F(StateIoTest, FlippedPayloadByteIsDataLossNamingTheFile) {
  std::string bytes = testing::ReadBytes(path_);
  bytes[100] ^= 0x01;
  testing::WriteBytes(path_, bytes);
  absl::Status s = LoadState(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(path_), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("CRC32C"), absl::string_view::npos) << s;
}

TEST_F(StateIoTest, TruncatedWrongMagicAndWrongVersionAreRejected) {
  const std::string good = testing::ReadBytes(path_);
  testing::WriteBytes(path_, good.substr(0, good.size() - 4));
  absl::Status s = LoadState(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("expected"), absl::string_view::npos) << s;
  testing::WriteBytes(path_, good.substr(0, 40));
  EXPECT_EQ(LoadState(path_).status().code(), absl::StatusCode::kDataLoss);
  std::string bad = good;
  bad[0] = 'X';
  testing::WriteBytes(path_, bad);
  s = LoadState(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("magic"), absl::string_view::npos) << s;
  bad = good;
  bad[8] = 2;  // version 2
  testing::WriteBytes(path_, bad);
  s = LoadState(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("version: expected 1, got 2"), absl::string_view::npos) << s;
  EXPECT_EQ(LoadState(dir_ + "/missing.bin").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StateIoTest, InconsistentConfigIsRejected) {
  GptConfig bad = config_;
  bad.width = 7;  // not a multiple of 3 heads
  EXPECT_EQ(SaveState(path_, {bad, 0, 0, params_.data(), nullptr, nullptr}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::model
