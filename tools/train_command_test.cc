// `troupe train` reads its flags through the runtime's ConfigRegistry like every role: each option
// works as a flag and as a TROUPE_* variable, the TLS options reach the driver's runtime, and a bad
// value is refused naming the option, where it came from, what was expected and what was got.
// No cluster is started: the driver stops where the option under test shows.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "shell_test_util.h"
#include "troupe/train/trainable.h"

namespace troupe::tools {
namespace {

// Runs `env troupe args` through the shell; returns the exit status, with its output in *out.
int Troupe(const std::string& env, const std::string& args, std::string* out) {
  // `timeout` bounds every run: nothing here may wait for a cluster.
  return Shell("env " + env + " timeout 60 " + TROUPE_BINARY + " " + args, out);
}

class TrainCommandTest : public ::testing::Test {
 protected:
  // A small tokenized corpus, so the driver gets as far as its runtime without the fortunes.
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/troupe_train_command_test_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    {
      std::ofstream in(dir_ + "/corpus.txt");
      for (int i = 0; i < 200; ++i) in << "A fortune about cats and dogs, number " << i << ".\n%\n";
    }
    std::string out;
    ASSERT_EQ(
        Troupe("",
               "data prepare --input " + dir_ + "/corpus.txt --out " + dir_ + "/data --vocab 300",
               &out),
        0)
        << out;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  // Flags every run shares: the prepared data and a fresh work dir.
  static std::string Common() { return "--data_dir " + dir_ + "/data --work_dir " + dir_ + "/w"; }

