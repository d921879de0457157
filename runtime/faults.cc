#include "troupe/runtime/faults.h"

#include "absl/strings/str_cat.h"

namespace troupe::runtime {

void FaultInjector::Arm(Rule r) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back(std::move(r));
  armed_.store(true);
}

absl::Status FaultInjector::KillActor(const std::string& name) {
  if (!killer_) return absl::FailedPreconditionError("fault injector is not attached to a runtime");
  return killer_(name);
}

void FaultInjector::FailAtMessage(const std::string& name, uint64_t n) {
  Arm(Rule{MessageFilter{name, "", 1}, Decision::Kind::kFail, {}, n});
}

void FaultInjector::HangAtMessage(const std::string& name, uint64_t n,
                                  std::chrono::nanoseconds duration) {
  Arm(Rule{MessageFilter{name, "", 1}, Decision::Kind::kHang, duration, n});
}

void FaultInjector::DropMessages(MessageFilter filter) {
  Arm(Rule{std::move(filter), Decision::Kind::kDrop});
}

void FaultInjector::DelayMessages(MessageFilter filter, std::chrono::nanoseconds delay) {
  Arm(Rule{std::move(filter), Decision::Kind::kDelay, delay});
}

void FaultInjector::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
  armed_.store(false);
}

FaultInjector::Decision FaultInjector::OnMessage(const std::string& receiver, uint64_t index,
                                                 const std::string& atom) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = rules_.begin(); it != rules_.end(); ++it) {
    Rule& r = *it;
    if (!r.filter.receiver.empty() && r.filter.receiver != receiver) continue;
    if (!r.filter.atom.empty() && r.filter.atom != atom) continue;
    if ((r.kind == Decision::Kind::kFail || r.kind == Decision::Kind::kHang) && index != r.at) {
      continue;
    }
    Decision d{r.kind, r.delay, ""};
    switch (r.kind) {
      case Decision::Kind::kFail:
        d.reason = absl::StrCat("fault injection: ", receiver, " failed at message ", index);
        break;
      case Decision::Kind::kDrop:
        ++dropped_;
        break;
      case Decision::Kind::kDelay:
        ++delayed_;
        break;
      case Decision::Kind::kHang:  // the receiver sleeps d.delay inside its handler (actor.cc)
      case Decision::Kind::kDeliver:
        break;
    }
    if (r.filter.count > 0 && --r.filter.count == 0) rules_.erase(it);
    if (rules_.empty()) armed_.store(false);
    return d;
  }
  return {};
}

}  // namespace troupe::runtime
