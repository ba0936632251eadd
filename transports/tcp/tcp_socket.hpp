// Socket plumbing of the tcp transport: the host's devices (IPv4 and IPv6), the data listener,
// nonblocking connects, the options every connection gets (TCP_NODELAY, keepalive and a cap on the kernel's
// probe interval, see set_liveness) and what the kernel knows about the peer's host (TCP_INFO).
#pragma once

#include "tcp/tcp_address.hpp"
#include "tcp/tcp_config.hpp"

#include <comm/status.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace comm::tl::tcp {

/// What an epoll registration points at. Embedded in every object with a socket in an
/// interface's epoll set.
struct poll_target {
  enum class kind : uint8_t { listener, connection, lingering, timer };
  kind what = kind::listener;
  void* object = nullptr;  ///< the tcp_iface (listener, timer), tcp_conn or lingering_socket
};

/// An interface that is up, with the address the tcp transport uses on it.
struct net_device {
  std::string name;      ///< interface name, e.g. "eth0", "lo"
  ip_address address;    ///< its address of the preferred family (scope set when link-local)
  unsigned index = 0;    ///< interface index
};

/// The devices the tcp transport offers, in preference order: interfaces that are up with an
/// address of one of `families` (AF_INET, AF_INET6; COMM_TCP_AF_PRIO), each with its address of
/// the first family it has (for IPv6 a global one before a link-local one); family by family,
/// non-loopback ones first, then loopback. A non-empty `wanted` (the names COMM_TCP_DEVICE
/// lists) restricts and orders them. Sets `*why` when the result is empty.
std::vector<net_device> usable_devices(const std::vector<std::string>& wanted,
                                       const std::vector<int>& families,
                                       std::string* why = nullptr);

/// Opens a nonblocking listener on address:0 and reports the port the kernel chose; -1 on failure
/// (logged).
int open_listener(const ip_address& address, uint16_t* port);

/// Outcome of start_connect.
struct connect_result {
  int fd = -1;                ///< the socket, or -1
  bool connected = false;     ///< the connection is up already (else it is in progress)
  status st = status::ok;     ///< unreachable / io_error when fd is -1
  bool probes_capped = true;  ///< set_liveness could cap the probe interval
};

/// Starts a nonblocking connect to address:port (port in host byte order) with TCP_NODELAY and the
/// liveness options of `config` set.
connect_result start_connect(const ip_address& address, uint16_t port, const tcp_config& config);

/// The pending error of a socket whose connect finished (SO_ERROR), 0 when it connected.
int socket_error(int fd);

/// Sets TCP_NODELAY (every record goes at once; there is no small-write batching to wait for).
void set_nodelay(int fd);

/// Sets what lets the kernel tell a silent host from a stalled process within the peer timeout of
/// `config`: keepalive of an idle connection (the peer's kernel answers it, also while the process
/// is stopped) and a cap on the interval of window probes and retransmissions (TCP_RTO_MAX_MS,
/// Linux 6.15 and later), so the kernel keeps asking the peer's host at least that often.
/// TCP_USER_TIMEOUT is not set: Linux applies it to a zero window too, so a receiver that stops
/// reading for that long would be cut off although its kernel answers every probe. Returns false
/// when the kernel has no TCP_RTO_MAX_MS (its probes back off to 120 s apart).
bool set_liveness(int fd, const tcp_config& config);

/// What the kernel knows about a connection's peer host.
struct peer_answers {
  bool waiting = false;      ///< bytes of ours wait for the peer: unacknowledged or not yet sent
  bool asking = false;       ///< a window probe or a retransmission is unanswered
  uint32_t silent_ms = 0;    ///< since the peer's host last acknowledged anything
};

/// Reads TCP_INFO of `fd`; false when the kernel does not say (the socket's error comes by epoll).
bool read_peer_answers(int fd, peer_answers* out);

/// Status for a socket error seen while connecting (unreachable) or afterwards: endpoint_timeout
/// when the peer's host stopped answering (ETIMEDOUT, EHOSTUNREACH, ENETUNREACH), else
/// connection_reset.
status status_of_errno(int error, bool connecting);

}  // namespace comm::tl::tcp
