#include "progress_bar.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"

namespace troupe::tools {
namespace {

using std::chrono::steady_clock;

constexpr int kBarWidth = 20;
// A redraw per frame a person can follow; faster only costs terminal output.
constexpr auto kRedrawEvery = std::chrono::milliseconds(100);

struct Unit {
  double bytes;
  const char* name;
};

Unit UnitFor(double bytes) {
  for (const Unit& u : {Unit{1e12, "TB"}, Unit{1e9, "GB"}, Unit{1e6, "MB"}, Unit{1e3, "kB"}}) {
    if (bytes >= u.bytes) return u;
  }
  return {1, "B"};
}

std::string Eta(double seconds) {
  const int64_t s = std::llround(seconds);
  return s < 60 ? absl::StrFormat("%ds", s) : absl::StrFormat("%dm%02ds", s / 60, s % 60);
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, FILE* out, bool is_tty, Clock clock)
    : label_(std::move(label)),
      total_(total),
      out_(out),
      is_tty_(is_tty),
      clock_(std::move(clock)),
      start_(clock_()),
      last_draw_(start_) {}

void ProgressBar::Add(int64_t n) {
  done_ += n;
  if (finished_) return;
  const steady_clock::time_point now = clock_();
  if (done_ >= total_) return Finish(now);
  if (is_tty_) {
    if (now - last_draw_ < kRedrawEvery) return;
    last_draw_ = now;
    return Print(now);
  }
  const int tenths = static_cast<int>(done_ * 10 / total_);
  if (tenths <= printed_tenths_) return;
  printed_tenths_ = tenths;
  Print(now);
}

void ProgressBar::Done() {
  if (!finished_) Finish(clock_());
}

void ProgressBar::Finish(steady_clock::time_point now) {
  finished_ = true;
  if (total_ <= 0) return;
  Print(now);
  if (is_tty_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

std::string ProgressBar::Line(steady_clock::time_point now) const {
  // Only drawn while total_ > 0 (see Finish).
  const double fraction = std::clamp(static_cast<double>(done_) / total_, 0.0, 1.0);
  const int filled = static_cast<int>(fraction * kBarWidth);
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double rate = seconds > 0 ? done_ / seconds : 0;
  const Unit unit = UnitFor(total_), rate_unit = UnitFor(rate);
  return absl::StrFormat("%s [%s%s] %d%% %.4g/%.4g %s %.3g %s/s eta %s", label_,
                         std::string(filled, '#'), std::string(kBarWidth - filled, '.'),
                         static_cast<int>(fraction * 100), done_ / unit.bytes, total_ / unit.bytes,
                         unit.name, rate / rate_unit.bytes, rate_unit.name,
                         rate > 0 ? Eta(std::max<double>(0, total_ - done_) / rate) : "?");
}

void ProgressBar::Print(steady_clock::time_point now) {
  // On a terminal: back to the line's start, draw, erase what a longer previous line left.
  std::fprintf(out_, is_tty_ ? "\r%s\033[K" : "%s\n", Line(now).c_str());
  std::fflush(out_);
}

}  // namespace troupe::tools
