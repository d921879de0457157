#include "supervisor_core.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace troupe::runtime {
namespace {

// splitmix64: counter-based, so the n-th jitter draw depends only on (seed, n).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

const char* ToString(Strategy s) {
  switch (s) {
    case Strategy::kOneForOne:
      return "one_for_one";
    case Strategy::kOneForAll:
      return "one_for_all";
    case Strategy::kRestForOne:
      return "rest_for_one";
  }
  return "?";
}

const char* ToString(RestartType r) {
  switch (r) {
    case RestartType::kPermanent:
      return "permanent";
    case RestartType::kTransient:
      return "transient";
    case RestartType::kTemporary:
      return "temporary";
  }
  return "?";
}

const char* ToString(ExitKind k) {
  switch (k) {
    case ExitKind::kNormal:
      return "normal";
    case ExitKind::kError:
      return "error";
    case ExitKind::kKilled:
      return "killed";
    case ExitKind::kShutdown:
      return "shutdown";
  }
  return "?";
}

std::string DebugString(const Action& a) {
  switch (a.kind) {
    case Action::Kind::kStart:
      return absl::StrCat("start(", a.child, ",g", a.generation, ")");
    case Action::Kind::kStop:
      return absl::StrCat("stop(", a.child, ",g", a.generation, ")");
    case Action::Kind::kRestartAfter:
      return absl::StrCat("restart_after(", a.delay.count() / 1000000, "ms,t", a.timer, ")");
    case Action::Kind::kEscalate:
      return absl::StrCat("escalate(", a.reason, ")");
  }
  return "?";
}

SupervisorCore::SupervisorCore(std::string name, Strategy strategy, Intensity intensity,
                               std::vector<CoreChild> children, uint64_t seed)
    : name_(std::move(name)), strategy_(strategy), intensity_(intensity), seed_(seed) {
  for (auto& c : children) children_.push_back(Child{std::move(c)});
}

size_t SupervisorCore::Find(const std::string& name) const {
  for (size_t i = 0; i < children_.size(); ++i)
    if (children_[i].spec.name == name) return i;
  return children_.size();
}

Action SupervisorCore::MakeStart(size_t i, TimePoint now) {
  Child& c = children_[i];
  c.state = State::kRunning;
  c.started_at = now;
  return Action{Action::Kind::kStart, i, ++c.generation, /*delay=*/{}, /*timer=*/0, /*reason=*/{}};
}

std::vector<Action> SupervisorCore::Start(TimePoint now) {
  std::vector<Action> out;
  for (size_t i = 0; i < children_.size(); ++i) out.push_back(MakeStart(i, now));
  return out;
}

bool SupervisorCore::ShouldRestart(const Child& c, ExitKind kind) const {
  if (kind == ExitKind::kShutdown) return false;
  switch (c.spec.restart) {
    case RestartType::kPermanent:
      return true;
    case RestartType::kTransient:
      return kind != ExitKind::kNormal;
    case RestartType::kTemporary:
      return false;
  }
  return false;
}

Duration SupervisorCore::BackoffDelay(size_t child) {
  const BackoffPolicy& b = children_[child].spec.backoff;
  int n = children_[child].failures;  // >= 1
  double delay = static_cast<double>(b.initial.count()) * std::pow(b.multiplier, n - 1);
  delay = std::min(delay, static_cast<double>(b.max.count()));
  if (b.jitter > 0) {
    double u = static_cast<double>(Mix(seed_ ^ Mix(++draws_)) >> 11) * 0x1.0p-53;  // [0,1)
    delay *= 1.0 + b.jitter * (2.0 * u - 1.0);
  }
  return Duration(static_cast<int64_t>(delay));
}

void SupervisorCore::StopRange(const std::vector<size_t>& order, std::vector<Action>* out) {
  for (size_t i : order) {
    Child& c = children_[i];
    if (c.state != State::kRunning) continue;
    out->push_back(Action{Action::Kind::kStop, i, c.generation, /*delay=*/{}, /*timer=*/0,
                          /*reason=*/{}});
    c.state = c.spec.restart == RestartType::kTemporary ? State::kTerminated : State::kWaiting;
  }
}

std::vector<Action> SupervisorCore::OnExit(size_t child, uint64_t generation, ExitKind kind,
                                           TimePoint now, std::string* decision) {
  std::vector<Action> out;
  auto decide = [&](std::string d) {
    if (decision) *decision = std::move(d);
  };
  if (child >= children_.size() || escalated_) {
    decide("ignore (supervisor stopping)");
    return out;
  }
  Child& c = children_[child];
  if (c.state != State::kRunning || generation != c.generation) {
    decide("ignore (stale generation)");
    return out;
  }
  if (!ShouldRestart(c, kind)) {
    c.state = State::kTerminated;
    decide(absl::StrCat("no restart (", ToString(c.spec.restart), ")"));
    return out;
  }
  // Restart intensity: at most max_restarts within period.
  while (!restarts_.empty() && now - restarts_.front() >= intensity_.period) restarts_.pop_front();
  if (static_cast<int>(restarts_.size()) >= intensity_.max_restarts) {
    escalated_ = true;
    c.state = State::kTerminated;
    std::vector<size_t> all(children_.size());
    for (size_t i = 0; i < all.size(); ++i) all[all.size() - 1 - i] = i;
    StopRange(all, &out);
    std::string reason =
        absl::StrCat("restart intensity exceeded: more than ", intensity_.max_restarts,
                     " restarts in ", intensity_.period.count() / 1000000, "ms");
    out.push_back(Action{Action::Kind::kEscalate, child, 0, Duration(0), 0, reason});
    decide("escalate");
    return out;
  }
  restarts_.push_back(now);
  c.failures = (now - c.started_at >= c.spec.backoff.reset_after) ? 1 : c.failures + 1;
  c.state = State::kWaiting;

  // Which children restart together, in start order.
  std::vector<size_t> group;
  if (strategy_ == Strategy::kOneForOne) {
    group = {child};
  } else {
    size_t first = strategy_ == Strategy::kOneForAll ? 0 : child;
    std::vector<size_t> stop_order;
    for (size_t i = children_.size(); i-- > first;)
      if (i != child) stop_order.push_back(i);
    StopRange(stop_order, &out);
    for (size_t i = first; i < children_.size(); ++i)
      if (children_[i].state == State::kWaiting) group.push_back(i);
  }
  uint64_t timer = next_timer_++;
  timers_[timer] = group;
  Duration delay = BackoffDelay(child);
  out.push_back(Action{Action::Kind::kRestartAfter, child, 0, delay, timer, /*reason=*/{}});
  decide(absl::StrCat("restart after ", delay.count() / 1000, "us"));
  return out;
}

std::vector<Action> SupervisorCore::OnTimer(uint64_t timer, TimePoint now) {
  std::vector<Action> out;
  auto it = timers_.find(timer);
  if (it == timers_.end() || escalated_) return out;
  for (size_t i : it->second)
    if (children_[i].state == State::kWaiting) out.push_back(MakeStart(i, now));
  timers_.erase(it);
  return out;
}

std::vector<Action> SupervisorCore::Shutdown() {
  std::vector<Action> out;
  escalated_ = true;  // no more restarts
  timers_.clear();
  std::vector<size_t> all(children_.size());
  for (size_t i = 0; i < all.size(); ++i) all[all.size() - 1 - i] = i;
  StopRange(all, &out);
  return out;
}

std::string SupervisorCore::DebugString() const {
  std::ostringstream s;
  s << "Supervisor(" << name_ << ", " << ToString(strategy_)
    << ", restarts_in_window=" << restarts_.size() << "/" << intensity_.max_restarts
    << ", children=[";
  for (size_t i = 0; i < children_.size(); ++i) {
    const Child& c = children_[i];
    static const char* kState[] = {"idle", "running", "waiting", "terminated"};
    s << (i ? ", " : "") << c.spec.name << ":g" << c.generation << ":"
      << kState[static_cast<int>(c.state)];
  }
  s << "])";
  return s.str();
}

}  // namespace troupe::runtime
