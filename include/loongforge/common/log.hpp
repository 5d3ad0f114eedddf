// loongforge/common/log.hpp — one logger per room.
//
// Contract:
//  - logger("config") returns the same Logger for the same room name; lines
//    go to stderr as "[time] [loongforge.room] [level] text".
//  - Log at warn only for what an operator must act on.
//  - Thread-safe. spdlog does the work behind this header, which includes no
//    spdlog or fmt header on purpose: libtorch ships its own fmt (12.x) and
//    its include path must never meet spdlog's (Note [fmt versions]).
//
// Example:
//   LF_LOG(logger("model"), info) << "loaded " << path << " (" << n << " params)";
//
// Note [fmt versions]: the torch wheel's include/ has fmt 12; Debian's spdlog
// 1.10 needs fmt 9 and Ubuntu's 1.12 fmt 9/10. A translation unit that sees
// both fails to compile, so only src/common/log.cpp includes spdlog.
#pragma once

#include <sstream>  // std::ostringstream
#include <string>   // std::string

namespace loongforge {

enum class LogLevel { trace, debug, info, warn, error, off };

class Logger {
 public:
  explicit Logger(std::string room) : room_(std::move(room)) {}
  bool enabled(LogLevel level) const;
  void write(LogLevel level, const std::string& text) const;
  const std::string& room() const { return room_; }

 private:
  std::string room_;
};

// `room` is a string literal ("config", "data", ...): the Logger lives forever.
const Logger& logger(const char* room);

// Sets the level of every room ("trace", "debug", "info", "warn", "error",
// "off"). Throws ConfigError on an unknown name.
void set_log_level(const std::string& level);

// One log line, written when it goes out of scope (see LF_LOG).
class LogLine {
 public:
  LogLine(const Logger& logger, LogLevel level) : logger_(logger), level_(level) {}
  ~LogLine() { logger_.write(level_, out_.str()); }
  template <typename T>
  LogLine& operator<<(const T& value) {
    out_ << value;
    return *this;
  }

 private:
  const Logger& logger_;
  LogLevel level_;
  std::ostringstream out_;
};

}  // namespace loongforge

// Builds the line only when the level is enabled. (A one-pass for loop, not
// an if/else, so `if (x) LF_LOG(...) << ...;` has no dangling else.)
#define LF_LOG(lg, level)                                                                   \
  for (bool lf_log_once_ = (lg).enabled(::loongforge::LogLevel::level); lf_log_once_;       \
       lf_log_once_ = false)                                                                \
  ::loongforge::LogLine((lg), ::loongforge::LogLevel::level)
