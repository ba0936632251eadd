#include "tcp/tcp_socket.hpp"

#include <comm/log.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/tcp.h>  // the kernel's tcp_info (glibc's lacks tcpi_notsent_bytes)
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace comm::tl::tcp {
namespace {

constexpr const char* log_name = "tcp";
constexpr int listen_backlog = 256;
#ifndef TCP_RTO_MAX_MS
constexpr int TCP_RTO_MAX_MS = 44;  // Linux 6.15 (Debian 12's headers predate it)
#endif

/// An address an interface has, with its name and index.
struct interface_address {
  std::string name;
  unsigned index = 0;
  ip_address address;
};

/// Every address of an interface that is up, in getifaddrs order.
std::vector<interface_address> addresses_up() {
  std::vector<interface_address> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if ((entry->ifa_flags & IFF_UP) == 0) continue;
    ip_address address = ip_address::of(entry->ifa_addr);
    if (address.family == AF_UNSPEC || address.unspecified()) continue;
    const unsigned index = ::if_nametoindex(entry->ifa_name);
    if (address.link_local()) address.scope = index;
    out.push_back({entry->ifa_name, index, address});
  }
  ::freeifaddrs(list);
  return out;
}

/// How well `address` suits a device for `family`: 0 not at all, then higher is better (an IPv6
/// global address before a link-local one).
int suitability(const ip_address& address, int family) {
  if (address.family != family) return 0;
  return address.link_local() ? 1 : 2;
}

/// Every interface that is up with an address of one of `families`, each with its best address
/// of the first of them it has, in getifaddrs order.
std::vector<net_device> interfaces_up(const std::vector<int>& families) {
  const std::vector<interface_address> all = addresses_up();
  std::vector<net_device> out;
  for (const interface_address& a : all) {
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const net_device& d) { return d.name == a.name; });
    if (seen) continue;
    for (int family : families) {
      const interface_address* best = nullptr;
      for (const interface_address& b : all) {
        if (b.name != a.name || suitability(b.address, family) == 0) continue;
        if (best == nullptr ||
            suitability(b.address, family) > suitability(best->address, family)) {
          best = &b;
        }
      }
      if (best != nullptr) {
        out.push_back({best->name, best->address, best->index});
        break;
      }
    }
  }
  return out;
}

bool is_loopback(const net_device& d) { return d.address.loopback() || d.name == "lo"; }

}  // namespace

std::vector<net_device> usable_devices(const std::vector<std::string>& wanted,
                                       const std::vector<int>& families, std::string* why) {
  const std::vector<net_device> all = interfaces_up(families);
  std::vector<net_device> out;
  if (!wanted.empty()) {
    for (const std::string& name : wanted) {
      for (const net_device& d : all) {
        if (d.name == name) out.push_back(d);
      }
    }
    if (out.empty() && why != nullptr) {
      *why = "no interface that is up with an address of COMM_TCP_AF_PRIO's families matches "
             "COMM_TCP_DEVICE";
    }
    return out;
  }
  for (int family : families) {
    for (const bool loopback : {false, true}) {
      for (const net_device& d : all) {
        if (d.address.family == family && is_loopback(d) == loopback) out.push_back(d);
      }
    }
  }
  if (out.empty() && why != nullptr) {
    *why = "no interface is up with an address of COMM_TCP_AF_PRIO's families";
  }
  return out;
}

int open_listener(const ip_address& ip, uint16_t* port) {
  const int fd = ::socket(ip.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    COMM_LOG(error, log_name, "socket: %s", std::strerror(errno));
    return -1;
  }
  if (ip.is_v6()) {
    const int one = 1;  // an IPv6 interface takes IPv6 connections only
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  }
  socklen_t length = 0;
  sockaddr_storage address = ip.with_port(0, &length);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      ::listen(fd, listen_backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    COMM_LOG(error, log_name, "listen on %s: %s", ip.text().c_str(), std::strerror(errno));
    ::close(fd);
    return -1;
  }
  *port = port_of(address);
  return fd;
}

connect_result start_connect(const ip_address& ip, uint16_t port, const tcp_config& config) {
  connect_result out;
  const int fd = ::socket(ip.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    COMM_LOG(error, log_name, "socket: %s", std::strerror(errno));
    out.st = status::io_error;
    return out;
  }
  set_nodelay(fd);
  out.probes_capped = set_liveness(fd, config);
  socklen_t length = 0;
  const sockaddr_storage address = ip.with_port(port, &length);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
    out.connected = true;
  } else if (errno != EINPROGRESS) {
    COMM_LOG(info, log_name, "connect to %s: %s", address_text(ip, port).c_str(),
             std::strerror(errno));
    out.st = status_of_errno(errno, true);
    ::close(fd);
    return out;
  }
  out.fd = fd;
  return out;
}

int socket_error(int fd) {
  int error = 0;
  socklen_t length = sizeof(error);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) return errno;
  return error;
}

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool set_liveness(int fd, const tcp_config& config) {
  const int one = 1;
  const int idle = config.keepalive_idle_s();
  const int interval = config.keepalive_interval_s();
  const int probes = tcp_config::keepalive_probes();
  const int probe_interval_ms = static_cast<int>(config.probe_interval_max_ms());
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  return ::setsockopt(fd, IPPROTO_TCP, TCP_RTO_MAX_MS, &probe_interval_ms,
                      sizeof(probe_interval_ms)) == 0;
}

bool read_peer_answers(int fd, peer_answers* out) {
  tcp_info info{};
  socklen_t length = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return false;
  out->waiting = info.tcpi_unacked != 0 || info.tcpi_notsent_bytes != 0;
  out->asking = info.tcpi_probes != 0 || info.tcpi_retransmits != 0;
  out->silent_ms = info.tcpi_last_ack_recv;
  return true;
}

status status_of_errno(int error, bool connecting) {
  if (error == ENOMEM || error == ENOBUFS) return status::no_memory;
  if (!connecting) {
    const bool silent = error == ETIMEDOUT || error == EHOSTUNREACH || error == ENETUNREACH;
    return silent ? status::endpoint_timeout : status::connection_reset;
  }
  switch (error) {
    case ECONNREFUSED:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ETIMEDOUT:
    case EADDRNOTAVAIL:
      return status::unreachable;
    default:
      return status::io_error;
  }
}

}  // namespace comm::tl::tcp
