// ProgressBar against a hand-driven clock, writing to a temporary file.
#include "progress_bar.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_split.h"

namespace troupe::tools {
namespace {

using std::chrono::milliseconds;

class ProgressBarTest : public ::testing::Test {
 protected:
  ProgressBarTest() : out_(std::tmpfile()) {}
  ~ProgressBarTest() override { std::fclose(out_); }

  ProgressBar Bar(const char* label, int64_t total, bool is_tty) {
    return ProgressBar(label, total, out_, is_tty, [this] { return now_; });
  }

  std::string Written() {
    std::fflush(out_);
    std::rewind(out_);
    std::string text;
    for (int c = std::fgetc(out_); c != EOF; c = std::fgetc(out_)) text += static_cast<char>(c);
    return text;
  }

  FILE* out_;
  std::chrono::steady_clock::time_point now_;
};

TEST_F(ProgressBarTest, NotATtyPrintsALineEveryTenPercentAndTheEndOnce) {
  ProgressBar bar = Bar("read", 1000, /*is_tty=*/false);
  for (int i = 0; i < 20; ++i) {
    now_ += milliseconds(100);
    bar.Add(50);
  }
  bar.Done();
  const std::vector<std::string> lines = absl::StrSplit(Written(), '\n');
  ASSERT_EQ(lines.size(), 11u);  // ten lines, each ending in '\n'
  EXPECT_EQ(lines[0], "read [##..................] 10% 0.1/1 kB 500 B/s eta 2s");
  EXPECT_EQ(lines[4], "read [##########..........] 50% 0.5/1 kB 500 B/s eta 1s");
  EXPECT_EQ(lines[9], "read [####################] 100% 1/1 kB 500 B/s eta 0s");
  EXPECT_EQ(lines[10], "");
}

TEST_F(ProgressBarTest, NotATtyPrintsWhereItStoppedWhenDoneEarly) {
  ProgressBar bar = Bar("read", 1000, /*is_tty=*/false);
  now_ += milliseconds(1000);
  bar.Add(250);  // past 10% and 20%: one line
  bar.Add(5);
  bar.Done();
  EXPECT_EQ(Written(),
            "read [#####...............] 25% 0.25/1 kB 250 B/s eta 3s\n"
            "read [#####...............] 25% 0.255/1 kB 255 B/s eta 3s\n");
}

TEST_F(ProgressBarTest, TtyRedrawsOneLineAtMostTenTimesASecond) {
  ProgressBar bar = Bar("copy", 100'000'000, /*is_tty=*/true);
  for (int i = 0; i < 100; ++i) {
    now_ += milliseconds(10);
    bar.Add(1'000'000);
  }
  bar.Done();
  const std::string text = Written();
  const std::vector<std::string> draws = absl::StrSplit(text, '\r');
  // "" before the first \r, then 10 draws in 1 s: every 100 ms, the last on reaching the total;
  // Done adds none.
  ASSERT_EQ(draws.size(), 11u);
  EXPECT_EQ(draws[1], "copy [##..................] 10% 10/100 MB 100 MB/s eta 1s\033[K");
  EXPECT_EQ(draws[10], "copy [####################] 100% 100/100 MB 100 MB/s eta 0s\033[K\n");
  EXPECT_EQ(text.find('\n'), text.size() - 1);
}

TEST_F(ProgressBarTest, TtyDrawsNothingBeforeTheFirstTenthOfASecond) {
  ProgressBar bar = Bar("copy", 10, /*is_tty=*/true);
  bar.Add(5);
  now_ += milliseconds(99);
  bar.Add(1);
  EXPECT_EQ(Written(), "");
  bar.Done();
  EXPECT_EQ(Written(), "\rcopy [############........] 60% 6/10 B 60.6 B/s eta 0s\033[K\n");
}

TEST_F(ProgressBarTest, NothingToCountPrintsNothing) {
  for (const bool is_tty : {false, true}) {
    ProgressBar bar = Bar("read", 0, is_tty);
    bar.Add(0);
    bar.Done();
  }
  EXPECT_EQ(Written(), "");
}

}  // namespace
}  // namespace troupe::tools
