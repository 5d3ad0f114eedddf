// Per-room loggers sharing one stderr sink. The only file that includes
// spdlog (Note [fmt versions] in log.hpp).
#include "loongforge/common/log.hpp"

#include <atomic>  // std::atomic
#include <map>     // std::map
#include <memory>  // std::unique_ptr
#include <mutex>   // std::mutex

#include <spdlog/sinks/stdout_color_sinks.h>  // stderr_color_sink_mt
#include <spdlog/spdlog.h>                    // spdlog::logger

#include "loongforge/common/error.hpp"

namespace loongforge {

namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::info)};

spdlog::level::level_enum to_spdlog(LogLevel l) {
  switch (l) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

std::shared_ptr<spdlog::logger> backend(const std::string& room) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<spdlog::logger>> loggers;
  static auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = loggers[room];
  if (!slot) {
    slot = std::make_shared<spdlog::logger>("loongforge." + room, sink);
    slot->set_level(spdlog::level::trace);  // filtering happens in Logger::enabled
    slot->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  }
  return slot;
}

}  // namespace

bool Logger::enabled(LogLevel level) const { return static_cast<int>(level) >= g_level.load(); }

void Logger::write(LogLevel level, const std::string& text) const { backend(room_)->log(to_spdlog(level), text); }

const Logger& logger(const char* room) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Logger>> loggers;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = loggers[room];
  if (!slot) slot = std::make_unique<Logger>(room);
  return *slot;
}

void set_log_level(const std::string& level) {
  static const std::map<std::string, LogLevel> names = {{"trace", LogLevel::trace}, {"debug", LogLevel::debug},
                                                        {"info", LogLevel::info},   {"warn", LogLevel::warn},
                                                        {"error", LogLevel::error}, {"off", LogLevel::off}};
  auto it = names.find(level);
  if (it == names.end())
    throw ConfigError("unknown log level '" + level + "': use trace, debug, info, warn, error or off");
  g_level = static_cast<int>(it->second);
}

}  // namespace loongforge
