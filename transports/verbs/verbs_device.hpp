// Device and port discovery of the verbs transport: which ports of which devices can carry RC
// traffic (active, InfiniBand or Ethernet/RoCE), the GID a port's connections use, and the IP
// address rdmacm reaches the port by. Everything goes through the verbs table (verbs_api.hpp).
#pragma once

#include "verbs/verbs_api.hpp"

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <vector>

namespace comm::verbs {

/// One usable port: "<device>:<port>" is its name in component::devices().
struct port_info {
  std::string device;          ///< ibv_get_device_name
  uint8_t port_num = 1;        ///< 1-based port number
  uint8_t link_layer = 0;      ///< IBV_LINK_LAYER_INFINIBAND or IBV_LINK_LAYER_ETHERNET
  /// "<device>:<port>".
  std::string name() const { return device + ":" + std::to_string(port_num); }
};

/// The GID a port's connections use: InfiniBand uses GID 0 and the LID; RoCE prefers RoCE v2 with
/// an IPv4-mapped address, then RoCE v2, then RoCE v1.
struct gid_choice {
  int index = -1;     ///< GID table index, -1 when the port has no usable GID
  ibv_gid gid{};      ///< the GID itself
  uint8_t type = 0;   ///< IBV_GID_TYPE_IB, _ROCE_V1 or _ROCE_V2
};

/// Lists the usable ports of `table`'s devices, or sets `*why` ("no RDMA device: ...") when there
/// is none.
std::vector<port_info> usable_ports(const api& table, std::string* why = nullptr);

/// Opens the device called `name`; null (errno set) when it is not listed or cannot be opened.
ibv_context* open_device_named(const api& table, const std::string& name);

/// Chooses the GID of `port_num` on `ctx`.
gid_choice choose_gid(const api& table, ibv_context* ctx, uint8_t port_num,
                      const ibv_port_attr& port);

/// The IP address rdmacm reaches `port` by: on RoCE, the address in the chosen GID; otherwise the
/// first of the host's addresses that rdmacm binds to this device and port. False when none.
bool port_ip_address(const api& table, const port_info& port, const gid_choice& gid,
                     sockaddr_storage* out);

/// "ip:port" of a socket address.
std::string to_string(const sockaddr_storage& address);

/// Parses "host:port" or "[v6]:port" into `*out`; false when it is not a numeric address.
bool parse_address(const std::string& text, sockaddr_storage* out);

}  // namespace comm::verbs
