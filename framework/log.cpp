#include "framework/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <stdexcept>

namespace writescope {
namespace {

LogLevel level_from_environment() {
  const char* name = std::getenv("WRITESCOPE_LOG_LEVEL");
  if (name == nullptr || *name == '\0') return LogLevel::info;
  try {
    return parse_log_level(name);
  } catch (const std::invalid_argument&) {
    std::fprintf(stderr, "writescope: ignoring WRITESCOPE_LOG_LEVEL='%s' (expected error, warn, info or debug)\n",
                 name);
    return LogLevel::info;
  }
}

std::atomic<LogLevel>& current_level() {
  static std::atomic<LogLevel> level{level_from_environment()};
  return level;
}

constexpr const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "?";
}

}  // namespace

LogLevel parse_log_level(std::string_view name) {
  if (name == "error") return LogLevel::error;
  if (name == "warn") return LogLevel::warn;
  if (name == "info") return LogLevel::info;
  if (name == "debug") return LogLevel::debug;
  throw std::invalid_argument("unknown log level '" + std::string(name) +
                              "' (expected error, warn, info or debug)");
}

void set_log_level(LogLevel level) { current_level().store(level); }
LogLevel log_level() { return current_level().load(); }

std::string utc_time_now() { return utc_time(std::time(nullptr)); }

std::string utc_time(std::time_t when) {
  std::tm utc{};
  gmtime_r(&when, &utc);
  char text[32] = {};
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

void log_message(LogLevel level, std::string_view message) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &utc);
  std::string line = std::string(stamp) + "." + (millis < 100 ? (millis < 10 ? "00" : "0") : "") +
                     std::to_string(millis) + " [" + level_tag(level) + "] " + std::string(message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace writescope
