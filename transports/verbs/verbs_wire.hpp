// What the verbs transport puts on the wire, as described by its schema (verbs.capnp): the
// VerbsMessageHeader in front of every SEND, the VerbsHandshake carried in rdmacm private data, and
// the VerbsIfaceAddress. All three are data-only Cap'n Proto structs: a sender encodes them with a
// long-lived wire::header_writer, a receiver reads them in place with wire::read_header (root
// pointer word and data length checked) and then validates every field before use.
#pragma once

#include <comm/wire/codec.hpp>
#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "verbs/verbs.capnp.h"

namespace comm::verbs {

/// What a SEND carries (VerbsMessageHeader.kind).
enum class message_kind : uint8_t {
  am = 1,     ///< an active message: header, then the payload
  grant = 2,  ///< credits only (sent when the receiver has nothing to piggy-back them on)
  release = 3,  ///< credits, and: the sender has no endpoint on this connection any more
};

/// Bytes of the encoded VerbsMessageHeader in front of every SEND; the AM payload follows at this
/// offset (a multiple of 8, so it stays 8-byte aligned in a receive buffer).
inline constexpr size_t message_header_size =
    wire::header_size<wire::schema::VerbsMessageHeader>();
static_assert(message_header_size % 8 == 0);

/// A SEND header as read from the wire, after validation.
struct message_header {
  uint8_t am_id = 0;     ///< active-message id (kind am)
  message_kind kind = message_kind::am;  ///< what the SEND carries
  uint16_t credits = 0;  ///< receive buffers the sender reposted for the receiver since last
};

/// Encodes SEND headers with one long-lived builder (one per interface; not thread-safe).
class message_header_writer {
public:
  /// Writes the header of a SEND to `dst` (message_header_size bytes) and returns that size.
  size_t write(void* dst, message_kind kind, uint8_t am_id, uint16_t credits) {
    auto& f = writer_.fields();
    f.setAmId(am_id);
    f.setKind(static_cast<uint8_t>(kind));
    f.setCredits(credits);
    return writer_.copy_to(dst);
  }

private:
  wire::header_writer<wire::schema::VerbsMessageHeader> writer_;
};

/// Validates the first `length` bytes of a received SEND (8-byte aligned) as a header: a
/// well-formed root pointer with exactly our data section (the payload's offset is fixed), a known
/// kind, and an am id below `am_id_count` for an active message. Nothing when they are not one.
inline std::optional<message_header> parse_message_header(const void* data, size_t length,
                                                          unsigned am_id_count) {
  size_t consumed = 0;
  const auto reader = wire::read_header<wire::schema::VerbsMessageHeader>(data, length, &consumed);
  if (!reader || consumed != message_header_size) return std::nullopt;
  message_header h;
  h.am_id = reader->getAmId();
  h.credits = reader->getCredits();
  const uint8_t kind = reader->getKind();
  if (kind == static_cast<uint8_t>(message_kind::am)) {
    if (h.am_id >= am_id_count) return std::nullopt;
  } else if (kind != static_cast<uint8_t>(message_kind::grant) &&
             kind != static_cast<uint8_t>(message_kind::release)) {
    return std::nullopt;
  }
  h.kind = static_cast<message_kind>(kind);
  return h;
}

/// One side's half of a connection handshake (client: in CONNECT; server: in ACCEPT), decoded.
struct handshake {
  uint32_t qp_num = 0;      ///< the sender's QP
  uint32_t psn = 0;         ///< the sender's starting PSN (24 bits)
  uint16_t lid = 0;         ///< the sender's LID (InfiniBand)
  uint8_t rd_atom = 0;      ///< RDMA READs the sender answers at once (its max_dest_rd_atomic)
  uint8_t mtu = 0;          ///< the sender's active MTU (ibv_mtu)
  uint8_t gid[16] = {};     ///< the sender's GID (RoCE)
  uint64_t iface_id = 0;    ///< the sender's interface
  uint16_t credits = 0;     ///< receive buffers the sender grants its peer
  uint8_t link_layer = 0;   ///< IBV_LINK_LAYER_*
};

/// Bytes of private data an rdmacm CONNECT carries (the smallest of connect, accept and reject).
inline constexpr size_t max_handshake_size = 56;
/// Bytes of an encoded handshake (root pointer and data section).
inline constexpr size_t handshake_size = wire::header_size<wire::schema::VerbsHandshake>();
static_assert(handshake_size <= max_handshake_size, "a handshake fits in a CONNECT's private data");

/// An encoded handshake, ready for rdma_conn_param::private_data.
struct encoded_handshake {
  alignas(8) uint8_t bytes[handshake_size] = {};  ///< the encoding
};

/// Encodes `h` (a builder per call: twice per connection, off the hot path).
inline encoded_handshake encode_handshake(const handshake& h) {
  wire::header_writer<wire::schema::VerbsHandshake> writer;
  auto& f = writer.fields();
  f.setQpNum(h.qp_num);
  f.setPsn(h.psn);
  f.setLid(h.lid);
  f.setRdAtom(h.rd_atom);
  f.setMtu(h.mtu);
  uint64_t gid[2];
  std::memcpy(gid, h.gid, sizeof(gid));
  f.setGid0(gid[0]);
  f.setGid1(gid[1]);
  f.setIfaceId(h.iface_id);
  f.setCredits(h.credits);
  f.setLinkLayer(h.link_layer);
  encoded_handshake out;
  writer.copy_to(out.bytes);
  return out;
}

/// Validates `length` bytes of private data (rdmacm zero-pads them to the field's size) as a
/// handshake; false when they are not one (bad root pointer, data short of the struct, or a field
/// out of range).
inline bool parse_handshake(const void* data, size_t length, handshake* out) {
  if (data == nullptr) return false;
  alignas(8) uint8_t copy[max_handshake_size * 4];  // private data carries no alignment promise
  length = std::min(length, sizeof(copy));          // the rest is the field's zero padding
  std::memcpy(copy, data, length);
  const auto r = wire::read_header<wire::schema::VerbsHandshake>(copy, length);
  if (!r) return false;
  out->qp_num = r->getQpNum();
  out->psn = r->getPsn();
  out->lid = r->getLid();
  out->rd_atom = r->getRdAtom();
  out->mtu = r->getMtu();
  const uint64_t gid[2] = {r->getGid0(), r->getGid1()};
  std::memcpy(out->gid, gid, sizeof(gid));
  out->iface_id = r->getIfaceId();
  out->credits = r->getCredits();
  out->link_layer = r->getLinkLayer();
  return out->qp_num != 0 && out->qp_num <= 0xffffff && out->psn <= 0xffffff &&
         out->iface_id != 0 && out->credits != 0 && out->mtu >= IBV_MTU_256 &&
         out->mtu <= IBV_MTU_4096;
}

/// The interface address, decoded: where the interface's connection listener is, and who it is.
struct iface_address_record {
  uint8_t link_layer = 0;      ///< IBV_LINK_LAYER_*
  uint64_t iface_id = 0;       ///< the interface
  sockaddr_in6 listener{};     ///< its rdmacm listener (a sockaddr_in in the first bytes for IPv4)
};

/// Encodes an interface address.
inline std::vector<uint8_t> encode_iface_address(const iface_address_record& rec) {
  wire::header_writer<wire::schema::VerbsIfaceAddress> writer;
  auto& f = writer.fields();
  f.setIfaceId(rec.iface_id);
  f.setLinkLayer(rec.link_layer);
  const bool ipv6 = rec.listener.sin6_family == AF_INET6;
  f.setIpv6(ipv6);
  f.setPort(rec.listener.sin6_port);
  uint64_t address6[2] = {0, 0};
  if (ipv6) {
    std::memcpy(address6, &rec.listener.sin6_addr, sizeof(address6));
    f.setScopeId(rec.listener.sin6_scope_id);
    f.setAddress4(0);
  } else {
    sockaddr_in v4;
    std::memcpy(&v4, &rec.listener, sizeof(v4));
    f.setAddress4(v4.sin_addr.s_addr);
    f.setScopeId(0);
  }
  f.setAddress6a(address6[0]);
  f.setAddress6b(address6[1]);
  std::vector<uint8_t> out(writer.size());
  writer.copy_to(out.data());
  return out;
}

/// Validates an interface address (exactly one encoded VerbsIfaceAddress, an interface id and a
/// listener port); false when it is not one.
inline bool parse_iface_address(const std::vector<uint8_t>& bytes, iface_address_record* out) {
  constexpr size_t size = wire::header_size<wire::schema::VerbsIfaceAddress>();
  if (bytes.size() != size) return false;
  alignas(8) uint8_t copy[size];
  std::memcpy(copy, bytes.data(), size);
  const auto r = wire::read_header<wire::schema::VerbsIfaceAddress>(copy, size);
  if (!r) return false;
  *out = iface_address_record{};
  out->iface_id = r->getIfaceId();
  out->link_layer = r->getLinkLayer();
  if (r->getIpv6()) {
    out->listener.sin6_family = AF_INET6;
    out->listener.sin6_port = r->getPort();
    out->listener.sin6_scope_id = r->getScopeId();
    const uint64_t address6[2] = {r->getAddress6a(), r->getAddress6b()};
    std::memcpy(&out->listener.sin6_addr, address6, sizeof(address6));
  } else {
    sockaddr_in v4{};
    v4.sin_family = AF_INET;
    v4.sin_port = r->getPort();
    v4.sin_addr.s_addr = r->getAddress4();
    std::memcpy(&out->listener, &v4, sizeof(v4));
  }
  return out->iface_id != 0 && r->getPort() != 0;
}

}  // namespace comm::verbs
