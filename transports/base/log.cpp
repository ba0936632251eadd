#include <comm/log.hpp>

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace comm {
namespace {

int level_from_environment() {
  const char* value = std::getenv("COMM_LOG_LEVEL");
  if (value == nullptr) return static_cast<int>(log_level::warn);
  static const char* const names[] = {"error", "warn", "info", "debug", "trace"};
  for (int i = 0; i < 5; ++i) {
    if (std::strcmp(value, names[i]) == 0) return i;
  }
  std::fprintf(stderr, "[comm warn] COMM_LOG_LEVEL=%s is not one of error|warn|info|debug|trace\n",
               value);
  return static_cast<int>(log_level::warn);
}

const char* level_name(log_level level) {
  switch (level) {
    case log_level::error: return "error";
    case log_level::warn: return "warn";
    case log_level::info: return "info";
    case log_level::debug: return "debug";
    case log_level::trace: return "trace";
  }
  return "?";
}

}  // namespace

namespace detail {
std::atomic<int> current_log_level{level_from_environment()};
}

void set_log_level(log_level level) noexcept {
  detail::current_log_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

void log_line(log_level level, const char* component, const char* fmt, ...) noexcept {
  char text[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof(text), fmt, args);
  va_end(args);
  std::fprintf(stderr, "[comm %s %d] %s: %s\n", level_name(level), static_cast<int>(getpid()),
               component, text);
}

}  // namespace comm
