#include "troupe/runtime/faults.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "troupe/base/status_macros.h"

namespace troupe::runtime {
namespace {

constexpr std::pair<ActorFault::Kind, const char*> kActorFaultKinds[] = {
    {ActorFault::Kind::kKill, "kill"},
    {ActorFault::Kind::kStop, "stop"},
    {ActorFault::Kind::kDelay, "delay"},
};

// A schedule's millisecond count: digits only (no sign, no space), below 10^15.
bool ParseMs(absl::string_view text, int64_t* ms) {
  if (text.empty() || text.size() > 15) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(text, ms);
}

absl::StatusOr<ActorFault> ParseActorFault(const std::string& token) {
  auto bad = [&](const std::string& expected, const std::string& got) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault '", token, "': expected ", expected, ", got ", got));
  };
  ActorFault f;
  const size_t colon = token.find(':');
  const std::string kind = token.substr(0, std::min(colon, token.size()));
  if (colon == std::string::npos || !ParseActorFaultKind(kind, &f.kind)) {
    return bad("KIND:NAME@AT_MS[...] with KIND one of kill, stop, delay",
               colon == std::string::npos ? "no ':'" : absl::StrCat("kind '", kind, "'"));
  }
  const std::string rest = token.substr(colon + 1);
  const size_t at = rest.rfind('@');
  const char* form = f.kind == ActorFault::Kind::kKill   ? "kill:NAME@AT_MS"
                     : f.kind == ActorFault::Kind::kStop ? "stop:NAME@AT_MS+FOR_MS (FOR_MS > 0)"
                                                         : "delay:NAME@AT_MS+FOR_MS/DELAY_MS "
                                                           "(FOR_MS, DELAY_MS > 0)";
  if (at == std::string::npos || at == 0) {
    return bad(form, at == 0 ? "no NAME" : "no '@'");
  }
  f.actor = rest.substr(0, at);
  const std::string when = rest.substr(at + 1);
  std::vector<std::string> parts = absl::StrSplit(when, absl::ByAnyChar("+/"));
  const size_t want = f.kind == ActorFault::Kind::kKill   ? 1
                      : f.kind == ActorFault::Kind::kStop ? 2
                                                          : 3;
  const bool shape = parts.size() == want && (want < 2 || when[parts[0].size()] == '+') &&
                     (want < 3 || when[parts[0].size() + 1 + parts[1].size()] == '/');
  if (!shape || !ParseMs(parts[0], &f.at_ms) || (want >= 2 && !ParseMs(parts[1], &f.for_ms)) ||
      (want >= 3 && !ParseMs(parts[2], &f.delay_ms)) || (want >= 2 && f.for_ms == 0) ||
      (want >= 3 && f.delay_ms == 0)) {
    return bad(form, absl::StrCat("'@", when, "'"));
  }
  return f;
}

}  // namespace

std::string ActorFault::ToString() const {
  std::string out = absl::StrCat(ActorFaultKindName(kind), ":", actor, "@", at_ms);
  if (kind != Kind::kKill) absl::StrAppend(&out, "+", for_ms);
  if (kind == Kind::kDelay) absl::StrAppend(&out, "/", delay_ms);
  return out;
}

const char* ActorFaultKindName(ActorFault::Kind kind) {
  for (const auto& [k, name] : kActorFaultKinds) {
    if (k == kind) return name;
  }
  return "?";
}

bool ParseActorFaultKind(const std::string& name, ActorFault::Kind* kind) {
  for (const auto& [k, n] : kActorFaultKinds) {
    if (name == n) {
      *kind = k;
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::vector<ActorFault>> ParseActorFaults(const std::string& text) {
  std::vector<ActorFault> out;
  for (absl::string_view token :
       absl::StrSplit(text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty())) {
    TROUPE_ASSIGN_OR_RETURN(ActorFault f, ParseActorFault(std::string(token)));
    out.push_back(std::move(f));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ActorFault& a, const ActorFault& b) { return a.at_ms < b.at_ms; });
  return out;
}

std::string FormatActorFaults(const std::vector<ActorFault>& faults) {
  return absl::StrJoin(faults, " ",
                       [](std::string* out, const ActorFault& f) { out->append(f.ToString()); });
}

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

void FaultInjector::HangNextMessageUntil(const std::string& name,
                                         std::chrono::steady_clock::time_point until) {
  Rule r{MessageFilter{name, "", 1}, Decision::Kind::kHang, {}, 0};
  r.until = until;
  Arm(std::move(r));
}

void FaultInjector::DelayMessagesUntil(MessageFilter filter, std::chrono::nanoseconds delay,
                                       std::chrono::steady_clock::time_point until) {
  Rule r{std::move(filter), Decision::Kind::kDelay, delay};
  r.until = until;
  Arm(std::move(r));
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
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  Decision d;
  for (auto it = rules_.begin(); it != rules_.end();) {
    Rule& r = *it;
    if (now >= r.until) {  // a fault with an end, over
      it = rules_.erase(it);
      continue;
    }
    const bool indexed = r.kind == Decision::Kind::kFail || r.kind == Decision::Kind::kHang;
    if ((!r.filter.receiver.empty() && r.filter.receiver != receiver) ||
        (!r.filter.atom.empty() && r.filter.atom != atom) ||
        (indexed && r.at != 0 && index != r.at)) {
      ++it;
      continue;
    }
    d = Decision{r.kind, r.delay, ""};
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
        if (r.until != std::chrono::steady_clock::time_point::max()) d.delay = r.until - now;
        break;
      case Decision::Kind::kDeliver:
        break;
    }
    if (r.filter.count > 0 && --r.filter.count == 0) rules_.erase(it);
    break;
  }
  if (rules_.empty()) armed_.store(false);
  return d;
}

}  // namespace troupe::runtime
