#include "troupe/model/token_shard.h"

#include <gtest/gtest.h>

#include "test_files.h"
#include "troupe/model/crc32c.h"

namespace troupe::model {
namespace {

class TokenShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    path_ = dir_ + "/shard.tok";
    for (int i = 0; i < 1001; ++i) tokens_.push_back((i * 7919) % 511);
    ASSERT_TRUE(WriteTokenShard(path_, tokens_, 512).ok());
  }
  absl::Status OpenStatus(int32_t vocab = 512) { return TokenShard::Open(path_, vocab).status(); }
  void ExpectError(absl::StatusCode code, const std::string& needle) {
    const absl::Status s = OpenStatus();
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find(path_), absl::string_view::npos) << s;
  }
  std::string dir_, path_;
  std::vector<int32_t> tokens_;
};

TEST_F(TokenShardTest, RoundTripsThroughMmapWithUint16AndUint32) {
  auto shard = TokenShard::Open(path_, 512);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_EQ((*shard)->size(), 1001);
  for (int i = 0; i < 1001; ++i) ASSERT_EQ((*shard)->token(i), tokens_[i]);
  EXPECT_EQ(testing::ReadBytes(path_).size(), kTokenShardHeaderSize + 2 * 1001);
  std::vector<int32_t> big = {0, 70000, 99999};
  ASSERT_TRUE(WriteTokenShard(path_, big, 100000).ok());
  auto wide = TokenShard::Open(path_, 0);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ((*wide)->token(1), 70000);
}

TEST_F(TokenShardTest, TruncatedShardIsDataLossWithExpectedAndActualSize) {
  const std::string bytes = testing::ReadBytes(path_);
  testing::WriteBytes(path_, bytes.substr(0, bytes.size() - 3));
  ExpectError(absl::StatusCode::kDataLoss, "expected 2034 bytes for 1001 tokens, got 2031");
  testing::WriteBytes(path_, bytes.substr(0, 10));
  ExpectError(absl::StatusCode::kDataLoss, "truncated header");
}

TEST_F(TokenShardTest, WrongMagicVersionAndVocabAreInvalidArgument) {
  const std::string good = testing::ReadBytes(path_);
  std::string bad = good;
  bad.replace(0, 8, "GARBAGE!");
  testing::WriteBytes(path_, bad);
  ExpectError(absl::StatusCode::kInvalidArgument, "magic: expected \"TRPTOKEN\"");
  bad = good;
  bad[8] = 9;
  testing::WriteBytes(path_, bad);
  ExpectError(absl::StatusCode::kInvalidArgument, "version: expected 1, got 9");
  testing::WriteBytes(path_, good);
  const absl::Status s = OpenStatus(1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("vocab_size: expected 1000, got 512"), absl::string_view::npos) << s;
}

TEST_F(TokenShardTest, CorruptPayloadIsDataLoss) {
  std::string bad = testing::ReadBytes(path_);
  bad[kTokenShardHeaderSize + 5] ^= 0x10;
  testing::WriteBytes(path_, bad);
  ExpectError(absl::StatusCode::kDataLoss, "CRC32C");
}

TEST_F(TokenShardTest, TokenIdAtOrAboveVocabIsRejected) {
  EXPECT_EQ(WriteTokenShard(path_, {1, 512}, 512).code(), absl::StatusCode::kInvalidArgument);
  // A shard written for a larger vocabulary whose header then claims 512 (checksum still valid).
  ASSERT_TRUE(WriteTokenShard(path_, {1, 2, 600, 3}, 1000).ok());
  std::string bytes = testing::ReadBytes(path_);
  const uint32_t vocab = 512;
  bytes.replace(16, 4, reinterpret_cast<const char*>(&vocab), 4);
  testing::WriteBytes(path_, bytes);
  ExpectError(absl::StatusCode::kInvalidArgument, "token[2]: expected an id below 512, got 600");
}

}  // namespace
}  // namespace troupe::model
