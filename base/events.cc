// The supervision event record and its one-line form (troupe/base/events.h).
#include "troupe/base/events.h"

#include <sys/wait.h>

#include <cstring>
#include <ctime>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace troupe::base {

const char* ExitCauseName(ExitCause cause) {
  switch (cause) {
    case ExitCause::kNone:
      return "none";
    case ExitCause::kExited:
      return "exited";
    case ExitCause::kSignaled:
      return "signaled";
    case ExitCause::kFenced:
      return "fenced";
    case ExitCause::kLost:
      return "lost";
  }
  return "none";
}

bool ParseExitCause(const std::string& name, ExitCause* cause) {
  for (ExitCause c : {ExitCause::kNone, ExitCause::kExited, ExitCause::kSignaled,
                      ExitCause::kFenced, ExitCause::kLost}) {
    if (name == ExitCauseName(c)) {
      *cause = c;
      return true;
    }
  }
  return false;
}

namespace {

// The keys of SupervisionEvent's own members: never taken from (or written as) `fields`.
bool ReservedKey(const std::string& key) {
  for (const char* k : {"ts", "supervisor", "child", "gen", "event", "pid", "cause", "exit_code",
                        "signal", "reason", "decision"}) {
    if (key == k) return true;
  }
  return false;
}

}  // namespace

std::string SupervisionEvent::Field(const std::string& key) const {
  auto it = fields.find(key);
  return it == fields.end() ? std::string() : it->second;
}

int64_t SupervisionEvent::IntField(const std::string& key, int64_t fallback) const {
  int64_t v;
  auto it = fields.find(key);
  return it != fields.end() && absl::SimpleAtoi(it->second, &v) ? v : fallback;
}

SupervisionEvent& SupervisionEvent::Set(const std::string& key, const std::string& value) {
  fields[key] = value;
  return *this;
}

SupervisionEvent& SupervisionEvent::Set(const std::string& key, int64_t value) {
  fields[key] = absl::StrCat(value);
  return *this;
}

std::string FormatEvent(const SupervisionEvent& e) {
  using namespace std::chrono;
  auto us = duration_cast<microseconds>(e.wall_time.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm;
  gmtime_r(&secs, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  auto quote = [](const std::string& s) {
    if (s.find_first_of(" =\"\\\n") == std::string::npos && !s.empty()) return s;
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') q += '\\';
      q += c == '\n' ? ' ' : c;
    }
    return q + "\"";
  };
  std::string line = absl::StrCat("ts=", ts, ".", absl::Dec(us % 1000000, absl::kZeroPad6),
                                  "Z supervisor=", quote(e.supervisor), " child=", quote(e.child),
                                  " gen=", e.generation, " event=", e.event);
  if (e.cause != ExitCause::kNone || e.pid != 0) absl::StrAppend(&line, " pid=", e.pid);
  if (e.cause != ExitCause::kNone) {
    absl::StrAppend(&line, " cause=", ExitCauseName(e.cause));
    if (e.cause == ExitCause::kExited) absl::StrAppend(&line, " exit_code=", e.exit_code);
  }
  if (e.signal != 0) absl::StrAppend(&line, " signal=", e.signal);
  for (const auto& [key, value] : e.fields) {
    if (!key.empty() && !ReservedKey(key)) absl::StrAppend(&line, " ", key, "=", quote(value));
  }
  if (!e.reason.empty()) absl::StrAppend(&line, " reason=", quote(e.reason));
  if (!e.decision.empty()) absl::StrAppend(&line, " decision=", quote(e.decision));
  return line;
}

bool ParseEvent(const std::string& line, SupervisionEvent* e) {
  SupervisionEvent out;
  bool has_event = false;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    if (i >= line.size()) break;
    const size_t eq = line.find('=', i);
    if (eq == std::string::npos) return false;
    const std::string key = line.substr(i, eq - i);
    std::string value;
    i = eq + 1;
    if (i < line.size() && line[i] == '"') {
      for (++i; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\\' && i + 1 < line.size()) ++i;
        value += line[i];
      }
      if (i >= line.size()) return false;  // unterminated quote
      ++i;
    } else {
      const size_t end = line.find(' ', i);
      value = line.substr(i, end == std::string::npos ? std::string::npos : end - i);
      i = end == std::string::npos ? line.size() : end;
    }
    bool ok = true;
    if (key == "supervisor") {
      out.supervisor = value;
    } else if (key == "child") {
      out.child = value;
    } else if (key == "gen") {
      ok = absl::SimpleAtoi(value, &out.generation);
    } else if (key == "event") {
      out.event = value;
      has_event = true;
    } else if (key == "pid") {
      ok = absl::SimpleAtoi(value, &out.pid);
    } else if (key == "cause") {
      ok = ParseExitCause(value, &out.cause);
    } else if (key == "exit_code") {
      ok = absl::SimpleAtoi(value, &out.exit_code);
    } else if (key == "signal") {
      ok = absl::SimpleAtoi(value, &out.signal);
    } else if (key == "reason") {
      out.reason = value;
    } else if (key == "decision") {
      out.decision = value;
    } else if (key == "ts") {
      absl::Time t;
      std::string err;
      ok = absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", value, &t, &err);
      out.wall_time = absl::ToChronoTime(t);
    } else {
      out.fields[key] = value;
    }
    if (!ok) return false;
  }
  if (!has_event) return false;
  *e = std::move(out);
  return true;
}

SupervisionEvent ProcessExitEvent(const std::string& reaper, const std::string& child, int64_t pid,
                                  int wait_status, bool fenced) {
  SupervisionEvent e;
  e.supervisor = reaper;
  e.child = child;
  e.event = "process_exit";
  e.pid = pid;
  if (WIFEXITED(wait_status)) {
    e.cause = ExitCause::kExited;
    e.exit_code = WEXITSTATUS(wait_status);
    e.reason = absl::StrCat("exited with status ", e.exit_code);
  } else if (WIFSIGNALED(wait_status)) {
    e.cause = ExitCause::kSignaled;
    e.signal = WTERMSIG(wait_status);
    e.reason = absl::StrCat("killed by signal ", e.signal, " (", strsignal(e.signal), ")");
  } else {
    e.cause = ExitCause::kLost;
    e.reason = absl::StrCat("wait status ", wait_status);
  }
  if (fenced) {
    e.cause = ExitCause::kFenced;
    e.reason =
        absl::StrCat("fenced (the head declared it dead for missed heartbeats), then ", e.reason);
  }
  return e;
}

}  // namespace troupe::base
