// `troupe chaos run` as a user runs it, bounded: a fixed seed, a few trials of a short tiny-GPT
// job. A passing run's report has every trial with its schedule, outcome and recoveries and
// exits 0; a run whose (user-given) invariant fails exits 1, keeps the trial, draws its timeline
// and shrinks the schedule to the reproducing `troupe train` command.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "nlohmann/json.hpp"
#include "shell_test_util.h"

namespace troupe::tools {
namespace {

using json = nlohmann::json;

class ChaosCommandTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/troupe_chaos_command_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    {
      std::ofstream in(dir_ + "/corpus.txt");
      for (int i = 0; i < 200; ++i) in << "A fortune about cats and dogs, number " << i << ".\n%\n";
    }
    std::string out;
    ASSERT_EQ(Shell(std::string(TROUPE_BINARY) + " data prepare --input " + dir_ +
                        "/corpus.txt --out " + dir_ + "/data --vocab 300",
                    &out),
              0)
        << out;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  // `troupe chaos run` on a 12-step job of 3 workers, bounded by `timeout` (SIGINT: the runner
  // stops its trial and removes a lab).
  static int Chaos(const std::string& report, const std::string& extra, std::string* out) {
    return Shell(std::string("timeout -s INT 240 ") + TROUPE_BINARY +
                     " chaos run --steps 12 --workers 3 --data_dir " + dir_ + "/data --report " +
                     dir_ + "/" + report + " " + extra,
                 out);
  }
  static json Report(const std::string& report) {
    std::ifstream in(dir_ + "/" + report + "/report.json");
    return json::parse(in, nullptr, /*allow_exceptions=*/false);
  }

  static std::string dir_;
};

std::string ChaosCommandTest::dir_;

TEST_F(ChaosCommandTest, TrialsThatHoldGiveAReportAndExitZero) {
  std::string out;
  ASSERT_EQ(
      Chaos("pass", "--seed 3 --trials 2 --faults kill-worker,stop-worker --max-faults 2", &out), 0)
      << out;
  EXPECT_NE(out.find("summary: trials=2 failed=0"), std::string::npos) << out;
  const json r = Report("pass");
  ASSERT_FALSE(r.is_discarded()) << out;
  EXPECT_EQ(r["seed"], 3);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["kinds"], json({"kill-worker", "stop-worker"}));
  for (const char* inv :
       {"exit", "weights", "exactly-once", "steps-lost", "recovery", "leftovers"}) {
    EXPECT_NE(std::find(r["invariants"].begin(), r["invariants"].end(), inv), r["invariants"].end())
        << inv;
  }
  ASSERT_EQ(r["trials"].size(), 2u);
  int recoveries = 0;
  for (const json& t : r["trials"]) {
    EXPECT_EQ(t["outcome"], "ok") << t.dump();
    EXPECT_EQ(t["exit_code"], 0) << t.dump();
    EXPECT_EQ(t["steps_lost"], 0) << t.dump();
    EXPECT_GE(t["faults"].get<int>(), 1) << t.dump();
    EXPECT_LE(t["faults"].get<int>(), 2) << t.dump();
    EXPECT_TRUE(t["failures"].empty()) << t.dump();
    for (const json& rec : t["recovery"]) {
      ++recoveries;
      EXPECT_GT(rec["seconds"].get<double>(), 0) << t.dump();
    }
  }
  // Every fault of these kinds is a failure the job recovers from, measured.
  EXPECT_GE(recoveries, 2) << r.dump(2);
  // A trial that held leaves only its line in the report.
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/pass/trial-0")) << out;
}

TEST_F(ChaosCommandTest, AFailingInvariantExitsOneAndIsShrunkToTheReproducingCommand) {
  std::string out;
  ASSERT_EQ(Chaos("fail",
                  "--seed 5 --trials 1 --faults kill-worker --max-faults 2 --shrink-budget 3 "
                  "--invariant 'test ! -d \"$TROUPE_CHAOS_WORK_DIR/ckpt\"'",
                  &out),
            1)
      << out;
  const json r = Report("fail");
  ASSERT_FALSE(r.is_discarded()) << out;
  EXPECT_EQ(r["failed"], 1);
  const json& t = r["trials"][0];
  EXPECT_EQ(t["outcome"], "failed");
  ASSERT_EQ(t["failures"].size(), 1u) << t.dump();
  EXPECT_EQ(t["failures"][0]["invariant"], "user") << t.dump();
  // Every job checkpoints: the invariant fails without any fault, so the schedule shrinks to none.
  EXPECT_EQ(t["shrunk"]["schedule"], "(none)") << t.dump();
  EXPECT_EQ(t["shrunk"]["faults"], 0) << t.dump();
  EXPECT_NE(t["shrunk"]["command"].get<std::string>().find("troupe train --spec "),
            std::string::npos)
      << t.dump();
  EXPECT_TRUE(std::filesystem::exists(t["timeline"].get<std::string>())) << t.dump();
  EXPECT_NE(out.find("reproduce with:"), std::string::npos) << out;
}

// --lab: each trial on a fresh lab of namespaced hosts (here 2 worker hosts and the head's). A
// partition of a worker's host (carried out by its node agent) and then a kill -9 of the head
// (the runner's to carry out, once step 4 is committed; 40 steps, so the job is still running
// then: one that ended first is not carried out) hold every invariant — the agent's log
// says it cut its host off, the runner's record says the head was killed and came back — and no
// namespace or state of the lab is left.
TEST_F(ChaosCommandTest, OnALabAPartitionedHostAndAKilledHeadHoldAndNoLabIsLeft) {
  std::string out;
  ASSERT_EQ(Chaos("lab",
                  "--lab 2 --steps 40 --trials 1 --schedule 'partition-node@2:1 kill-head@4' "
                  "--invariant "
                  "'grep -q \"chaos: partition of this host\" "
                  "$TROUPE_CHAOS_WORK_DIR/cluster-logs/node-*.txt && grep -q "
                  "\"kill-head after commit .*: done\" $TROUPE_CHAOS_WORK_DIR/head-faults.txt'",
                  &out),
            0)
      << out;
  const json r = Report("lab");
  EXPECT_EQ(r["lab_hosts"], 3) << out;
  ASSERT_EQ(r["trials"].size(), 1u) << out;
  EXPECT_EQ(r["trials"][0]["schedule"], "partition-node@2:1 kill-head@4");
  EXPECT_EQ(r["trials"][0]["outcome"], "ok") << r["trials"][0].dump();
  const std::string said = "on 2 workers (a host each, on lab ";
  const size_t at = out.find(said);
  ASSERT_NE(at, std::string::npos) << out;
  const std::string lab =
      out.substr(at + said.size(), out.find(' ', at + said.size()) - at - said.size());
  EXPECT_EQ(lab.rfind("trlabc", 0), 0u) << lab;
  std::string left;
  Shell("ip netns list; ls /run/troupe-lab 2>/dev/null", &left);
  EXPECT_EQ(left.find(lab), std::string::npos) << left;
}

TEST_F(ChaosCommandTest, AnUnknownFaultKindIsAUsageError) {
  std::string out;
  EXPECT_EQ(Chaos("bad", "--faults kill-worker,explode", &out), 2) << out;
  EXPECT_NE(out.find("unknown fault kind 'explode'"), std::string::npos) << out;
}

}  // namespace
}  // namespace troupe::tools
