#include "framework/log.hpp"

#include <gtest/gtest.h>

namespace writescope {
namespace {

TEST(Log, ParsesLevelNames) {
  EXPECT_EQ(parse_log_level("error"), LogLevel::error);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::warn);
  EXPECT_EQ(parse_log_level("info"), LogLevel::info);
  EXPECT_EQ(parse_log_level("debug"), LogLevel::debug);
  EXPECT_THROW(parse_log_level("verbose"), std::invalid_argument);
}

TEST(Log, FiltersBelowTheLevelAndFormatsOneLine) {
  const LogLevel saved = log_level();
  set_log_level(LogLevel::warn);
  ::testing::internal::CaptureStderr();
  log_info("hidden ", 1);
  log_warn("shown ", 2, " of ", 3.5);
  const std::string text = ::testing::internal::GetCapturedStderr();
  set_log_level(saved);
  EXPECT_EQ(text.find("hidden"), std::string::npos);
  EXPECT_NE(text.find("[warn] shown 2 of 3.5\n"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
}

}  // namespace
}  // namespace writescope
