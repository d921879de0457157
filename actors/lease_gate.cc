#include "lease_gate.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace troupe::actors {

using Kind = LeaseAction::Kind;

bool NeedsLease(train::CoordinatorAction::Kind kind) {
  switch (kind) {
    case train::CoordinatorAction::Kind::kSaveRecord:
    case train::CoordinatorAction::Kind::kConfigure:
    case train::CoordinatorAction::Kind::kCommit:
    case train::CoordinatorAction::Kind::kCheckpoint:
    case train::CoordinatorAction::Kind::kCommitted:
    case train::CoordinatorAction::Kind::kFinish:
    case train::CoordinatorAction::Kind::kEvict:  // a superseded coordinator evicts nobody
      return true;
    default:
      return false;
  }
}

std::string DebugString(const LeaseAction& a) {
  auto ms = [](train::CoreDuration d) {
    return absl::StrCat(std::chrono::duration_cast<std::chrono::milliseconds>(d).count(), "ms");
  };
  switch (a.kind) {
    case Kind::kRun:
      return absl::StrCat("run(", a.action ? DebugString(*a.action) : "?", ")");
    case Kind::kRunQueue:
      return "run_queue";
    case Kind::kAskLease:
      return "ask_lease";
    case Kind::kClaim:
      return absl::StrCat("claim(e", a.epoch, ")");
    case Kind::kAnnounceEpoch:
      return absl::StrCat("announce_epoch(e", a.epoch, ")");
    case Kind::kLoseLease:
      return absl::StrCat("lose_lease(e", a.epoch, ",held", a.held, ")");
    case Kind::kTick:
      return absl::StrCat("tick(", ms(a.delay), ")");
    case Kind::kHeadLost:
      return "head_lost";
    case Kind::kCheckHead:
      return absl::StrCat("check_head(", ms(a.delay), ")");
    case Kind::kHeadBack:
      return absl::StrCat("head_back(", ms(a.delay), ")");
    case Kind::kFollowHead:
      return "follow_head";
  }
  return "?";
}

std::string LeaseGate::DebugString() const {
  return absl::StrCat("LeaseGate{epoch=", epoch_, " length=", lease_length_.count(),
                      "ms queued=", queue_.size(), " asked=", asked_ ? "yes" : "no", " head=",
                      !has_head_   ? "none"
                      : head_lost_ ? "lost"
                                   : "yes",
                      " waiting=", waiting_since_ ? "yes" : "no",
                      " stopped=", stopped_ ? "yes" : "no", "}");
}

std::vector<LeaseAction> LeaseGate::Enqueue(std::vector<train::CoordinatorAction> batch,
                                            bool from_action) {
  const uint64_t id = next_batch_++;
  std::vector<std::pair<uint64_t, train::CoordinatorAction>> tagged;
  for (train::CoordinatorAction& a : batch) tagged.emplace_back(id, std::move(a));
  queue_.insert(from_action ? queue_.begin() : queue_.end(),
                std::make_move_iterator(tagged.begin()), std::make_move_iterator(tagged.end()));
  if (stopped_) return {};
  return {LeaseAction(Kind::kRunQueue)};
}

std::optional<LeaseAction> LeaseGate::Next(train::CoreTime now) {
  if (stopped_ || queue_.empty()) return std::nullopt;
  const uint64_t batch = queue_.front().first;
  if (NeedsLease(queue_.front().second.kind) && batch != leased_batch_) {
    if (!Held(now, lease_length_ / 4)) {
      if (!waiting_since_) waiting_since_ = now;
      Actions ask;
      Ask(&ask);
      if (ask.empty()) return std::nullopt;
      return std::move(ask.front());
    }
    leased_batch_ = batch;
  }
  waiting_since_.reset();
  LeaseAction run(Kind::kRun);
  run.action = std::move(queue_.front().second);
  queue_.pop_front();
  return run;
}

void LeaseGate::Ask(Actions* out) {
  if (asked_ || stopped_ || !has_head_ || head_lost_) return;
  asked_ = true;
  out->emplace_back(Kind::kAskLease);
}

void LeaseGate::Lose(Actions* out, const std::string& why) {
  if (stopped_) return;
  LeaseAction a(Kind::kLoseLease);
  a.epoch = epoch_;
  a.held = static_cast<int64_t>(queue_.size());
  a.reason = why;
  out->push_back(std::move(a));
  Stop();
}

