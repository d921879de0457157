#include "troupe/runtime/config.h"

#include <gtest/gtest.h>

#include <map>

#include "troupe/runtime/cluster.h"

namespace troupe::runtime {
namespace {

struct Fixture {
  int64_t threads = 2;
  double ratio = 0.5;
  bool verbose = false;
  std::string mode = "fast";
  Duration timeout = std::chrono::seconds(1);
  int64_t memory = 0;
  ConfigRegistry reg;
  Fixture() {
    reg.AddInt("threads", &threads, "threads", AtLeast(1));
    reg.AddDouble("ratio", &ratio, "ratio");
    reg.AddBool("verbose", &verbose, "verbose");
    reg.AddString("mode", &mode, "mode", OneOf({"fast", "deterministic"}));
    reg.AddDuration("timeout", &timeout, "timeout", Positive());
    reg.AddByteSize("memory", &memory, "memory");
  }
};

TEST(ConfigTest, DefaultsThenEnvironmentThenFlags) {
  Fixture f;
  std::map<std::string, std::string> env = {{"TROUPE_THREADS", "4"},
                                            {"TROUPE_MODE", "deterministic"}};
  ASSERT_TRUE(f.reg
                  .LoadEnvironment([&](const char* n) -> const char* {
                    auto it = env.find(n);
                    return it == env.end() ? nullptr : it->second.c_str();
                  })
                  .ok());
  EXPECT_EQ(f.threads, 4);
  EXPECT_EQ(f.mode, "deterministic");
  const char* argv[] = {"prog",      "--threads=8", "job.toml",    "--verbose",
                        "--timeout", "250ms",       "--memory=8G", "--other=1"};
  std::vector<std::string> rest;
  ASSERT_TRUE(f.reg.ParseFlags(8, argv, &rest).ok());
  EXPECT_EQ(f.threads, 8);
  EXPECT_TRUE(f.verbose);
  EXPECT_EQ(f.timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(f.memory, 8LL << 30);
  EXPECT_EQ(rest, (std::vector<std::string>{"job.toml", "--other=1"}));
  EXPECT_EQ(f.reg.Get("timeout"), "250ms");
}

TEST(ConfigTest, InvalidValuesNameTheOptionSourceAndExpectation) {
  Fixture f;
  absl::Status s = f.reg.Set("threads", "0");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'threads'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("expected at least 1"), std::string::npos) << s;
  EXPECT_EQ(f.threads, 2) << "a rejected value must not be applied";

  s = f.reg.Set("threads", "many");
  EXPECT_NE(s.message().find("expected an integer"), std::string::npos) << s;

  s = f.reg.Set("mode", "turbo");
  EXPECT_NE(s.message().find("expected one of fast, deterministic"), std::string::npos) << s;

  s = f.reg.Set("timeout", "5 parsecs");
  EXPECT_NE(s.message().find("duration"), std::string::npos) << s;

  s = f.reg.Set("nope", "1");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown option 'nope'"), std::string::npos) << s;

  const char* argv[] = {"prog", "--ratio=x"};
  s = f.reg.ParseFlags(2, argv, nullptr);
  EXPECT_NE(s.message().find("flag --ratio"), std::string::npos) << s;

  s = f.reg.LoadEnvironment([](const char* n) -> const char* {
    return std::string(n) == "TROUPE_VERBOSE" ? "maybe" : nullptr;
  });
  EXPECT_NE(s.message().find("environment variable TROUPE_VERBOSE"), std::string::npos) << s;

  const char* missing[] = {"prog", "--threads"};
  s = f.reg.ParseFlags(2, missing, nullptr);
  EXPECT_NE(s.message().find("expected a value"), std::string::npos) << s;
}

TEST(ConfigTest, ParsersAndHelp) {
  EXPECT_EQ(*ParseDuration("2s"), std::chrono::seconds(2));
  EXPECT_EQ(*ParseDuration("1.5ms"), std::chrono::microseconds(1500));
  EXPECT_FALSE(ParseDuration("ms").ok());
  EXPECT_EQ(*ParseByteSize("512M"), 512LL << 20);
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_FALSE(ParseByteSize("-1").ok());
  Fixture f;
  std::string help = f.reg.Help();
  EXPECT_NE(help.find("--threads=<int>"), std::string::npos);
  EXPECT_NE(help.find("TROUPE_THREADS"), std::string::npos);
  const char* argv[] = {"prog", "--no-verbose", "--troupe.threads=3"};
  f.verbose = true;
  ASSERT_TRUE(f.reg.ParseFlags(3, argv, nullptr).ok());
  EXPECT_FALSE(f.verbose);
  EXPECT_EQ(f.threads, 3);
}

TEST(ConfigTest, ListsTakeItemsUntilTheNextFlagAddUpAndReplaceTheEnvironment) {
  std::vector<std::string> inputs, chaos;
  int64_t vocab = 0;
  ConfigRegistry reg;
  reg.AddStringList("input", &inputs, "files");
  reg.AddStringList("chaos", &chaos, "faults", [](const std::string& v) {
    return v.find('@') != std::string::npos ? std::string() : std::string("expected KIND@STEP");
  });
  reg.AddInt("vocab", &vocab, "vocab");
  ASSERT_TRUE(reg.LoadEnvironment([](const char* n) -> const char* {
                   return std::string(n) == "TROUPE_INPUT" ? "env1,env2" : nullptr;
                 })
                  .ok());
  EXPECT_EQ(inputs, (std::vector<std::string>{"env1", "env2"}));
  EXPECT_EQ(reg.Get("input"), "env1,env2");
  const char* argv[] = {"prog", "--input",     "a",       "b,c", "--vocab",
                        "300",  "--chaos=x@1", "--chaos", "y@2", "--input=d"};
  std::vector<std::string> rest;
  ASSERT_TRUE(reg.ParseFlags(10, argv, &rest).ok());
  EXPECT_EQ(inputs, (std::vector<std::string>{"a", "b,c", "d"})) << "flags replace the env's";
  EXPECT_EQ(chaos, (std::vector<std::string>{"x@1", "y@2"}));
  EXPECT_EQ(vocab, 300);
  EXPECT_TRUE(rest.empty());
  EXPECT_NE(reg.Help().find("--chaos=<list>"), std::string::npos) << reg.Help();

  const char* bad[] = {"prog", "--chaos", "boom"};
  absl::Status s = reg.ParseFlags(3, bad, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("option 'chaos' (list, from flag --chaos): got 'boom': expected "
                             "KIND@STEP"),
            std::string::npos)
      << s;
  const char* empty[] = {"prog", "--input", "--vocab", "3"};
  s = reg.ParseFlags(4, empty, nullptr);
  EXPECT_NE(s.message().find("expected a value"), std::string::npos) << s;
  ASSERT_TRUE(reg.Set("chaos", "a@1").ok());
  s = reg.Set("chaos", "z@3,nope");
  EXPECT_NE(s.message().find("item 'nope': expected KIND@STEP"), std::string::npos) << s;
  EXPECT_EQ(chaos, (std::vector<std::string>{"a@1"})) << "a rejected list must not be applied";
}

// The embedded cluster's heartbeat timeout grows with the processes per vCPU (issue 45: 64
// workers on 2 vCPUs were fenced by the dozen at 1 s), never shrinks a longer one.
TEST(ClusterOptionsTest, SharedHostHeartbeatTimeoutGrowsWithProcessesPerVcpu) {
  auto timeout = [](int processes, int vcpus, Duration configured = std::chrono::seconds(1)) {
    ClusterOptions o;
    o.heartbeat_timeout = configured;
    o.ScaleForSharedHost(processes, vcpus);
    return std::chrono::duration_cast<std::chrono::milliseconds>(o.heartbeat_timeout).count();
  };
  EXPECT_EQ(timeout(12, 2), 1000) << "the 4-worker job";
  EXPECT_EQ(timeout(16, 2), 1000);
  EXPECT_EQ(timeout(18, 2), 2000);
  EXPECT_EQ(timeout(68, 2), 5000) << "32 workers";
  EXPECT_EQ(timeout(132, 2), 9000) << "64 workers";
  EXPECT_EQ(timeout(132, 16), 2000);
  EXPECT_EQ(timeout(132, 0), 17000) << "no vCPU count: taken as one";
  EXPECT_EQ(timeout(12, 2, std::chrono::seconds(30)), 30000);
}

}  // namespace
}  // namespace troupe::runtime
