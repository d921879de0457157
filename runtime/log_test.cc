#include "troupe/runtime/log.h"

#include <gtest/gtest.h>

#include "troupe/runtime/config.h"
#include "troupe/runtime/runtime_options.h"

namespace troupe::runtime {
namespace {

TEST(LogTest, LevelNamesRoundTrip) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    LogLevel back = LogLevel::kInfo;
    ASSERT_TRUE(ParseLogLevel(LogLevelName(l), &back)) << LogLevelName(l);
    EXPECT_EQ(back, l);
  }
  LogLevel l;
  EXPECT_FALSE(ParseLogLevel("loud", &l));
}

TEST(LogTest, LinesBelowTheLevelAreDropped) {
  const LogLevel before = GetLogLevel();
  SetLogLevel(LogLevel::kWarn);
  EXPECT_EQ(GetLogLevel(), LogLevel::kWarn);
  testing::internal::CaptureStderr();
  LogInfo("test", "not shown");
  LogWarn("test", "shown");
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("not shown"), std::string::npos) << err;
  EXPECT_NE(err.find("warn"), std::string::npos) << err;
  EXPECT_NE(err.find("troupe test: shown"), std::string::npos) << err;
  SetLogLevel(LogLevel::kDebug);
  testing::internal::CaptureStderr();
  LogDebug("test", "detail");
  err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("troupe test: detail"), std::string::npos) << err;
  SetLogLevel(before);
}

TEST(LogTest, LogLevelIsARuntimeOption) {
  RuntimeOptions ro;
  ConfigRegistry config;
  ro.Register(config);
  EXPECT_EQ(config.Get("log_level"), "info");
  EXPECT_TRUE(config.Set("log_level", "debug").ok());
  EXPECT_EQ(ro.log_level, "debug");
  absl::Status bad = config.Set("log_level", "loud");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.message()).find("log_level"), std::string::npos) << bad;
}

}  // namespace
}  // namespace troupe::runtime
