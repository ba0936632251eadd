// Socket plumbing of the tcp transport: the host's IPv4 devices, the data listener, nonblocking
// connects and the options every connection gets (TCP_NODELAY, keepalive with short timers).
#pragma once

#include <comm/status.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace comm::tl::tcp {

/// What an epoll registration points at. Embedded in every object with a socket in an
/// interface's epoll set.
struct poll_target {
  enum class kind : uint8_t { listener, connection, lingering };
  kind what = kind::listener;
  void* object = nullptr;  ///< the tcp_iface, tcp_conn or lingering_socket
};

/// An IPv4 interface that is up.
struct ipv4_device {
  std::string name;   ///< interface name, e.g. "eth0", "lo"
  uint32_t ipv4 = 0;  ///< its (first) IPv4 address, network byte order
};

/// The devices the tcp transport offers, in preference order: interfaces that are up with an
/// IPv4 address, non-loopback ones first, then loopback. COMM_TCP_DEVICE (a comma-separated list of
/// names) restricts and orders them. Sets `*why` when the list is empty.
std::vector<ipv4_device> usable_devices(std::string* why = nullptr);

/// Dotted text of an IPv4 address in network byte order.
std::string ipv4_text(uint32_t ipv4);

/// Opens a nonblocking listener on ipv4:0 and reports the port the kernel chose; -1 on failure
/// (logged).
int open_listener(uint32_t ipv4, uint16_t* port);

/// Outcome of start_connect.
struct connect_result {
  int fd = -1;             ///< the socket, or -1
  bool connected = false;  ///< the connection is up already (else it is in progress)
  status st = status::ok;  ///< unreachable / io_error when fd is -1
};

/// Starts a nonblocking connect to ipv4:port (network / host byte order) with TCP_NODELAY and
/// keepalive set.
connect_result start_connect(uint32_t ipv4, uint16_t port);

/// The pending error of a socket whose connect finished (SO_ERROR), 0 when it connected.
int socket_error(int fd);

/// Sets TCP_NODELAY (every record goes at once; there is no small-write batching to wait for).
void set_nodelay(int fd);

/// Sets SO_KEEPALIVE with short timers and TCP_USER_TIMEOUT, so a silent peer is noticed within
/// about keepalive_seconds().
void set_keepalive(int fd);

/// Roughly how long a silent peer goes unnoticed.
unsigned keepalive_seconds();

/// Status for a socket error seen while connecting (unreachable) or afterwards (connection_reset).
status status_of_errno(int error, bool connecting);

}  // namespace comm::tl::tcp
