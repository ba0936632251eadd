#include "tcp/tcp_config.hpp"
#include "tcp/tcp_wire.hpp"

#include <algorithm>

namespace comm::tl::tcp {
namespace {

constexpr uint64_t ns_per_ms = 1'000'000;
constexpr uint64_t min_check_period_ns = 250 * ns_per_ms;
constexpr uint64_t max_check_period_ns = 1000 * ns_per_ms;
/// The smallest TCP_RTO_MAX_MS the kernel accepts.
constexpr unsigned min_probe_interval_ms = 1000;

}  // namespace

status tcp_config::parse(const options& opts, tcp_config* out, std::string* why) {
  constexpr uint64_t an_hour_ms = 3600 * 1000;
  option_reader reader("tcp", tcp_knobs, opts);
  tcp_config c;
  c.devices = reader.list(device_knob);
  c.window = static_cast<uint32_t>(reader.number(window_knob, c.window, min_window, max_window));
  c.peer_timeout_s = static_cast<unsigned>(reader.number(peer_timeout_knob, c.peer_timeout_s, 4, 3600));
  c.stall_timeout_s =
      static_cast<unsigned>(reader.number(stall_timeout_knob, c.stall_timeout_s, 0, 86400));
  c.cm_max_handshakes =
      reader.number(cm_max_handshakes_knob, c.cm_max_handshakes, 1, uint64_t{1} << 20);
  c.cm_hello_timeout_ms = reader.number(cm_hello_timeout_knob, c.cm_hello_timeout_ms, 1, an_hour_ms);
  c.cm_handshake_timeout_ms =
      reader.number(cm_handshake_timeout_knob, c.cm_handshake_timeout_ms, 1, an_hour_ms);
  *out = std::move(c);
  return reader.result(why);
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

}  // namespace comm::tl::tcp
