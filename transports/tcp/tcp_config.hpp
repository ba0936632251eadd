// The tcp transport's own configuration: its COMM_TCP_* variables with their defaults, limits and
// help text, and the socket timings derived from them. Read from the options an interface or
// connection manager is opened with (iface_params::opts, cm_params::opts).
//
//   COMM_TCP_DEVICE         comma-separated interface names to use, in that order (default: every
//                           interface that is up with an address of COMM_TCP_AF_PRIO's families,
//                           loopback last)
//   COMM_TCP_AF_PRIO        the address families an interface may use, in order of preference:
//                           "inet", "inet6" (default "inet,inet6": a device's IPv4 address when it
//                           has one, else its IPv6 address; "inet6" alone: IPv6 only). Interfaces
//                           reach peers of their own family.
//   COMM_TCP_WINDOW         frames a sender may have undelivered per connection (2..1048576,
//                           default 65536); iface_params::fifo_size wins over it. The kernel's
//                           socket buffers bound what a peer that does not read costs; the window
//                           only has to stay out of the way of a receiver that is descheduled for
//                           a moment: 256 frames held a stream of 8-byte messages to a tenth of
//                           UCX's rate on a loaded machine, 4096 to a third, 16384 and up kept
//                           up with it (bench/compare_ucx.sh -t tcp, tag_bw 8 B)
//   COMM_TCP_PEER_TIMEOUT   seconds a peer's host may leave our data, window probes and keepalives
//                           unanswered before its endpoints fail with ENDPOINT_TIMEOUT (4..3600,
//                           default 11). Only the host's kernel has to answer: a peer process that
//                           is stopped or busy keeps its connection however long it stalls.
//   COMM_TCP_STALL_TIMEOUT  seconds a peer process may leave our messages undelivered without
//                           answering a heartbeat before its endpoints fail with ENDPOINT_TIMEOUT
//                           (0..86400, default 0: never; a stalled peer loses nothing).
//   COMM_TCP_CM_*           the connection manager's limits on unauthenticated handshakes
//                           (tcp_cm.hpp).
//
// A malformed, out-of-range or unknown COMM_TCP_* value is refused: the interface or connection
// manager does not open, and the message names the variable.
#pragma once

#include <comm/transport/options.hpp>

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace comm::tl::tcp {

/// COMM_TCP_DEVICE.
inline constexpr knob device_knob{
    "COMM_TCP_DEVICE", "comma-separated interfaces to use, in that order",
    "every interface that is up, loopback last"};
/// COMM_TCP_AF_PRIO.
inline constexpr knob af_prio_knob{
    "COMM_TCP_AF_PRIO",
    "address families an interface may use, preferred first: inet, inet6 (comma-separated)",
    "inet,inet6"};
/// COMM_TCP_WINDOW.
inline constexpr knob window_knob{
    "COMM_TCP_WINDOW", "frames a sender may have undelivered per connection, 2..1048576",
    "65536"};
/// COMM_TCP_PEER_TIMEOUT (seconds).
inline constexpr knob peer_timeout_knob{
    "COMM_TCP_PEER_TIMEOUT",
    "seconds a peer's host may leave data, window probes and keepalives unanswered, 4..3600", "11"};
/// COMM_TCP_STALL_TIMEOUT (seconds, 0 = never).
inline constexpr knob stall_timeout_knob{
    "COMM_TCP_STALL_TIMEOUT",
    "seconds a peer process may leave our messages undelivered, 0 for never, 0..86400", "0"};
/// COMM_TCP_CM_MAX_HANDSHAKES.
inline constexpr knob cm_max_handshakes_knob{
    "COMM_TCP_CM_MAX_HANDSHAKES",
    "unauthenticated connection-manager handshakes held at once, 1..1048576", "1024"};
/// COMM_TCP_CM_HELLO_TIMEOUT (ms).
inline constexpr knob cm_hello_timeout_knob{
    "COMM_TCP_CM_HELLO_TIMEOUT", "ms a connection-manager client has to send its hello, 1..3600000",
    "3000"};
/// COMM_TCP_CM_HANDSHAKE_TIMEOUT (ms).
inline constexpr knob cm_handshake_timeout_knob{
    "COMM_TCP_CM_HANDSHAKE_TIMEOUT",
    "ms a connection-manager client has to complete its request, 1..3600000", "10000"};
/// COMM_TCP_RMA (0 or 1; on by default).
inline constexpr knob rma_knob{
    "COMM_TCP_RMA",
    "1: offer put and get (emulated over the connection, no copy), which rendezvous then uses; "
    "0: none, 0..1",
    "1"};
/// Every knob of tcp.
inline constexpr std::array<knob, 9> tcp_knobs{
    device_knob,           af_prio_knob,           window_knob,
    peer_timeout_knob,     stall_timeout_knob,     cm_max_handshakes_knob,
    cm_hello_timeout_knob, cm_handshake_timeout_knob, rma_knob};

/// The knobs of one interface or connection manager and the timings derived from them.
struct tcp_config {
  std::vector<std::string> devices;   ///< COMM_TCP_DEVICE, empty when unset
  std::vector<int> families{AF_INET, AF_INET6};  ///< COMM_TCP_AF_PRIO (AF_INET, AF_INET6)
  uint32_t window = 65536;            ///< COMM_TCP_WINDOW
  unsigned peer_timeout_s = 11;       ///< COMM_TCP_PEER_TIMEOUT
  unsigned stall_timeout_s = 0;       ///< COMM_TCP_STALL_TIMEOUT
  uint64_t cm_max_handshakes = 1024;  ///< COMM_TCP_CM_MAX_HANDSHAKES
  uint64_t cm_hello_timeout_ms = 3000;       ///< COMM_TCP_CM_HELLO_TIMEOUT
  uint64_t cm_handshake_timeout_ms = 10000;  ///< COMM_TCP_CM_HANDSHAKE_TIMEOUT
  bool rma = true;                           ///< COMM_TCP_RMA

  /// The knobs `opts` sets into `*out`: ok, or invalid_param with the refusal in `*why`.
  static status parse(const options& opts, tcp_config* out, std::string* why);

  /// COMM_TCP_AF_PRIO as `opts` sets it (AF_INET, AF_INET6 in order); false with the refusal in
  /// `*why` for a value that is not a list of distinct "inet" and "inet6".
  static bool parse_families(const options& opts, std::vector<int>* out, std::string* why);

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

  /// One line per liveness knob with its value, for info().
  std::string describe() const;
};

}  // namespace comm::tl::tcp
