// Runs the built `troupe` binary: `troupe data prepare` on a small corpus, and its usage errors.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <fstream>
#include <string>

#include "troupe/model/token_shard.h"
#include "troupe/model/tokenizer.h"

namespace troupe::tools {
namespace {

int RunTroupe(const std::string& args) {
  const std::string cmd = std::string(TROUPE_BINARY) + " " + args + " >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(DataPrepareCommandTest, WritesTokenizerAndShards) {
  char tmpl[] = "/tmp/troupe_tools_test_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  {
    std::ofstream in(dir + "/a.txt");
    for (int i = 0; i < 60; ++i) in << "A fortune about cats, number " << i << ".\n%\n";
  }
  {
    std::ofstream in(dir + "/b.txt");
    for (int i = 0; i < 30; ++i) in << "Dogs bark at " << i << " o'clock.\n%\n";
  }
  ASSERT_EQ(RunTroupe("data prepare --input " + dir + "/a.txt " + dir + "/b.txt --out " + dir +
                      "/out --vocab 300"),
            0);
  auto tok = model::BpeTokenizer::Load(dir + "/out/tokenizer.bin");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 300);
  auto train = model::TokenShard::Open(dir + "/out/train-00000.tok", 300);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_GT((*train)->size(), 100);
  EXPECT_TRUE(model::TokenShard::Open(dir + "/out/val-00000.tok", 300).ok());
}

TEST(DataPrepareCommandTest, UsageErrorsAndMissingInputFail) {
  EXPECT_EQ(RunTroupe(""), 2);
  EXPECT_EQ(RunTroupe("nonsense"), 2);
  EXPECT_EQ(RunTroupe("data prepare --out /tmp/x --vocab 300"), 2);            // no --input
  EXPECT_EQ(RunTroupe("data prepare --input a --out /tmp/x --vocab ten"), 2);  // bad number
  EXPECT_EQ(RunTroupe("data prepare --input /nonexistent/file --out /tmp/x --vocab 300"), 1);
  EXPECT_EQ(RunTroupe("data prepare --input /etc/hostname --out /tmp/x --vocab 100"), 1);  // < 257
  EXPECT_EQ(RunTroupe("help"), 0);
}

}  // namespace
}  // namespace troupe::tools
