// IP addresses as the tcp transport and its connection manager use them: IPv4 and IPv6 (a
// link-local IPv6 address with the scope, the index of the interface it is on), their text, the
// parsing of "host:port" and the interface that owns a local address.
//
// Text: "10.0.0.1:7000", "[::1]:7000", "[fe80::1%eth0]:7000". An IPv4 address a dual-stack socket
// reports as IPv4-mapped IPv6 (::ffff:10.0.0.1) is turned back into IPv4 when it is read, so a
// peer has one text and one identity whichever socket saw it.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

namespace comm::tl::tcp {

/// An IPv4 or IPv6 address without a port.
struct ip_address {
  int family = AF_UNSPEC;  ///< AF_INET, AF_INET6, or AF_UNSPEC for none
  uint8_t bytes[16] = {};  ///< IPv4: the first 4 (network order), the rest zero; IPv6: all 16
  uint32_t scope = 0;      ///< IPv6 link-local: the index of the interface it is reached on

  /// The IPv4 address `network_order`.
  static ip_address v4(uint32_t network_order);
  /// The IPv6 address in `bytes` (16), with `scope` (an interface index, 0 for none).
  static ip_address v6(const uint8_t* bytes, uint32_t scope = 0);
  /// The address of an AF_INET or AF_INET6 socket address (IPv4-mapped IPv6 becomes IPv4); an
  /// address of family AF_UNSPEC for anything else.
  static ip_address of(const sockaddr* address);
  /// The address of `storage`, as of().
  static ip_address of(const sockaddr_storage& storage);

  bool is_v4() const { return family == AF_INET; }
  bool is_v6() const { return family == AF_INET6; }
  /// The IPv4 address in network order (0 unless is_v4()).
  uint32_t ipv4() const;
  /// 127.0.0.0/8 or ::1.
  bool loopback() const;
  /// fe80::/10.
  bool link_local() const;
  /// 0.0.0.0 or :: (the wildcard), or no address at all.
  bool unspecified() const;
  /// The address alone: "10.0.0.1", "::1", "fe80::1%eth0" (the scope by interface name).
  std::string text() const;
  /// The socket address of this address and `port` (host order); `*length` is its size.
  sockaddr_storage with_port(uint16_t port, socklen_t* length) const;
  /// Same family, bytes and scope.
  bool operator==(const ip_address& other) const;
};

/// "10.0.0.1:7000" or "[::1]:7000" (port in host order).
std::string address_text(const ip_address& address, uint16_t port);
/// The text of an AF_INET or AF_INET6 socket address, as address_text; "?" for another family.
std::string address_text(const sockaddr_storage& address);
/// The port of an AF_INET or AF_INET6 socket address (host order), 0 for another family.
uint16_t port_of(const sockaddr_storage& address);

/// Splits "host:port", "[v6]:port", ":port", "[v6]", "host" or "" into a host (brackets removed;
/// "0.0.0.0" when empty or "*") and a port (0 when absent). A host of more than one ':' without
/// brackets is an IPv6 literal without a port. False when the text is malformed (a bracket not
/// closed, text after it that is not ":port", a port that is not a number up to 65535).
bool split_host_port(const std::string& text, std::string* host, uint16_t* port);

/// Parses a numeric host ("10.0.0.1", "::1", "fe80::1%eth0"); false for a name.
bool parse_numeric_host(const std::string& host, ip_address* out);

/// Resolves `host` (numeric, or a name through the system resolver: blocking) to its addresses in
/// the resolver's order (IPv4 and IPv6, no duplicates); empty when it does not resolve.
std::vector<ip_address> resolve_host(const std::string& host);

/// The name of the local interface that has `address` (or, failing that, whose subnet holds it:
/// 127.0.0.2 is on "lo"); empty when none does.
std::string interface_of(const ip_address& address);

/// The local address a connection to `target` would start from (the route's source, found with a
/// datagram socket: nothing is sent). False with `*error` set (an errno value) when there is no
/// route.
bool route_source(const ip_address& target, ip_address* source, int* error);

}  // namespace comm::tl::tcp
