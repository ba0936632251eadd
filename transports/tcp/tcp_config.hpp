// The tcp transport's own configuration: its COMM_TCP_* environment variables with their defaults,
// limits and help text, and the socket timings derived from them. An interface reads them once,
// when it opens.
//
//   COMM_TCP_DEVICE         comma-separated interface names to use, in that order (default: every
//                           IPv4 interface that is up, loopback last)
//   COMM_TCP_PEER_TIMEOUT   seconds a peer's host may leave our data, window probes and keepalives
//                           unanswered before its endpoints fail with ENDPOINT_TIMEOUT (4..3600,
//                           default 11). Only the host's kernel has to answer: a peer process that
//                           is stopped or busy keeps its connection however long it stalls.
//   COMM_TCP_STALL_TIMEOUT  seconds a peer process may leave our messages undelivered without
//                           answering a heartbeat before its endpoints fail with ENDPOINT_TIMEOUT
//                           (0..86400, default 0: never; a stalled peer loses nothing).
//
// A malformed or out-of-range value is reported at level warn and the default is used.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace comm::tl::tcp {

/// One numeric COMM_TCP_* variable: its name, what it means, its default and its limits.
struct tcp_knob {
  const char* name;        ///< the environment variable
  const char* help;        ///< what it means, for warnings and info()
  unsigned default_value;  ///< when unset, malformed or out of range
  unsigned min;            ///< smallest value accepted
  unsigned max;            ///< largest value accepted
};

/// COMM_TCP_PEER_TIMEOUT (seconds).
inline constexpr tcp_knob peer_timeout_knob{
    "COMM_TCP_PEER_TIMEOUT",
    "seconds a peer's host may leave data, window probes and keepalives unanswered", 11, 4, 3600};
/// COMM_TCP_STALL_TIMEOUT (seconds, 0 = never).
inline constexpr tcp_knob stall_timeout_knob{
    "COMM_TCP_STALL_TIMEOUT",
    "seconds a peer process may leave our messages undelivered, 0 for never", 0, 0, 86400};
/// COMM_TCP_DEVICE (a list of interface names).
inline constexpr const char* device_variable = "COMM_TCP_DEVICE";

/// The knobs of one interface and the timings derived from them.
struct tcp_config {
  unsigned peer_timeout_s = peer_timeout_knob.default_value;    ///< COMM_TCP_PEER_TIMEOUT
  unsigned stall_timeout_s = stall_timeout_knob.default_value;  ///< COMM_TCP_STALL_TIMEOUT

  /// The knobs as the environment sets them (malformed values warned about and ignored).
  static tcp_config from_environment();

  /// Keepalive of an idle connection: first probe after this many idle seconds, then
  /// keepalive_probes() probes keepalive_interval_s() apart; all of it within the peer timeout.
  int keepalive_idle_s() const;
  int keepalive_interval_s() const;
  static constexpr int keepalive_probes() { return 3; }

  /// Longest interval between the kernel's window probes and retransmissions (TCP_RTO_MAX_MS), so
  /// a live peer's kernel answers several times within the peer timeout.
  unsigned probe_interval_max_ms() const;

  /// How often an interface checks its connections while any waits for its peer.
  uint64_t check_period_ns() const;

  /// A connection whose kernel has waited this long for any answer of the peer's host, with a
  /// window probe or retransmission unanswered at two checks in a row, has a silent peer: found
  /// within the peer timeout.
  uint32_t silence_limit_ms() const;

  /// COMM_TCP_STALL_TIMEOUT in nanoseconds; 0 when stalled peers are waited for forever.
  uint64_t stall_timeout_ns() const { return uint64_t{stall_timeout_s} * 1'000'000'000u; }

  /// One line per knob with its value, for info().
  std::string describe() const;
};

/// The names in COMM_TCP_DEVICE, or empty when it is unset.
std::vector<std::string> wanted_device_names();

}  // namespace comm::tl::tcp
