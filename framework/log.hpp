#pragma once
// Leveled logging to stderr with wall-clock timestamps.
//
// The level comes from WRITESCOPE_LOG_LEVEL (error, warn, info, debug; default
// info) or set_log_level(). Messages are written whole, one line each, so
// concurrent threads never interleave within a line.

#include <ctime>
#include <sstream>
#include <string>
#include <string_view>

namespace writescope {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

/// Parses "error" | "warn" | "info" | "debug"; throws std::invalid_argument otherwise.
LogLevel parse_log_level(std::string_view name);
void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, std::string_view message);
/// Now in UTC, ISO 8601 to the second ("2026-12-07T01:23:45Z"): results' time stamps.
std::string utc_time_now();
/// `when` in the same form.
std::string utc_time(std::time_t when);

namespace impl {
template <class... Args>
void log_concat(LogLevel level, const Args&... args) {
  if (level > log_level()) return;
  std::ostringstream line;
  (line << ... << args);
  log_message(level, line.str());
}
}  // namespace impl

template <class... Args>
void log_error(const Args&... args) { impl::log_concat(LogLevel::error, args...); }
template <class... Args>
void log_warn(const Args&... args) { impl::log_concat(LogLevel::warn, args...); }
template <class... Args>
void log_info(const Args&... args) { impl::log_concat(LogLevel::info, args...); }
template <class... Args>
void log_debug(const Args&... args) { impl::log_concat(LogLevel::debug, args...); }

}  // namespace writescope
