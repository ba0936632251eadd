#include "verbs/verbs_device.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace comm::verbs {
namespace {

bool ipv4_mapped(const ibv_gid& gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, prefix, sizeof(prefix)) == 0;
}

bool link_local(const ibv_gid& gid) { return gid.raw[0] == 0xfe && (gid.raw[1] & 0xc0) == 0x80; }

/// Higher is better: RoCE v2 IPv4-mapped, RoCE v2, RoCE v1; -1 unusable.
int gid_rank(const ibv_gid_entry& e) {
  if (e.gid_type == IBV_GID_TYPE_ROCE_V2) return ipv4_mapped(e.gid) ? 3 : 2;
  if (e.gid_type == IBV_GID_TYPE_ROCE_V1) return 1;
  return -1;
}

void add_ports(const api& t, ibv_device* device, std::vector<port_info>& out) {
  ibv_context* ctx = t.open_device(device);
  if (ctx == nullptr) return;
  ibv_device_attr attr{};
  if (t.query_device(ctx, &attr) == 0) {
    for (uint8_t p = 1; p <= attr.phys_port_cnt; ++p) {
      ibv_port_attr port{};
      if (t.query_port(ctx, p, &port) != 0 || port.state != IBV_PORT_ACTIVE) continue;
      if (port.link_layer != IBV_LINK_LAYER_INFINIBAND &&
          port.link_layer != IBV_LINK_LAYER_ETHERNET) {
        continue;
      }
      out.push_back({t.get_device_name(device), p, port.link_layer});
    }
  }
  t.close_device(ctx);
}

/// True when rdmacm binds `address` to `port` (its device and port number).
bool binds_to(const api& t, const port_info& port, const sockaddr* address) {
  rdma_event_channel* channel = t.create_event_channel();
  if (channel == nullptr) return false;
  rdma_cm_id* id = nullptr;
  bool match = false;
  if (t.create_id(channel, &id, nullptr, RDMA_PS_TCP) == 0) {
    if (t.bind_addr(id, const_cast<sockaddr*>(address)) == 0 && id->verbs != nullptr) {
      match = port.device == t.get_device_name(id->verbs->device) && id->port_num == port.port_num;
    }
    t.destroy_id(id);
  }
  t.destroy_event_channel(channel);
  return match;
}

bool address_from_gid(const gid_choice& gid, sockaddr_storage* out) {
  if (gid.type == IBV_GID_TYPE_IB || gid.index < 0 || link_local(gid.gid)) return false;
  *out = {};
  if (ipv4_mapped(gid.gid)) {
    auto* in = reinterpret_cast<sockaddr_in*>(out);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, gid.gid.raw + 12, 4);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(out);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, gid.gid.raw, 16);
  }
  return true;
}

bool address_from_host(const api& t, const port_info& port, sockaddr_storage* out) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> guard(list, ::freeifaddrs);
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (!binds_to(t, port, a->ifa_addr)) continue;
    *out = {};
    std::memcpy(out, a->ifa_addr, family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    return true;
  }
  return false;
}

}  // namespace

std::vector<port_info> usable_ports(const api& t, std::string* why) {
  std::vector<port_info> ports;
  int count = 0;
  errno = 0;
  ibv_device** list = t.get_device_list(&count);
  if (list == nullptr) {
    if (why != nullptr) *why = probe_devices(t).reason;
    return ports;
  }
  for (int i = 0; i < count && list[i] != nullptr; ++i) add_ports(t, list[i], ports);
  t.free_device_list(list);
  if (ports.empty() && why != nullptr) {
    *why = count == 0 ? "no RDMA device: ibv_get_device_list found none"
                      : "no RDMA device: no active InfiniBand or RoCE port";
  }
  return ports;
}

ibv_context* open_device_named(const api& t, const std::string& name) {
  int count = 0;
  ibv_device** list = t.get_device_list(&count);
  if (list == nullptr) return nullptr;
  ibv_context* ctx = nullptr;
  errno = ENODEV;
  for (int i = 0; i < count && list[i] != nullptr && ctx == nullptr; ++i) {
    if (name == t.get_device_name(list[i])) ctx = t.open_device(list[i]);
  }
  t.free_device_list(list);
  return ctx;
}

gid_choice choose_gid(const api& t, ibv_context* ctx, uint8_t port_num, const ibv_port_attr& port) {
  gid_choice best;
  if (port.link_layer == IBV_LINK_LAYER_INFINIBAND) {
    if (t.query_gid(ctx, port_num, 0, &best.gid) == 0) best.index = 0;
    best.type = IBV_GID_TYPE_IB;
    return best;
  }
  int best_rank = -1;
  for (int i = 0; i < port.gid_tbl_len; ++i) {
    ibv_gid_entry e{};
    if (t.query_gid_ex(ctx, port_num, static_cast<uint32_t>(i), &e, 0) != 0) continue;
    const int rank = gid_rank(e);
    if (rank > best_rank) {
      best_rank = rank;
      best.index = i;
      best.gid = e.gid;
      best.type = static_cast<uint8_t>(e.gid_type);
    }
  }
  return best;
}

bool port_ip_address(const api& t, const port_info& port, const gid_choice& gid,
                     sockaddr_storage* out) {
  return address_from_gid(gid, out) || address_from_host(t, port, out);
}

std::string to_string(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    ::inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
    return std::string(text) + ":" + std::to_string(ntohs(in.sin_port));
  }
  const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
  ::inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
  return "[" + std::string(text) + "]:" + std::to_string(ntohs(in6.sin6_port));
}

bool parse_address(const std::string& text, sockaddr_storage* out) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 >= text.size()) return false;
  std::string host = text.substr(0, colon);
  const std::string port_text = text.substr(colon + 1);
  char* end = nullptr;
  const unsigned long port = std::strtoul(port_text.c_str(), &end, 10);
  if (*end != '\0' || port > 65535) return false;
  *out = {};
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    auto* in6 = reinterpret_cast<sockaddr_in6*>(out);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    return ::inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr) == 1;
  }
  auto* in = reinterpret_cast<sockaddr_in*>(out);
  in->sin_family = AF_INET;
  in->sin_port = htons(static_cast<uint16_t>(port));
  return ::inet_pton(AF_INET, host.c_str(), &in->sin_addr) == 1;
}

}  // namespace comm::verbs
