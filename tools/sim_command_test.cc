// `troupe sim spot` as a user runs it: each mix's row and the summary line from the shipped trace,
// bad input refused naming it. Its --measure (real processes) is SimSpotMeasureTest in tests/spot.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "shell_test_util.h"

namespace troupe::tools {
namespace {

int Troupe(const std::string& args, std::string* out, int timeout_s = 60) {
  return Shell("timeout " + std::to_string(timeout_s) + " " + TROUPE_BINARY + " " + args, out);
}

std::string LastLine(const std::string& text) {
  const size_t end = text.find_last_not_of('\n');
  const size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end - begin);
}

TEST(SimSpotCommandTest, PrintsEachMixAndEndsWithTheSummary) {
  std::string out;
  ASSERT_EQ(Troupe(std::string("sim spot --trace ") + EXAMPLE_TRACE + " --mix 4:0,0:4", &out), 0)
      << out;
  // The trace's own mix first: its three listed notices, every one handed over from memory.
  EXPECT_NE(out.find("mix od=1 spot=3: goodput "), std::string::npos) << out;
  EXPECT_NE(out.find("3 preemptions, 6 generations, 0 hand-over checkpoints, 0 coordinator moves, "
                     "0 steps lost"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("mix od=4 spot=0: "), std::string::npos) << out;
  EXPECT_NE(out.find("0 preemptions, 1 generations"), std::string::npos) << out;
  EXPECT_NE(out.find("(coordinator first on s0)"), std::string::npos)
      << "no on-demand machine: the coordinator goes to a spot one\n"
      << out;
  EXPECT_TRUE(std::regex_match(
      LastLine(out), std::regex("summary: goodput_steps_per_h=[0-9]+ cost_per_1k_steps=[0-9.]+ "
                                "predicted_err_pct=n/a")))
      << out;
}

TEST(SimSpotCommandTest, BadInputIsRefusedNamingIt) {
  std::string out;
  EXPECT_EQ(Troupe("sim spot --trace /nonexistent.toml", &out), 2);
  EXPECT_NE(out.find("/nonexistent.toml: cannot open the trace"), std::string::npos) << out;
  EXPECT_EQ(Troupe(std::string("sim spot --trace ") + EXAMPLE_TRACE + " --mix 1x3", &out), 2);
  EXPECT_NE(out.find("--mix: expected OD:SPOT (e.g. 1:3), got '1x3'"), std::string::npos) << out;
  EXPECT_EQ(Troupe("sim walk", &out), 2);
  EXPECT_NE(out.find("usage: troupe sim spot"), std::string::npos) << out;
}

}  // namespace
}  // namespace troupe::tools
