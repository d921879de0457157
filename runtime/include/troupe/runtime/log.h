// troupe/runtime/log.h — the one way troupe's processes write diagnostics: leveled lines on
// stderr (spdlog underneath; no spdlog or fmt in this header).
//
//   troupe::runtime::LogWarn("node n1", "lost the head; stopping workers");
//   // 2026-11-23 10:00:00.123 warn  troupe node n1: lost the head; stopping workers
//
// The level comes from --log_level / TROUPE_LOG_LEVEL (RuntimeOptions::log_level, applied by
// Runtime::Create) or SetLogLevel; lines below it are dropped. Thread-safe. What a user asked for
// (a command's result, `--help`) goes to stdout as before; structured records of what happened
// to processes and jobs are events (events.h), not log lines.
#ifndef TROUPE_RUNTIME_LOG_H_
#define TROUPE_RUNTIME_LOG_H_

#include <string>

namespace troupe::runtime {

enum class LogLevel {
  kDebug,  // detail for whoever debugs troupe itself
  kInfo,   // a process's milestones (joined, listening)
  kWarn,   // something went wrong and troupe goes on (a lost peer, a refused join)
  kError,  // this process cannot do what it was asked (bad options, cannot connect)
};
// "debug", "info", "warn", "error".
const char* LogLevelName(LogLevel level);
// The inverse of LogLevelName; false for an unknown name.
bool ParseLogLevel(const std::string& name, LogLevel* level);

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();

// One line: time, level, "troupe <who>: <message>".
void Log(LogLevel level, const std::string& who, const std::string& message);
inline void LogDebug(const std::string& who, const std::string& m) {
  Log(LogLevel::kDebug, who, m);
}
inline void LogInfo(const std::string& who, const std::string& m) { Log(LogLevel::kInfo, who, m); }
inline void LogWarn(const std::string& who, const std::string& m) { Log(LogLevel::kWarn, who, m); }
inline void LogError(const std::string& who, const std::string& m) {
  Log(LogLevel::kError, who, m);
}

// One line for the user on stdout ("troupe node n1: joined …"), written whole and flushed: a
// role's actors print to the same stdout from their own threads (aout), and a line written in
// pieces can come out with one of theirs inside it (a test once read "listening on
// 10.77.1.2:troupe-head: store epoch 1…45049" and found no address).
void PrintLine(const std::string& line);

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_LOG_H_
