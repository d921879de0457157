// LineTee: lines written in pieces by several threads at once come out whole, each in one write,
// and reach the line callback whole.
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "job_reporter.h"

namespace troupe::actors {
namespace {

TEST(LineTeeTest, LinesWrittenInPiecesByManyThreadsComeOutWhole) {
  constexpr int kThreads = 4, kLines = 300;
  std::ostringstream sink;
  std::mutex mu;
  std::vector<std::string> reported;
  LineTee tee(sink, [&](std::string line) {
    std::lock_guard<std::mutex> l(mu);
    reported.push_back(std::move(line));
  });
  std::ostream out(&tee);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&out, t] {
      for (int i = 0; i < kLines; ++i)
        out << "thread " << t << " line " << i << " end" << std::endl;
    });
  }
  for (std::thread& t : threads) t.join();

  std::set<std::string> want;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kLines; ++i) want.insert(absl::StrCat("thread ", t, " line ", i, " end"));
  }
  const std::string text = sink.str();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  std::vector<std::string> written = absl::StrSplit(text.substr(0, text.size() - 1), '\n');
  EXPECT_EQ(std::set<std::string>(written.begin(), written.end()), want);
  EXPECT_EQ(written.size(), want.size());
  EXPECT_EQ(std::set<std::string>(reported.begin(), reported.end()), want);
  EXPECT_EQ(reported.size(), want.size());
}

TEST(LineTeeTest, ALineNotYetEndedIsHeldBack) {
  std::ostringstream sink;
  std::vector<std::string> reported;
  LineTee tee(sink, [&](std::string line) { reported.push_back(std::move(line)); });
  std::ostream out(&tee);
  out << "step 1 of" << std::flush;
  EXPECT_EQ(sink.str(), "");
  out << " 40" << '\n';
  EXPECT_EQ(sink.str(), "step 1 of 40\n");
  EXPECT_EQ(reported, std::vector<std::string>{"step 1 of 40"});
}

TEST(LineTeeTest, WhatIsLeftOfALineIsWrittenWhenTheLineTeeGoes) {
  std::ostringstream sink;
  std::vector<std::string> reported;
  {
    LineTee tee(sink, [&](std::string line) { reported.push_back(std::move(line)); });
    std::ostream out(&tee);
    out << "done" << std::endl << "no newline";
    EXPECT_EQ(sink.str(), "done\n");
  }
  EXPECT_EQ(sink.str(), "done\nno newline\n");
  EXPECT_EQ(reported, (std::vector<std::string>{"done", "no newline"}));
}

}  // namespace
}  // namespace troupe::actors
