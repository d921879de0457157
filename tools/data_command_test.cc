// Runs the built `troupe` binary: `troupe data prepare` on a small corpus, and its usage errors.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "shell_test_util.h"
#include "troupe/model/token_shard.h"
#include "troupe/model/tokenizer.h"

namespace troupe::tools {
namespace {

int RunTroupe(const std::string& args) {
  const std::string cmd = std::string(TROUPE_BINARY) + " " + args + " >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A fresh directory, removed with everything in it when the test ends.
class ScopedDir {
 public:
  ScopedDir() {
    char tmpl[] = "/tmp/troupe_tools_test_XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~ScopedDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(DataPrepareCommandTest, WritesTokenizerAndShards) {
  const ScopedDir scoped;
  const std::string& dir = scoped.path();
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

// Runs `env troupe args` through the shell; returns the exit status, with its output in *out.
int RunTroupeEnv(const std::string& env, const std::string& args, std::string* out) {
  return Shell("env " + env + " " + TROUPE_BINARY + " " + args, out);
}

TEST(DataPrepareCommandTest, OptionsComeFromTroupeVariablesThroughTheConfigRegistry) {
  const ScopedDir scoped;
  const std::string& dir = scoped.path();
  {
    std::ofstream in(dir + "/a.txt");
    for (int i = 0; i < 60; ++i) in << "A fortune about cats, number " << i << ".\n%\n";
  }
  {
    std::ofstream in(dir + "/b.txt");
    for (int i = 0; i < 30; ++i) in << "Dogs bark at " << i << " o'clock.\n%\n";
  }
  std::string out;
  ASSERT_EQ(RunTroupeEnv("TROUPE_INPUT=" + dir + "/a.txt," + dir + "/b.txt TROUPE_OUT=" + dir +
                             "/env TROUPE_VOCAB=280",
                         "data prepare", &out),
            0)
      << out;
  auto tok = model::BpeTokenizer::Load(dir + "/env/tokenizer.bin");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 280);
  // A flag wins over the variable.
  ASSERT_EQ(RunTroupeEnv(
                "TROUPE_VOCAB=280",
                "data prepare --input " + dir + "/a.txt --out " + dir + "/flag --vocab 290", &out),
            0)
      << out;
  tok = model::BpeTokenizer::Load(dir + "/flag/tokenizer.bin");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 290);

  EXPECT_EQ(RunTroupeEnv("TROUPE_VOCAB=0", "data prepare --input a --out /tmp/x", &out), 2);
  EXPECT_NE(out.find("option 'vocab' (int, from environment variable TROUPE_VOCAB): got '0': "
                     "expected a value in [1, 1073741824]"),
            std::string::npos)
      << out;
  EXPECT_EQ(RunTroupeEnv("", "data prepare --input a --out /tmp/x --vocab ten", &out), 2);
  EXPECT_NE(out.find("option 'vocab' (int, from flag --vocab): got 'ten': expected an integer"),
            std::string::npos)
      << out;
  EXPECT_EQ(RunTroupeEnv("", "data prepare --out /tmp/x --vocab 300", &out), 2);
  EXPECT_NE(out.find("option 'input' is required"), std::string::npos) << out;
  EXPECT_EQ(RunTroupeEnv("", "data prepare --help", &out), 0);
  EXPECT_NE(out.find("--input=<list>"), std::string::npos) << out;
  EXPECT_NE(out.find("TROUPE_VOCAB"), std::string::npos) << out;
  std::system(("rm -rf " + dir).c_str());
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
