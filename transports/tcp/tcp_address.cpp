#include "tcp/tcp_address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace comm::tl::tcp {
namespace {

/// The first 12 bytes of an IPv4-mapped IPv6 address (::ffff:a.b.c.d).
constexpr uint8_t v4_mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

bool all_zero(const uint8_t* bytes, size_t length) {
  return std::all_of(bytes, bytes + length, [](uint8_t b) { return b == 0; });
}

/// True when the first `prefix_bits` bits of `a` and `b` (`length` bytes each) are equal.
bool same_prefix(const uint8_t* a, const uint8_t* b, size_t length, unsigned prefix_bits) {
  for (size_t i = 0; i < length && prefix_bits > 0; ++i) {
    const unsigned bits = std::min(prefix_bits, 8u);
    const auto mask = static_cast<uint8_t>(0xff << (8 - bits));
    if ((a[i] & mask) != (b[i] & mask)) return false;
    prefix_bits -= bits;
  }
  return true;
}

/// Bits set in a netmask of `length` bytes.
unsigned prefix_length(const uint8_t* mask, size_t length) {
  unsigned bits = 0;
  for (size_t i = 0; i < length; ++i) bits += static_cast<unsigned>(__builtin_popcount(mask[i]));
  return bits;
}

/// Bytes of the address part of `family`.
size_t address_length(int family) { return family == AF_INET ? 4 : 16; }

}  // namespace

// -- ip_address -----------------------------------------------------------------------------------

ip_address ip_address::v4(uint32_t network_order) {
  ip_address a;
  a.family = AF_INET;
  std::memcpy(a.bytes, &network_order, 4);
  return a;
}

ip_address ip_address::v6(const uint8_t* bytes, uint32_t scope) {
  ip_address a;
  if (std::memcmp(bytes, v4_mapped_prefix, sizeof(v4_mapped_prefix)) == 0) {
    uint32_t ipv4 = 0;
    std::memcpy(&ipv4, bytes + 12, 4);
    return v4(ipv4);
  }
  a.family = AF_INET6;
  std::memcpy(a.bytes, bytes, 16);
  a.scope = scope;
  return a;
}

ip_address ip_address::of(const sockaddr* address) {
  if (address == nullptr) return {};
  if (address->sa_family == AF_INET) {
    return v4(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr);
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    return v6(in6->sin6_addr.s6_addr, in6->sin6_scope_id);
  }
  return {};
}

ip_address ip_address::of(const sockaddr_storage& storage) {
  return of(reinterpret_cast<const sockaddr*>(&storage));
}

uint32_t ip_address::ipv4() const {
  uint32_t value = 0;
  if (is_v4()) std::memcpy(&value, bytes, 4);
  return value;
}

bool ip_address::loopback() const {
  if (is_v4()) return bytes[0] == 127;
  static const uint8_t v6_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return is_v6() && std::memcmp(bytes, v6_loopback, 16) == 0;
}

bool ip_address::link_local() const {
  return is_v6() && bytes[0] == 0xfe && (bytes[1] & 0xc0) == 0x80;
}

bool ip_address::unspecified() const {
  return family == AF_UNSPEC || all_zero(bytes, address_length(family));
}

std::string ip_address::text() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (family != AF_INET && family != AF_INET6) return "?";
  ::inet_ntop(family, bytes, text, sizeof(text));
  std::string out = text;
  if (is_v6() && scope != 0) {
    char name[IF_NAMESIZE] = {};
    out += "%";
    out += ::if_indextoname(scope, name) != nullptr ? name : std::to_string(scope);
  }
  return out;
}

sockaddr_storage ip_address::with_port(uint16_t port, socklen_t* length) const {
  sockaddr_storage storage{};
  if (is_v4()) {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    std::memcpy(&in->sin_addr, bytes, 4);
    *length = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    std::memcpy(&in6->sin6_addr, bytes, 16);
    in6->sin6_scope_id = scope;
    *length = sizeof(sockaddr_in6);
  }
  return storage;
}