void LeaseGate::Stop() {
  stopped_ = true;
  queue_.clear();
}

std::vector<LeaseAction> LeaseGate::OnHeadNamed() {
  has_head_ = true;
  Actions out;
  out.emplace_back(Kind::kFollowHead);
  Ask(&out);
  return out;
}

void LeaseGate::Renewed(const Grant& g) {
  lease_length_ = g.length;
  lease_until_ = g.sent + g.length;
  asking_since_.reset();
}

std::vector<LeaseAction> LeaseGate::OnGranted(uint64_t epoch, std::chrono::milliseconds length,
                                              train::CoreTime sent) {
  asked_ = false;
  if (stopped_) return {};
  if (epoch != epoch_) {
    // A new epoch claims the store before anything runs under it.
    claiming_ = Grant{epoch, length, sent};
    LeaseAction claim(Kind::kClaim);
    claim.epoch = epoch;
    return {claim};
  }
  Renewed(Grant{epoch, length, sent});
  return {LeaseAction(Kind::kRunQueue)};
}

std::vector<LeaseAction> LeaseGate::OnClaimed(const absl::Status& status) {
  Actions out;
  if (stopped_ || !claiming_) return out;
  const Grant g = *claiming_;
  claiming_.reset();
  if (!status.ok()) {
    Lose(&out, status.ToString());
    return out;
  }
  // Granted again by a head that took over: the ranks write under the new epoch too.
  if (epoch_ != 0) {
    LeaseAction announce(Kind::kAnnounceEpoch);
    announce.epoch = g.epoch;
    out.push_back(std::move(announce));
  }
  epoch_ = g.epoch;
  Renewed(g);
  out.emplace_back(Kind::kRunQueue);
  return out;
}

std::vector<LeaseAction> LeaseGate::OnRefused(const absl::Status& status) {
  asked_ = false;
  Actions out;
  // Refused for good: this incarnation has been replaced. Anything else: the tick asks again.
  if (status.code() == absl::StatusCode::kFailedPrecondition) Lose(&out, status.ToString());
  return out;
}

std::vector<LeaseAction> LeaseGate::OnTick(train::CoreTime now) {
  Actions out;
  if (stopped_) return out;
  if (head_lost_) {
    asking_since_.reset();  // no head to ask: waited out (OnHeadLost), not counted
  } else {
    if (!waiting_since_ && (epoch_ == 0 || Held(now))) {
      asking_since_.reset();
    } else if (!asking_since_) {
      asking_since_ = now;
    }
    if (asking_since_ && now - *asking_since_ > options_.lease_wait) {
      Lose(&out, absl::StrCat("the head did not grant or renew it within ",
                              absl::FormatDuration(absl::FromChrono(options_.lease_wait))));
      return out;
    }
    Ask(&out);
  }
  LeaseAction tick(Kind::kTick);
  tick.delay = lease_length_.count() > 0 ? std::max(lease_length_ / 4, options_.min_tick)
                                         : options_.first_tick;
  out.push_back(std::move(tick));
  return out;
}

std::vector<LeaseAction> LeaseGate::OnHeadLost(const std::string& why, train::CoreTime now) {
  Actions out;
  if (stopped_ || head_lost_) return out;
  head_lost_ = now;
  LeaseAction lost(Kind::kHeadLost);
  lost.reason = why;
  out.push_back(std::move(lost));
  out.emplace_back(Kind::kCheckHead);  // at once: this process may have rejoined already
  return out;
}

std::vector<LeaseAction> LeaseGate::OnHeadTick(bool found, train::CoreTime now) {
  Actions out;
  if (stopped_ || !head_lost_) return out;
  if (!found) {
    LeaseAction again(Kind::kCheckHead);
    again.delay = options_.head_poll;
    out.push_back(std::move(again));
    return out;
  }
  LeaseAction back(Kind::kHeadBack);
  back.delay = now - *head_lost_;
  out.push_back(std::move(back));
  head_lost_.reset();
  asked_ = false;  // the old head's answer is an error at most
  has_head_ = true;
  out.emplace_back(Kind::kFollowHead);
  Ask(&out);
  return out;
}

}  // namespace troupe::actors
