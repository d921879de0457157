#include "troupe/model/tokenizer.h"

#include <gtest/gtest.h>

#include "test_files.h"
#include "troupe/model/corpus.h"

namespace troupe::model {
namespace {

TEST(SplitIntoChunksTest, SpacesJoinTheFollowingWord) {
  EXPECT_EQ(SplitIntoChunks("Hello,  world 42!\n x"),
            (std::vector<std::string>{"Hello", ",", " ", " world", " 42", "!", "\n", " x"}));
  EXPECT_EQ(SplitIntoChunks(""), std::vector<std::string>{});
  EXPECT_EQ(SplitIntoChunks("  "), std::vector<std::string>{"  "});
}

TEST(BpeTokenizerTest, LearnsFrequentPairsDeterministicallyAndRoundTrips) {
  const std::vector<std::string> docs = {"the cat sat on the mat", "the hat", "that is the thing"};
  auto tok = BpeTokenizer::Train(docs, 270);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 270);
  EXPECT_EQ(tok->eot_token(), 269);
  // " t" and "th"/"he" are the most frequent pairs here; the first merge is one of them.
  const auto first = tok->merges()[0];
  EXPECT_EQ(tok->Decode({256}), std::string(1, char(first.first)) + char(first.second));
  auto again = BpeTokenizer::Train(docs, 270);
  EXPECT_EQ(again->merges(), tok->merges());
  for (const auto& s : {std::string("the cat"), std::string("\xff\x00 weird bytes\n\t", 15),
                        std::string("thethethe")}) {
    const auto ids = tok->Encode(s);
    EXPECT_EQ(tok->Decode(ids), s);
  }
  EXPECT_LT(tok->Encode("the the the").size(), 11u);  // merges shorten common text
}

TEST(BpeTokenizerTest, SaveLoadRoundTripsAndDamageIsReported) {
  const std::string dir = testing::MakeTempDir();
  auto tok = BpeTokenizer::Train({"abababab cdcdcd abab"}, 262);
  ASSERT_TRUE(tok.ok());
  const std::string path = dir + "/tok.bin";
  ASSERT_TRUE(tok->Save(path).ok());
  auto loaded = BpeTokenizer::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->merges(), tok->merges());
  std::string bytes = testing::ReadBytes(path);
  bytes[8] = 7;
  testing::WriteBytes(path, bytes);
  absl::Status s = BpeTokenizer::Load(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("version: expected 1, got 7"), absl::string_view::npos) << s;
  bytes[8] = 1;
  bytes[bytes.size() - 1] ^= 1;
  testing::WriteBytes(path, bytes);
  EXPECT_EQ(BpeTokenizer::Load(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(BpeTokenizer::Train({"x"}, 100).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BpeTokenizerTest, CompressesTheFortunesCorpus) {
  const auto files = FortunesCorpusFiles();
  if (files.empty()) GTEST_SKIP() << "Debian package `fortunes` not installed";
  auto docs = ReadDocuments({files[0]});
  ASSERT_TRUE(docs.ok()) << docs.status();
  auto tok = BpeTokenizer::Train(*docs, 512);
  ASSERT_TRUE(tok.ok());
  int64_t bytes = 0, tokens = 0;
  for (const auto& d : *docs) {
    const auto ids = tok->Encode(d);
    ASSERT_EQ(tok->Decode(ids), d);
    bytes += d.size();
    tokens += ids.size();
  }
  EXPECT_GT(static_cast<double>(bytes) / tokens, 1.7) << bytes << " bytes, " << tokens << " tokens";
}

}  // namespace
}  // namespace troupe::model
