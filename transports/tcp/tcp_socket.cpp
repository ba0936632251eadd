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

/// Every interface that is up with an IPv4 address, first address per name, in getifaddrs order.
std::vector<ipv4_device> interfaces_up() {
  std::vector<ipv4_device> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if ((entry->ifa_flags & IFF_UP) == 0) continue;
    const std::string name = entry->ifa_name;
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const ipv4_device& d) { return d.name == name; });
    if (seen) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    out.push_back({name, in->sin_addr.s_addr});
  }
  ::freeifaddrs(list);
  return out;
}

bool is_loopback(const ipv4_device& d) { return (ntohl(d.ipv4) >> 24) == 127 || d.name == "lo"; }

sockaddr_in socket_address(uint32_t ipv4, uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = ipv4;
  address.sin_port = htons(port);
  return address;
}

}  // namespace

std::vector<ipv4_device> usable_devices(const std::vector<std::string>& wanted, std::string* why) {
  const std::vector<ipv4_device> all = interfaces_up();
  std::vector<ipv4_device> out;
  if (!wanted.empty()) {
    for (const std::string& name : wanted) {
      for (const ipv4_device& d : all) {
        if (d.name == name) out.push_back(d);
      }
    }
    if (out.empty() && why != nullptr) {
      *why = "no IPv4 interface that is up matches COMM_TCP_DEVICE";
    }
    return out;
  }
  for (const ipv4_device& d : all) {
    if (!is_loopback(d)) out.push_back(d);
  }
  for (const ipv4_device& d : all) {
    if (is_loopback(d)) out.push_back(d);
  }
  if (out.empty() && why != nullptr) *why = "no IPv4 interface is up";
  return out;
}

std::string ipv4_text(uint32_t ipv4) {
  char text[INET_ADDRSTRLEN] = {};
  in_addr address{ipv4};
  ::inet_ntop(AF_INET, &address, text, sizeof(text));
  return text;
}

int open_listener(uint32_t ipv4, uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    COMM_LOG(error, log_name, "socket: %s", std::strerror(errno));
    return -1;
  }
  sockaddr_in address = socket_address(ipv4, 0);
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(fd, listen_backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    COMM_LOG(error, log_name, "listen on %s: %s", ipv4_text(ipv4).c_str(), std::strerror(errno));
    ::close(fd);
    return -1;
  }
  *port = ntohs(address.sin_port);
  return fd;
}

connect_result start_connect(uint32_t ipv4, uint16_t port, const tcp_config& config) {
  connect_result out;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    COMM_LOG(error, log_name, "socket: %s", std::strerror(errno));
    out.st = status::io_error;
    return out;
  }
  set_nodelay(fd);
  out.probes_capped = set_liveness(fd, config);
  const sockaddr_in address = socket_address(ipv4, port);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0) {
    out.connected = true;
  } else if (errno != EINPROGRESS) {
    COMM_LOG(info, log_name, "connect to %s:%u: %s", ipv4_text(ipv4).c_str(), unsigned{port},
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
