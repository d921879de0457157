// A byte-count progress bar for the CLI's long-running commands. On a terminal it redraws one line
// in place, at most ten times a second; elsewhere (a log file, a pipe, CI) it prints a plain line
// at every 10% and at the end, so logs stay short and readable.
//
//   reading [########............] 42% 420/1000 MB 12.3 MB/s eta 47s
//
// Example:
//   ProgressBar bar("reading", total_bytes, stderr, isatty(fileno(stderr)));
//   for (...) bar.Add(n);
//   bar.Done();
//
// Not thread-safe: one thread calls Add and Done.
#ifndef TROUPE_TOOLS_PROGRESS_BAR_H_
#define TROUPE_TOOLS_PROGRESS_BAR_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace troupe::tools {

class ProgressBar {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  // `total` is in bytes; amounts print in the unit (B, kB, MB, GB, TB; powers of 1000) that fits
  // it. With nothing to count (total <= 0) the bar prints nothing. `clock` is for tests; the rate
  // and eta count from construction.
  ProgressBar(std::string label, int64_t total, FILE* out, bool is_tty,
              Clock clock = std::chrono::steady_clock::now);

  // Counts n more bytes done and redraws or prints as described above. Reaching the total finishes
  // the bar as Done does, so its rate is that of the work counted, not of what the caller does
  // next.
  void Add(int64_t n);

  // Finishes the bar unless reaching the total did: the final state, then a newline on a terminal.
  // Call it also on failure, so what follows starts on a fresh line.
  void Done();

 private:
  std::string Line(std::chrono::steady_clock::time_point now) const;
  void Print(std::chrono::steady_clock::time_point now);
  void Finish(std::chrono::steady_clock::time_point now);

  const std::string label_;
  const int64_t total_;
  FILE* const out_;
  const bool is_tty_;
  const Clock clock_;
  const std::chrono::steady_clock::time_point start_;
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point last_draw_;  // tty: the last redraw
  int printed_tenths_ = 0;                           // not a tty: tenths already printed
  bool finished_ = false;
};

}  // namespace troupe::tools

#endif  // TROUPE_TOOLS_PROGRESS_BAR_H_
