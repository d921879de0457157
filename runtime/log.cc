#include "troupe/runtime/log.h"

#include <cstdio>
#include <memory>

#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace troupe::runtime {
namespace {

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

// Unbuffered stderr, one logger per process (not spdlog's registry: embedding programs may use
// spdlog themselves).
spdlog::logger& Logger() {
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("troupe", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("%Y-%m-%d %H:%M:%S.%e %-5l %v");
    l->set_level(spdlog::level::info);
    l->flush_on(spdlog::level::debug);
    return l;
  }();
  return *logger;
}

}  // namespace

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

bool ParseLogLevel(const std::string& name, LogLevel* level) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    if (name == LogLevelName(l)) {
      *level = l;
      return true;
    }
  }
  return false;
}

void SetLogLevel(LogLevel level) { Logger().set_level(ToSpdlog(level)); }

LogLevel GetLogLevel() {
  switch (Logger().level()) {
    case spdlog::level::trace:
    case spdlog::level::debug:
      return LogLevel::kDebug;
    case spdlog::level::info:
      return LogLevel::kInfo;
    case spdlog::level::warn:
      return LogLevel::kWarn;
    default:
      return LogLevel::kError;
  }
}

void Log(LogLevel level, const std::string& who, const std::string& message) {
  spdlog::logger& l = Logger();
  const spdlog::level::level_enum lvl = ToSpdlog(level);
  if (!l.should_log(lvl)) return;
  l.log(lvl, "troupe {}: {}", who, message);
}

void PrintLine(const std::string& line) {
  const std::string whole = line + "\n";
  // One fwrite holds stdout's lock for the whole line; std::cout, synced with stdio, writes there
  // too, and so do CAF's aout lines.
  std::fwrite(whole.data(), 1, whole.size(), stdout);
  std::fflush(stdout);
}

}  // namespace troupe::runtime
