// `troupe chaos actors` as a user runs it, bounded: a few short trials against the example
// service (examples/service: a supervisor over three workers and a client loop). The robust
// service holds through kills, stops and delays and the runner exits 0 with a report of every
// trial's schedule and the faults its runtime fired; the fragile one (restart intensity 0) fails,
// the runner exits 1 and shrinks the schedule to a command that reproduces the failure by hand;
// bad input is refused naming what is wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"
#include "shell_test_util.h"

namespace troupe::tools {
namespace {

using json = nlohmann::json;

const std::string kWorkers = " --actors worker-1,worker-2,worker-3";

class ChaosActorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/troupe_chaos_actors_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  // `troupe chaos actors` on the service (`service_flags`) for 1.5 s, faults in its first 0.8 s.
  static int Chaos(const std::string& report, const std::string& service_flags,
                   const std::string& extra, std::string* out) {
    return Shell(std::string("timeout -s INT 50 ") + TROUPE_BINARY + " chaos actors --program '" +
                     TROUPE_SERVICE_BINARY + " --seconds 1.5 " + service_flags +
                     "' --window-ms 800 --max-for-ms 600 --timeout-s 20 --report " + dir_ + "/" +
                     report + " " + extra,
                 out);
  }
  static json Report(const std::string& report) {
    std::ifstream in(dir_ + "/" + report + "/report.json");
    return json::parse(in, nullptr, /*allow_exceptions=*/false);
  }

  static std::string dir_;
};

std::string ChaosActorsTest::dir_;

TEST_F(ChaosActorsTest, TheRobustServiceHoldsAndTheReportHasEveryTrial) {
  std::string out;
  ASSERT_EQ(Chaos("robust", "", "--seed 5 --trials 3 --max-faults 3" + kWorkers, &out), 0) << out;
  EXPECT_NE(out.find("summary: trials=3 failed=0"), std::string::npos) << out;
  const json r = Report("robust");
  ASSERT_FALSE(r.is_discarded()) << out;
  EXPECT_EQ(r["seed"], 5);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["kinds"], json({"kill", "stop", "delay"}));
  EXPECT_EQ(r["actors"], json({"worker-1", "worker-2", "worker-3"}));
  ASSERT_EQ(r["trials"].size(), 3u);
  for (const json& t : r["trials"]) {
    EXPECT_EQ(t["outcome"], "held") << t.dump();
    EXPECT_EQ(t["exit_code"], 0) << t.dump();
    std::vector<std::string> schedule;
    std::istringstream words(t["schedule"].get<std::string>());
    for (std::string w; words >> w;) schedule.push_back(w);
    EXPECT_EQ(t["faults"].get<size_t>(), schedule.size()) << t.dump();
    EXPECT_GE(schedule.size(), 1u);
    EXPECT_LE(schedule.size(), 3u);
    // Every fault fired, each once, on an actor of --actors (the service runs past the window).
    std::multiset<std::string> fired;
    for (const json& f : t["fired"]) {
      fired.insert(f["fault"].get<std::string>());
      EXPECT_TRUE(f["result"] == "ok" || f["result"] == "no_actor") << f.dump();
      EXPECT_NE(f["fault"].get<std::string>().find(":worker-"), std::string::npos) << f.dump();
    }
    EXPECT_EQ(fired, std::multiset<std::string>(schedule.begin(), schedule.end())) << t.dump();
  }
  std::ifstream jsonl(dir_ + "/robust/trials.jsonl");
  int lines = 0;
  for (std::string line; std::getline(jsonl, line);) ++lines;
  EXPECT_EQ(lines, 3);
}

// Seed 2's trial 0 under --max-faults 4: four faults, one a kill of a worker (what the
// fragile service cannot survive), shrunk to one or two.
TEST_F(ChaosActorsTest, TheFragileServiceFailsAndIsShrunkToAReproducingCommand) {
  std::string out;
  ASSERT_EQ(Chaos("fragile", "--fragile",
                  "--seed 2 --trials 1 --max-faults 4 --shrink-budget 6" + kWorkers, &out),
            1)
      << out;
  EXPECT_NE(out.find("summary: trials=1 failed=1"), std::string::npos) << out;
  const json r = Report("fragile");
  ASSERT_FALSE(r.is_discarded()) << out;
  ASSERT_EQ(r["trials"].size(), 1u);
  const json& t = r["trials"][0];
  EXPECT_EQ(t["outcome"], "failed") << t.dump();
  EXPECT_EQ(t["failure"]["kind"], "exit") << t.dump();
  EXPECT_GT(t["faults"].get<int>(), 2) << t.dump();
  ASSERT_TRUE(t.contains("shrunk")) << t.dump();
  EXPECT_LE(t["shrunk"]["faults"].get<int>(), 2) << t.dump();
  EXPECT_NE(t["shrunk"]["schedule"].get<std::string>().find("kill:worker-"), std::string::npos)
      << t.dump();
  const std::string cmd = t["shrunk"]["command"];
  EXPECT_EQ(cmd.rfind("TROUPE_CHAOS_ACTORS='", 0), 0u) << cmd;
  EXPECT_NE(out.find(cmd), std::string::npos) << "the reproducing command is printed\n" << out;
  std::string repro;
  EXPECT_EQ(Shell("cd " + dir_ + " && " + cmd, &repro), 1) << cmd << "\n" << repro;
  EXPECT_NE(repro.find("the supervisor gave up"), std::string::npos) << repro;
}

TEST_F(ChaosActorsTest, BadInputIsRefusedNamingIt) {
  std::string out;
  EXPECT_EQ(Shell(std::string("TROUPE_CHAOS_ACTORS='kill:worker-1@100 stop:worker-2@soon' ") +
                      TROUPE_SERVICE_BINARY,
                  &out),
            2)
      << out;
  EXPECT_NE(out.find("environment variable TROUPE_CHAOS_ACTORS: fault 'stop:worker-2@soon'"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("expected stop:NAME@AT_MS+FOR_MS"), std::string::npos) << out;
  EXPECT_EQ(Shell(std::string(TROUPE_BINARY) +
                      " chaos actors --program true --actors a --kinds kill,explode --report " +
                      dir_ + "/bad",
                  &out),
            2)
      << out;
  EXPECT_NE(out.find("--kinds: unknown kind 'explode': expected kill, stop or delay"),
            std::string::npos)
      << out;
  EXPECT_EQ(Shell(std::string(TROUPE_BINARY) + " chaos actors --actors a", &out), 2) << out;
  EXPECT_NE(out.find("--program: expected a command to run, got none"), std::string::npos) << out;
  EXPECT_EQ(Shell(std::string(TROUPE_BINARY) + " chaos actors --program true --trials 0", &out), 2)
      << out;
  EXPECT_NE(out.find("trials"), std::string::npos) << out;
}

}  // namespace
}  // namespace troupe::tools
