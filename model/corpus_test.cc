#include "troupe/model/corpus.h"

#include <gtest/gtest.h>

#include "test_files.h"
#include "troupe/model/token_shard.h"
#include "troupe/model/tokenizer.h"

namespace troupe::model {
namespace {

TEST(CorpusTest, PercentLinesSeparateDocuments) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteBytes(dir + "/f", "one\nline\n%\ntwo\n%\n%\nthree");
  auto docs = ReadDocuments({dir + "/f"});
  ASSERT_TRUE(docs.ok());
  EXPECT_EQ(*docs, (std::vector<std::string>{"one\nline\n", "two\n", "three"}));
}

TEST(CorpusTest, PrepareWritesTokenizerAndShardsThatDecodeBackToTheText) {
  const std::string dir = testing::MakeTempDir();
  std::string text;
  for (int i = 0; i < 40; ++i) text += "Fortune number " + std::to_string(i) + " says hello.\n%\n";
  testing::WriteBytes(dir + "/in", text);
  auto ds = PrepareDataset({dir + "/in"}, dir + "/out", 300);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->documents, 40);
  auto tok = BpeTokenizer::Load(ds->tokenizer_path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), ds->vocab_size);
  auto train = TokenShard::Open(ds->train_shards[0], ds->vocab_size);
  ASSERT_TRUE(train.ok()) << train.status();
  std::vector<int32_t> ids((*train)->size());
  (*train)->Read(0, ids.size(), ids.data());
  ASSERT_EQ(ids.back(), tok->eot_token());
  std::vector<int32_t> first_doc(ids.begin(), std::find(ids.begin(), ids.end(), tok->eot_token()));
  EXPECT_EQ(tok->Decode(first_doc), "Fortune number 0 says hello.\n");
  EXPECT_EQ(ds->train_tokens + ds->val_tokens, (*train)->size() + ds->val_tokens);
  EXPECT_EQ(PrepareDataset({}, dir + "/out", 300).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrepareDataset({dir + "/missing"}, dir + "/out", 300).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace troupe::model
