// The membership enums of membership.h as text, and MembershipEvent's printed forms.
#include "troupe/runtime/membership.h"

#include "absl/strings/str_cat.h"
#include "internal/enum_text.h"

namespace troupe::runtime {

const char* Name(MemberKind kind) {
  switch (kind) {
    case MemberKind::kNode:
      return "node";
    case MemberKind::kWorker:
      return "worker";
  }
  return "?";
}

const char* Name(MemberState state) {
  switch (state) {
    case MemberState::kJoining:
      return "joining";
    case MemberState::kAlive:
      return "alive";
    case MemberState::kDraining:
      return "draining";
    case MemberState::kDead:
      return "dead";
  }
  return "?";
}

const char* Name(MembershipKind kind) {
  switch (kind) {
    case MembershipKind::kNodeAlive:
      return "node_alive";
    case MembershipKind::kNodeDraining:
      return "node_draining";
    case MembershipKind::kNodeDead:
      return "node_dead";
    case MembershipKind::kWorkerAlive:
      return "worker_alive";
    case MembershipKind::kWorkerDown:
      return "worker_down";
    case MembershipKind::kWorkerExit:
      return "worker_exit";
    case MembershipKind::kActorHung:
      return "actor_hung";
    case MembershipKind::kRefused:
      return "refused";
  }
  return "?";
}

absl::StatusOr<MemberKind> ParseMemberKind(const std::string& text) {
  constexpr MemberKind kAll[] = {MemberKind::kNode, MemberKind::kWorker};
  return internal::ParseEnum("member kind", text, kAll);
}

absl::StatusOr<MemberState> ParseMemberState(const std::string& text) {
  constexpr MemberState kAll[] = {MemberState::kJoining, MemberState::kAlive,
                                  MemberState::kDraining, MemberState::kDead};
  return internal::ParseEnum("member state", text, kAll);
}

absl::StatusOr<MembershipKind> ParseMembershipKind(const std::string& text) {
  constexpr MembershipKind kAll[] = {MembershipKind::kNodeAlive,  MembershipKind::kNodeDraining,
                                     MembershipKind::kNodeDead,   MembershipKind::kWorkerAlive,
                                     MembershipKind::kWorkerDown, MembershipKind::kWorkerExit,
                                     MembershipKind::kActorHung,  MembershipKind::kRefused};
  return internal::ParseEnum("membership event kind", text, kAll);
}

base::SupervisionEvent MembershipEvent::ToProcessExit(const std::string& observer) const {
  base::SupervisionEvent e;
  e.supervisor = observer;
  e.child = subject;
  e.generation = generation;
  e.event = "process_exit";
  e.pid = pid;
  e.cause = cause == base::ExitCause::kNone ? base::ExitCause::kLost : cause;
  e.exit_code = exit_code;
  e.signal = signal;
  e.reason = absl::StrCat(Name(kind), ": ", detail);
  return e;
}

std::string MembershipEvent::DebugString() const {
  std::string s = absl::StrCat("gen=", generation, " event=", Name(kind), " subject=", subject);
  if (!node.empty()) absl::StrAppend(&s, " node=", node);
  if (pid) absl::StrAppend(&s, " pid=", pid);
  if (cause != base::ExitCause::kNone) {
    absl::StrAppend(&s, " cause=", base::ExitCauseName(cause));
    if (cause == base::ExitCause::kExited) absl::StrAppend(&s, " exit_code=", exit_code);
    if (signal != 0) absl::StrAppend(&s, " signal=", signal);
  }
  if (!detail.empty()) absl::StrAppend(&s, " detail=\"", detail, "\"");
  if (!stderr_tail.empty()) {
    std::string t = stderr_tail;
    for (char& c : t)
      if (c == '\n') c = '|';
    absl::StrAppend(&s, " stderr_tail=\"", t, "\"");
  }
  return s;
}

}  // namespace troupe::runtime
