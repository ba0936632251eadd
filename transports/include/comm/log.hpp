// Levelled logging, one line per event. Below `debug` nothing is evaluated on the hot path: the
// level check is a single load of a global.
#pragma once

#include <atomic>

namespace comm {

/// Log levels, selected with COMM_LOG_LEVEL=error|warn|info|debug|trace.
enum class log_level : int { error = 0, warn = 1, info = 2, debug = 3, trace = 4 };

namespace detail {
extern std::atomic<int> current_log_level;
}

/// True when messages at `level` are printed.
inline bool log_enabled(log_level level) noexcept {
  return static_cast<int>(level) <= detail::current_log_level.load(std::memory_order_relaxed);
}

/// Sets the level (also read from COMM_LOG_LEVEL at start-up).
void set_log_level(log_level level) noexcept;

/// Writes one line "[comm <level> <pid>] <component>: <message>" to stderr.
void log_line(log_level level, const char* component, const char* fmt, ...) noexcept
  __attribute__((format(printf, 3, 4)));

}  // namespace comm

/// Logs `fmt` at `lvl` (error, warn, info, debug, trace) for `component` when enabled.
#define COMM_LOG(lvl, component, ...)                                         \
  do {                                                                        \
    if (::comm::log_enabled(::comm::log_level::lvl))                          \
      ::comm::log_line(::comm::log_level::lvl, component, __VA_ARGS__);       \
  } while (0)
