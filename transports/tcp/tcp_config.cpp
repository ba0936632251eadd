#include "tcp/tcp_config.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace comm::tl::tcp {
namespace {

constexpr const char* log_name = "tcp";
constexpr uint64_t ns_per_ms = 1'000'000;
constexpr uint64_t min_check_period_ns = 250 * ns_per_ms;
constexpr uint64_t max_check_period_ns = 1000 * ns_per_ms;
/// The smallest TCP_RTO_MAX_MS the kernel accepts.
constexpr unsigned min_probe_interval_ms = 1000;

/// The value of `knob` in the environment: its default when unset, malformed or out of range
/// (the last two reported).
unsigned read_knob(const tcp_knob& knob) {
  const char* text = std::getenv(knob.name);
  if (text == nullptr) return knob.default_value;
  char* end = nullptr;
  errno = 0;
  const unsigned long value = std::strtoul(text, &end, 10);
  const bool whole = end != text && *end == '\0' && errno == 0 && text[0] != '-';
  if (!whole || value < knob.min || value > knob.max) {
    COMM_LOG(warn, log_name, "%s=%s ignored: expected %u..%u (%s); using %u", knob.name, text,
             knob.min, knob.max, knob.help, knob.default_value);
    return knob.default_value;
  }
  return static_cast<unsigned>(value);
}

}  // namespace

tcp_config tcp_config::from_environment() {
  tcp_config c;
  c.peer_timeout_s = read_knob(peer_timeout_knob);
  c.stall_timeout_s = read_knob(stall_timeout_knob);
  return c;
}

int tcp_config::keepalive_interval_s() const {
  return std::max(1, static_cast<int>(peer_timeout_s) / (2 * keepalive_probes()));
}

int tcp_config::keepalive_idle_s() const {
  const int probing = keepalive_interval_s() * keepalive_probes();
  return std::max(1, static_cast<int>(peer_timeout_s) - probing);
}

unsigned tcp_config::probe_interval_max_ms() const {
  return std::max(min_probe_interval_ms, peer_timeout_s * 1000u / 4);
}

uint64_t tcp_config::check_period_ns() const {
  uint64_t period = uint64_t{peer_timeout_s} * 1'000'000'000u / 10;
  if (stall_timeout_s != 0) period = std::min(period, stall_timeout_ns() / 4);
  return std::clamp(period, min_check_period_ns, max_check_period_ns);
}

uint32_t tcp_config::silence_limit_ms() const {
  return static_cast<uint32_t>(peer_timeout_s * 1000u - 2 * (check_period_ns() / ns_per_ms));
}

std::string tcp_config::describe() const {
  std::string text = "tcp: ";
  text += peer_timeout_knob.name;
  text += "=" + std::to_string(peer_timeout_s) + " (" + peer_timeout_knob.help + ")\n";
  text += "tcp: ";
  text += stall_timeout_knob.name;
  text += "=" + std::to_string(stall_timeout_s) + " (" + stall_timeout_knob.help + ")\n";
  return text;
}

std::vector<std::string> wanted_device_names() {
  std::vector<std::string> names;
  const char* value = std::getenv(device_variable);
  if (value == nullptr) return names;
  std::stringstream list(value);
  for (std::string name; std::getline(list, name, ',');) {
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

}  // namespace comm::tl::tcp