bool ip_address::operator==(const ip_address& other) const {
  return family == other.family && scope == other.scope &&
         std::memcmp(bytes, other.bytes, sizeof(bytes)) == 0;
}

// -- text -----------------------------------------------------------------------------------------

std::string address_text(const ip_address& address, uint16_t port) {
  const std::string host = address.text();
  return (address.is_v6() ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

uint16_t port_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
  return 0;
}

std::string address_text(const sockaddr_storage& address) {
  const ip_address ip = ip_address::of(address);
  if (ip.family == AF_UNSPEC) return "?";
  return address_text(ip, port_of(address));
}

namespace {

/// Reads a port: digits only, at most 65535.
bool parse_port(const std::string& digits, uint16_t* port) {
  if (digits.empty() || digits.size() > 5 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const unsigned long number = std::stoul(digits);
  if (number > 65535) return false;
  *port = static_cast<uint16_t>(number);
  return true;
}

}  // namespace

bool split_host_port(const std::string& text, std::string* host, uint16_t* port) {
  *port = 0;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close == 1) return false;
    *host = text.substr(1, close - 1);
    const std::string rest = text.substr(close + 1);
    if (rest.empty()) return true;
    return rest.front() == ':' && parse_port(rest.substr(1), port);
  }
  if (text.find(']') != std::string::npos) return false;
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos && text.find(':') != colon) {
    *host = text;  // an IPv6 literal without brackets: no port
    return true;
  }
  *host = colon == std::string::npos ? text : text.substr(0, colon);
  if (host->empty() || *host == "*") *host = "0.0.0.0";
  return colon == std::string::npos || parse_port(text.substr(colon + 1), port);
}

bool parse_numeric_host(const std::string& host, ip_address* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  *out = ip_address::of(found->ai_addr);
  ::freeaddrinfo(found);
  return out->family != AF_UNSPEC;
}

std::vector<ip_address> resolve_host(const std::string& host) {
  std::vector<ip_address> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return out;
  for (const addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) {
    const ip_address address = ip_address::of(entry->ai_addr);
    if (address.family == AF_UNSPEC) continue;
    if (std::find(out.begin(), out.end(), address) == out.end()) out.push_back(address);
  }
  ::freeaddrinfo(found);
  return out;
}

// -- interfaces and routes ------------------------------------------------------------------------

std::string interface_of(const ip_address& address) {
  ifaddrs* list = nullptr;
  if (address.family == AF_UNSPEC || ::getifaddrs(&list) != 0) return {};
  std::string exact, subnet;
  const size_t length = address_length(address.family);
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    const ip_address own = ip_address::of(entry->ifa_addr);
    if (own.family != address.family) continue;
    if (address.link_local() && address.scope != 0 &&
        ::if_nametoindex(entry->ifa_name) != address.scope) {
      continue;
    }
    if (std::memcmp(own.bytes, address.bytes, length) == 0) {
      exact = entry->ifa_name;
      break;
    }
    const ip_address mask = ip_address::of(entry->ifa_netmask);
    if (subnet.empty() && mask.family == own.family &&
        same_prefix(own.bytes, address.bytes, length, prefix_length(mask.bytes, length))) {
      subnet = entry->ifa_name;
    }
  }
  ::freeifaddrs(list);
  return exact.empty() ? subnet : exact;
}

bool route_source(const ip_address& target, ip_address* source, int* error) {
  const int fd = ::socket(target.family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = errno;
    return false;
  }
  socklen_t length = 0;
  const sockaddr_storage where = target.with_port(9, &length);  // any port: nothing is sent
  sockaddr_storage local{};
  socklen_t local_length = sizeof(local);
  const bool routed =
      ::connect(fd, reinterpret_cast<const sockaddr*>(&where), length) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) == 0;
  *error = routed ? 0 : errno;
  ::close(fd);
  if (routed) *source = ip_address::of(local);
  return routed;
}

}  // namespace comm::tl::tcp
