// What the verbs transport puts on the wire: the 8-byte header in front of every SEND, the
// connection handshake carried in rdmacm private data, and the interface address. Host byte
// order (peers of one job share an architecture); every field a peer sent is validated before use.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace comm::verbs {

/// What a SEND carries.
enum class message_kind : uint8_t {
  am = 1,     ///< an active message: header, then the payload
  grant = 2,  ///< credits only (sent when the receiver has nothing to piggy-back them on)
  release = 3,  ///< credits, and: the sender has no endpoint on this connection any more
};

/// Header of every SEND; the AM payload follows at offset 8 (so it stays 8-byte aligned).
struct message_header {
  uint8_t am_id = 0;        ///< active-message id (kind am)
  uint8_t kind = 0;         ///< message_kind
  uint16_t credits = 0;     ///< receive buffers the sender reposted for the receiver since last
  uint32_t reserved = 0;    ///< zero
};
static_assert(sizeof(message_header) == 8);

/// One side's half of a connection handshake (client: in CONNECT; server: in ACCEPT). rdmacm
/// zero-pads private data to the field size, so the record carries its own length.
struct [[gnu::packed]] handshake {
  uint16_t magic = 0;       ///< handshake_magic
  uint8_t version = 0;      ///< handshake_version
  uint8_t length = 0;       ///< sizeof(handshake)
  uint32_t qp_num = 0;      ///< the sender's QP
  uint32_t psn = 0;         ///< the sender's starting PSN (24 bits)
  uint16_t lid = 0;         ///< the sender's LID (InfiniBand)
  uint8_t rd_atom = 0;      ///< RDMA READs the sender answers at once (its max_dest_rd_atomic)
  uint8_t mtu = 0;          ///< the sender's active MTU (ibv_mtu)
  uint8_t gid[16] = {};     ///< the sender's GID (RoCE)
  uint64_t iface_id = 0;    ///< the sender's interface
  uint16_t credits = 0;     ///< receive buffers the sender grants its peer
  uint8_t link_layer = 0;   ///< IBV_LINK_LAYER_*
  uint8_t reserved = 0;     ///< zero
};
static_assert(sizeof(handshake) <= 56, "a handshake fits in a CONNECT's private data");

/// "vh"
inline constexpr uint16_t handshake_magic = 0x6876;
/// Layout version of handshake.
inline constexpr uint8_t handshake_version = 1;

/// Validates `length` bytes of private data as a handshake; false when they are not one.
inline bool parse_handshake(const void* data, size_t length, handshake* out) {
  if (data == nullptr || length < sizeof(handshake)) return false;
  std::memcpy(out, data, sizeof(handshake));
  return out->magic == handshake_magic && out->version == handshake_version &&
         out->length == sizeof(handshake) && out->reserved == 0 && out->qp_num != 0 &&
         out->qp_num <= 0xffffff && out->psn <= 0xffffff && out->iface_id != 0 &&
         out->credits != 0 && out->mtu >= IBV_MTU_256 && out->mtu <= IBV_MTU_4096;
}

/// The interface address: where the interface's connection listener is, and who it is.
struct [[gnu::packed]] iface_address_record {
  uint16_t magic = 0;          ///< iface_address_magic
  uint8_t version = 0;         ///< iface_address_version
  uint8_t link_layer = 0;      ///< IBV_LINK_LAYER_*
  uint64_t iface_id = 0;       ///< the interface
  sockaddr_in6 listener{};     ///< its rdmacm listener (sockaddr_in in the first bytes for IPv4)
};

/// "va"
inline constexpr uint16_t iface_address_magic = 0x6176;
/// Layout version of iface_address_record.
inline constexpr uint8_t iface_address_version = 1;

/// Validates an interface address; false when it is not one.
inline bool parse_iface_address(const std::vector<uint8_t>& bytes, iface_address_record* out) {
  if (bytes.size() != sizeof(iface_address_record)) return false;
  std::memcpy(out, bytes.data(), sizeof(*out));
  const int family = out->listener.sin6_family;
  return out->magic == iface_address_magic && out->version == iface_address_version &&
         out->iface_id != 0 && (family == AF_INET || family == AF_INET6) &&
         out->listener.sin6_port != 0;
}

}  // namespace comm::verbs
