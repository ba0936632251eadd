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
  (void)reader.list(af_prio_knob);  // checked by parse_families
  c.window = static_cast<uint32_t>(reader.number(window_knob, c.window, min_window, max_window));
  c.peer_timeout_s = static_cast<unsigned>(reader.number(peer_timeout_knob, c.peer_timeout_s, 4, 3600));
  c.stall_timeout_s =
      static_cast<unsigned>(reader.number(stall_timeout_knob, c.stall_timeout_s, 0, 86400));
  c.cm_max_handshakes =
      reader.number(cm_max_handshakes_knob, c.cm_max_handshakes, 1, uint64_t{1} << 20);
  c.cm_hello_timeout_ms = reader.number(cm_hello_timeout_knob, c.cm_hello_timeout_ms, 1, an_hour_ms);
  c.cm_handshake_timeout_ms =
      reader.number(cm_handshake_timeout_knob, c.cm_handshake_timeout_ms, 1, an_hour_ms);
  c.rma = reader.number(rma_knob, c.rma ? 1 : 0, 0, 1) != 0;
  const status st = reader.result(why);
  if (st == status::ok && !parse_families(opts, &c.families, why)) return status::invalid_param;
  *out = std::move(c);
  return st;
}

bool tcp_config::parse_families(const options& opts, std::vector<int>* out, std::string* why) {
  *out = {AF_INET, AF_INET6};
  const auto set = opts.find(af_prio_knob.name);
  if (set == opts.end()) return true;
  std::vector<int> families;
  bool valid = true;
  size_t begin = 0;
  while (valid && begin <= set->second.size()) {
    size_t end = set->second.find(',', begin);
    if (end == std::string::npos) end = set->second.size();
    const std::string item = set->second.substr(begin, end - begin);
    const int family = item == "inet" ? AF_INET : item == "inet6" ? AF_INET6 : AF_UNSPEC;
    valid = family != AF_UNSPEC &&
            std::find(families.begin(), families.end(), family) == families.end();
    families.push_back(family);
    begin = end + 1;
  }
  if (!valid) {
    if (why != nullptr) {
      *why = std::string(af_prio_knob.name) + "=" + set->second +
             " refused: a comma-separated list of distinct inet and inet6 (e.g. inet6,inet)";
    }
    return false;
  }
  *out = std::move(families);
  return true;
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