  static std::string dir_;
};

std::string TrainCommandTest::dir_;

TEST_F(TrainCommandTest, HelpListsTheTlsAndJobOptionsWithTheirVariables) {
  std::string out;
  ASSERT_EQ(Troupe("", "train --help", &out), 0) << out;
  for (const char* want : {"usage: troupe train", "--tls_ca=<string>", "TROUPE_TLS_CA",
                           "--tls_cert=<string>", "--tls_key=<string>", "--head=<string>",
                           "--chaos=<list>", "kill-worker@S", "--steps=<int>", "--report"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  }
}

TEST_F(TrainCommandTest, HeadComesFromTheFlagOrTheEnvironment) {
  std::string out;
  // Port 1 refuses at once: reaching it shows where the driver went.
  EXPECT_EQ(Troupe("", "train --head 127.0.0.1:1 " + Common(), &out), 1) << out;
  EXPECT_NE(out.find("cannot reach 127.0.0.1:1"), std::string::npos) << out;
  EXPECT_EQ(Troupe("TROUPE_HEAD=127.0.0.1:1", "train " + Common(), &out), 1) << out;
  EXPECT_NE(out.find("cannot reach 127.0.0.1:1"), std::string::npos) << out;
}

TEST_F(TrainCommandTest, TlsFilesReachTheDriverFromTheFlagsOrTheEnvironment) {
  std::string out;
  // The driver's runtime checks the files before it dials: the message names the CA file given.
  const std::string missing =
      " /nonexistent/ca.pem --tls_cert /nonexistent/driver.pem --tls_key "
      "/nonexistent/driver.key";
  EXPECT_EQ(Troupe("", "train --head 127.0.0.1:1 --tls_ca" + missing + " " + Common(), &out), 1)
      << out;
  EXPECT_NE(out.find("--tls_ca '/nonexistent/ca.pem': cannot open"), std::string::npos) << out;
  EXPECT_EQ(out.find("cannot reach"), std::string::npos) << out;

  EXPECT_EQ(Troupe("TROUPE_TLS_CA=/nonexistent/env-ca.pem TROUPE_TLS_CERT=/nonexistent/d.pem "
                   "TROUPE_TLS_KEY=/nonexistent/d.key",
                   "train --head 127.0.0.1:1 " + Common(), &out),
            1)
      << out;
  EXPECT_NE(out.find("--tls_ca '/nonexistent/env-ca.pem': cannot open"), std::string::npos) << out;

  EXPECT_EQ(Troupe("", "train --head 127.0.0.1:1 --tls_ca /nonexistent/ca.pem " + Common(), &out),
            1)
      << out;
  EXPECT_NE(out.find("tls_ca, tls_cert and tls_key: expected all three or none"), std::string::npos)
      << out;
}

TEST_F(TrainCommandTest, BadValuesNameTheOptionTheSourceTheExpectationAndTheValue) {
  std::string out;
  EXPECT_EQ(Troupe("", "train --workers 0", &out), 2) << out;
  EXPECT_NE(out.find("option 'workers' (int, from flag --workers): got '0': expected at least 1"),
            std::string::npos)
      << out;
  EXPECT_EQ(Troupe("TROUPE_STEPS=many", "train", &out), 2) << out;
  EXPECT_NE(out.find("option 'steps' (int, from environment variable TROUPE_STEPS): got 'many': "
                     "expected an integer"),
            std::string::npos)
      << out;
  EXPECT_EQ(Troupe("", "train --head nowhere", &out), 2) << out;
  EXPECT_NE(out.find("option 'head' (string, from flag --head): got 'nowhere': expected "
                     "HOST:PORT"),
            std::string::npos)
      << out;
  EXPECT_EQ(Troupe("TROUPE_CHAOS=kill-worker@3,explode@4", "train", &out), 2) << out;
  EXPECT_NE(out.find("option 'chaos' (list, from environment variable TROUPE_CHAOS): got "
                     "'kill-worker@3,explode@4': item 'explode@4'"),
            std::string::npos)
      << out;
  EXPECT_EQ(Troupe("", "train --chaos", &out), 2) << out;
  EXPECT_NE(out.find("option 'chaos' (list, from flag --chaos): expected a value"),
            std::string::npos)
      << out;
  EXPECT_EQ(Troupe("", "train --tls-ca x", &out), 2) << out;
  EXPECT_NE(out.find("unexpected argument '--tls-ca'"), std::string::npos) << out;
}

// More workers than the spec allows is refused, never trained with fewer (issue 45: 32 workers
// once trained 8 ranks without a word).
TEST_F(TrainCommandTest, WorkersAboveTheSpecsCeilingAreRefusedNotClamped) {
  std::string out;
  EXPECT_EQ(Troupe("", "train --workers 32 " + Common(), &out), 2) << out;
  EXPECT_NE(out.find("--workers 32: above [elastic] max_workers (8) of the default spec"),
            std::string::npos)
      << out;
  const std::string spec = dir_ + "/wide.toml";
  std::ofstream(spec) << "[elastic]\nmax_workers = 32\n";
  EXPECT_EQ(Troupe("", "train --workers 32 --spec " + spec + " " + Common(), &out), 2) << out;
  EXPECT_NE(out.find("elastic.workers: expected at most model.microbatches × pipeline.stages (8 × "
                     "1): every worker computes at least one microbatch of a stage, got 32"),
            std::string::npos)
      << out;
}

// A job that asks for a GPU on a machine without a usable one fails before any process starts,
// naming the CUDA runtime's error (cudaErrorInsufficientDriver where the driver is missing).
TEST_F(TrainCommandTest, ACudaModelWithoutAUsableDeviceFailsFastNamingTheCudaError) {
  const absl::Status usable = train::CheckDeviceUsable({train::Device::Kind::kCuda, 0});
  if (usable.ok()) GTEST_SKIP() << "a CUDA device is usable here: scripts/gpu-check covers it";
  {
    std::ofstream spec(dir_ + "/cuda.toml");
    spec << "[job]\nsteps = 3\n[model]\ndevice = \"cuda\"\n";
  }
  std::string out;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(Troupe("", "train --spec " + dir_ + "/cuda.toml " + Common(), &out), 0) << out;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0) << out;
  EXPECT_NE(out.find("model.device = \"cuda\""), std::string::npos) << out;
  // The CUDA runtime's error name, as CheckDeviceUsable saw it on this machine.
  const std::string reason(usable.message());
  const size_t name = reason.find("cudaError");
  ASSERT_NE(name, std::string::npos) << reason;
  EXPECT_NE(out.find(reason.substr(name, reason.find(' ', name) - name)), std::string::npos) << out;
  std::printf("troupe train with device = \"cuda\" here: %.2f s, %s", seconds, out.c_str());
}

}  // namespace
}  // namespace troupe::tools
